"""Training an agent: actors step gymnasium vector environments with the core's memory (no gradient), the learner
recomputes each unroll and takes an IMPALA step (V-trace targets). A transformer core's learner processes the unroll
as one batch from the memories the actors read (memory is detached between steps, so nothing is lost); the LSTM's
unrolls step by step from the state the actors started with (back-propagation through the unroll).

Two places to act, one learner:

- ``train.actors = 0`` (the default): the actors share the learner's process and weights, so the behaviour policy
  is the learner's (V-trace's importance weights are 1; V-trace reduces to n-step returns). A checkpoint holds
  weights, optimizer, the actors' memory, the environments and every random generator, so a resumed run continues
  bit for bit.
- ``train.actors = N``: N actor processes (:mod:`compressive_transformer.agents.actors`) step ``n_envs / N``
  environments each with weights that may lag the learner's by an update or two, while the learner learns; V-trace
  corrects the lag, the metrics report it (``policy_lag``). A checkpoint holds the learner (weights, optimizer,
  update count, episode statistics); a resumed run restarts the actors on fresh environments with the restored
  weights, so it continues the learner exactly but not the actors' episodes: when an actor loads new weights depends
  on how the processes are scheduled, so asynchronous acting cannot be replayed.
"""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from compressive_transformer.agents.acting import (
    Episodes,
    Unroll,
    actor_data,
    collect,
    restore_actors,
    start_actors,
)
from compressive_transformer.agents.actor_critic import ActorCritic, Losses, Rollout, vtrace_losses
from compressive_transformer.agents.actors import ActorPool
from compressive_transformer.agents.config import RLConfig, RLTrainConfig, load_rl_config
from compressive_transformer.agents.core import CoreState, detach_state
from compressive_transformer.core.config import ConfigError, to_dict
from compressive_transformer.core.fileio import write_text_atomic
from compressive_transformer.runs.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from compressive_transformer.runs.metrics import MetricsLogger
from compressive_transformer.runs.toml_writer import dumps

CONFIG_FILE = "config.toml"


@dataclass
class AgentSummary:
    updates: int
    env_steps: int
    episodes: int
    success_rate: float  # over the last ``train.window`` episodes
    mean_return: float
    checkpoint: Path
    seconds: float


def config_text(cfg: RLConfig) -> str:
    return "# resolved config of this agent run (written by compressive-transformer rl train)\n" + dumps(to_dict(cfg))


def _run_config(cfg: RLConfig | None, run_dir: Path, resume: bool) -> tuple[RLConfig, Path | None]:
    """The config a run trains with and its newest checkpoint: a new run refuses a directory that holds one; a
    resumed run keeps its saved config, but for ``train.env_steps`` (which is then written to the run's config)."""
    ckpt_path = latest_checkpoint(run_dir)
    if resume:
        if ckpt_path is None:
            raise ConfigError(f"--resume: {run_dir} holds no checkpoint; start the run without --resume")
        saved = load_rl_config(run_dir / CONFIG_FILE)
        if cfg is not None and replace(cfg, train=replace(cfg.train, env_steps=saved.train.env_steps)) != saved:
            raise ConfigError(
                f"--resume: the config differs from {run_dir / CONFIG_FILE} in more than train.env_steps; "
                "resume with the run's own config (a longer run: --set train.env_steps=N)"
            )
        if cfg is not None and cfg != saved:  # a longer (or shorter) run: the config on disk says so from now on
            write_text_atomic(run_dir / CONFIG_FILE, config_text(cfg))
        cfg = cfg or saved
    elif ckpt_path is not None:  # a run stopped before its first checkpoint holds nothing to continue: start again
        raise ConfigError(f"{run_dir} already holds a run; continue it with --resume or choose another --run-dir")
    assert cfg is not None
    return cfg, ckpt_path


def _record(
    update: int,
    env_steps: int,
    episodes: Episodes,
    finished: list[float],
    losses: Losses,
    grad_norm: torch.Tensor,
    lags: list[int] | None,
) -> dict[str, Any]:
    """One metrics line: progress, the episodes finished since the last line and the recent window, the losses; with
    actor processes, the mean policy lag (updates between the weights each unroll was acted with and the learner's)."""
    record = {
        "step": update,
        "env_steps": env_steps,
        "episodes": episodes.count,
        "new_episodes": len(finished),
        "new_successes": sum(r > 0 for r in finished),
        "success_rate": episodes.success_rate,
        "mean_return": episodes.mean_return,
        "loss": float(losses.total.detach()),
        "policy_loss": float(losses.policy),
        "value_loss": float(losses.value),
        "entropy": float(losses.entropy),
        "aux_loss": float(losses.aux),
        "grad_norm": float(grad_norm),
    }
    if lags is not None:
        record["policy_lag"] = float(np.mean(lags)) if lags else math.nan
    return record


class LocalActors:
    """The actors of ``train.actors = 0``: every environment stepped in the learner's process with its own weights,
    checkpointed with the run (environments, memory, running returns) so that a resumed run continues bit for bit.
    The interface of :class:`~compressive_transformer.agents.actors.ActorPool`."""

    def __init__(self, cfg: RLConfig) -> None:
        self.envs, self.agent, self.actors = start_actors(cfg, cfg.train.n_envs, cfg.train.seed)
        self.unroll = cfg.train.unroll

    def next(self) -> Unroll:
        return Unroll(*collect(self.agent, self.envs, self.actors, self.unroll))

    def publish(self, agent: ActorCritic, version: int) -> None:
        self.actors.memory = detach_state(self.actors.memory)  # the learner's weights are the actors' already

    def checkpoint(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        return self.agent.core.state_tensors(self.actors.memory), actor_data(self.actors, self.envs)

    def restore(self, ckpt: Any) -> None:
        restore_actors(self.actors, self.envs, ckpt.data_state)
        self.actors.memory = self.agent.core.state_from_tensors(ckpt.memory)

    def close(self) -> None:
        self.envs.close()


def _learn(
    agent: ActorCritic, optimizer: torch.optim.Optimizer, roll: Rollout, start: CoreState, tc: RLTrainConfig
) -> tuple[Losses, torch.Tensor]:
    """One learner update on an unroll: the V-trace losses, clipped gradients, an Adam step."""
    out = agent.replay(roll.obs, roll.reads) if agent.can_replay else agent(roll.obs, roll.first, start)
    losses = vtrace_losses(
        out,
        roll,
        gamma=tc.gamma,
        entropy_cost=tc.entropy_cost,
        value_cost=tc.value_cost,
        rho_clip=tc.rho_clip,
        c_clip=tc.c_clip,
    )
    optimizer.zero_grad(set_to_none=True)
    losses.total.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(agent.parameters(), tc.grad_clip)
    optimizer.step()
    return losses, grad_norm


Actors = LocalActors | ActorPool  # where unrolls come from: next(), publish(), checkpoint(), close()


@dataclass
class Learner:
    """What a checkpoint saves and a resumed run restores: the agent, its optimizer, the update count and the
    episode statistics the metrics report."""

    agent: ActorCritic
    optimizer: torch.optim.Optimizer
    episodes: Episodes
    update: int = 0


def _setup(cfg: RLConfig, run_dir: Path, ckpt_path: Path | None, resume: bool) -> tuple[Learner, Actors]:
    """The learner (restored from ``ckpt_path`` when resuming) and its actors, in the process or as processes (those
    start with the learner's weights, restored ones included)."""
    tc = cfg.train
    local = LocalActors(cfg) if tc.actors == 0 else None
    if local is None:  # the learner's agent: built as an actor's is, with the same seed (its environment unused)
        envs, agent, _ = start_actors(cfg, 1, tc.seed)
        envs.close()
    else:
        agent = local.agent
    learner = Learner(agent, torch.optim.Adam(agent.parameters(), lr=tc.lr), Episodes(deque(maxlen=tc.window)))
    if resume:
        ckpt = load_checkpoint(ckpt_path, model=agent, optimizer=learner.optimizer)
        learner.update = ckpt.step
        learner.episodes.add(ckpt.data_state["returns"])
        learner.episodes.count = ckpt.data_state["episodes"]
        if local is not None:
            local.restore(ckpt)
    else:
        run_dir.mkdir(parents=True, exist_ok=True)
        write_text_atomic(run_dir / CONFIG_FILE, config_text(cfg))
    actors = local or ActorPool(cfg, agent, learner.update, lockstep=tc.actors_lockstep)
    return learner, actors


def _save(run_dir: Path, cfg: RLConfig, learner: Learner, actors: Actors) -> Path:
    memory, data = actors.checkpoint()
    episodes = learner.episodes
    return save_checkpoint(
        run_dir,
        learner.update,
        model=learner.agent,
        optimizer=learner.optimizer,
        memory=memory,
        data_state={**data, "returns": list(episodes.returns), "episodes": episodes.count},
        config_toml=config_text(cfg),
        extra={"env_steps": learner.update * cfg.train.n_envs * cfg.train.unroll},
    )


def _train(cfg: RLConfig, run_dir: Path, learner: Learner, actors: Actors, progress: bool) -> Path | None:
    """The learner's loop: an unroll of every environment, an update, the weights published; metrics and
    checkpoints on schedule. Returns the last checkpoint written (None if none was)."""
    tc = cfg.train
    metrics = MetricsLogger(run_dir)  # TensorBoard too where it is installed
    metrics.truncate_after(learner.update)
    per_update = tc.n_envs * tc.unroll
    total = math.ceil(tc.env_steps / per_update)
    bar = tqdm(total=total * per_update, initial=learner.update * per_update, unit="step", disable=not progress)
    since_log: list[float] = []
    lags: list[int] | None = [] if tc.actors else None
    path = None
    try:
        while learner.update < total:
            unroll = actors.next()
            if lags is not None:
                lags.extend(learner.update - v for v in unroll.versions)
            losses, grad_norm = _learn(learner.agent, learner.optimizer, unroll.roll, unroll.start, tc)
            learner.update += 1
            actors.publish(learner.agent, learner.update)
            learner.episodes.add(unroll.finished)
            since_log.extend(unroll.finished)
            bar.update(per_update)
            if learner.update % tc.log_every == 0 or learner.update == total:
                step = learner.update
                record = _record(step, step * per_update, learner.episodes, since_log, losses, grad_norm, lags)
                metrics.log(record)
                since_log, lags = [], ([] if lags is not None else None)
                bar.set_postfix(ret=f"{record['mean_return']:.2f}", success=f"{record['success_rate']:.2f}")
            if learner.update % tc.checkpoint_every == 0 or learner.update == total:
                path = _save(run_dir, cfg, learner, actors)
    finally:
        bar.close()
        metrics.close()
    return path


def train_agent(
    cfg: RLConfig | None, run_dir: str | Path, *, resume: bool = False, progress: bool = True
) -> AgentSummary:
    """Train (or, with ``resume``, continue from the newest checkpoint) the agent of ``cfg`` in ``run_dir``. A resumed
    run keeps its config (``cfg`` None), but for ``train.env_steps``, which may grow to continue a finished run."""
    run_dir = Path(run_dir)
    cfg, ckpt_path = _run_config(cfg, run_dir, resume)
    tc = cfg.train
    torch.set_num_threads(tc.threads)
    torch.manual_seed(tc.seed)
    np.random.seed(tc.seed)
    start_time = time.perf_counter()
    learner, actors = _setup(cfg, run_dir, ckpt_path, resume)
    try:  # actor processes stop however this is left: finished, failed or interrupted
        path = _train(cfg, run_dir, learner, actors, progress) or ckpt_path or _save(run_dir, cfg, learner, actors)
    finally:
        actors.close()
    episodes = learner.episodes
    return AgentSummary(
        updates=learner.update,
        env_steps=learner.update * tc.n_envs * tc.unroll,
        episodes=episodes.count,
        success_rate=episodes.success_rate,
        mean_return=episodes.mean_return,
        checkpoint=path,
        seconds=time.perf_counter() - start_time,
    )


__all__ = ["AgentSummary", "collect", "train_agent"]
