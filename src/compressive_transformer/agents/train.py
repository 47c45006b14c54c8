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
import sys
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
from compressive_transformer.agents.best import BestPolicy, keep_if_best, read_best_or_warn
from compressive_transformer.agents.config import RLConfig, RLTrainConfig, load_saved_config
from compressive_transformer.agents.core import CoreState, detach_state
from compressive_transformer.agents.health import AgentDiverged, diverged, require_finite, require_finite_weights
from compressive_transformer.agents.optim import build_optimizer, learning_rate, set_learning_rate
from compressive_transformer.core.config import ConfigError, Log, to_dict
from compressive_transformer.core.fileio import write_text_atomic
from compressive_transformer.runs import cputime
from compressive_transformer.runs.budget import TRAINING_BYTES, check_model_size
from compressive_transformer.runs.checkpoint import (
    RESUME_FILES,
    CheckpointError,
    checkpoint_step,
    list_checkpoints,
    load_checkpoint,
    newest_good_checkpoint,
    save_checkpoint,
)
from compressive_transformer.runs.metrics import MetricsLogger
from compressive_transformer.runs.rundir import config_difference
from compressive_transformer.runs.runlock import RunLock
from compressive_transformer.runs.toml_writer import dumps

CONFIG_FILE = "config.toml"
# train keys a resumed run may change: its length, and the remedy for a diverged run (nothing a checkpoint holds)
RESUME_CHANGES = ("env_steps", "lr", "grad_clip")


@dataclass
class AgentSummary:
    updates: int
    env_steps: int
    episodes: int
    success_rate: float  # over the last ``train.window`` episodes
    mean_return: float
    checkpoint: Path
    seconds: float
    best: BestPolicy | None = None  # the best window's weights (``<run>/best``), none before a window is full


def config_text(cfg: RLConfig) -> str:
    return "# resolved config of this agent run (written by compressive-transformer rl train)\n" + dumps(to_dict(cfg))


def _run_config(cfg: RLConfig | None, run_dir: Path, resume: bool, log: Log) -> tuple[RLConfig, Path | None]:
    """The config a run trains with and the checkpoint it continues from: a new run refuses a directory that holds
    one; a resumed run keeps its saved config but for :data:`RESUME_CHANGES` (then written to the run's config)
    and continues from its newest checkpoint that verifies (each newer one that does not is reported)."""
    if not resume:
        if list_checkpoints(run_dir):  # one stopped before its first checkpoint holds nothing to continue: it restarts
            raise ConfigError(f"{run_dir} already holds a run; continue it with --resume or choose another --run-dir")
        assert cfg is not None
        return cfg, None
    ckpt_path = newest_good_checkpoint(run_dir, RESUME_FILES, log)
    if ckpt_path is None:
        raise ConfigError(f"--resume: {run_dir} holds no checkpoint; start the run without --resume")
    saved = _saved_config(run_dir)
    try:
        written = load_saved_config(ckpt_path / CONFIG_FILE)
    except ConfigError as e:
        raise CheckpointError(f"checkpoint {ckpt_path}: {CONFIG_FILE} does not hold an agent config ({e})") from None
    if not _same_run(written, saved):
        raise CheckpointError(f"checkpoint {ckpt_path} was written by another config; it cannot be resumed here")
    if cfg is None:
        return saved, ckpt_path
    free = {key: getattr(saved.train, key) for key in RESUME_CHANGES}
    if not _same_run(cfg, saved):
        diff = config_difference(saved, replace(cfg, train=replace(cfg.train, **free)))
        raise ConfigError(
            f"--resume: the config differs from {run_dir / CONFIG_FILE} ({diff}); only "
            f"{', '.join('train.' + k for k in RESUME_CHANGES)} may change: resume with the run's own config (a "
            "longer run: --set train.env_steps=N)"
        )
    trained = checkpoint_step(ckpt_path) * saved.train.n_envs * saved.train.unroll
    if cfg.train.env_steps != saved.train.env_steps and cfg.train.env_steps < trained:
        raise ConfigError(
            f"--set train.env_steps={cfg.train.env_steps}: this run has already trained {trained} environment steps; "
            f"give more than {trained} to train it further"
        )
    for key in RESUME_CHANGES:
        if key != "env_steps" and getattr(cfg.train, key) != free[key]:
            log(f"resuming with train.{key} = {getattr(cfg.train, key)!r} (was {free[key]!r})")
    if cfg != saved:  # a longer run, or a remedy: the config on disk says so from now on
        write_text_atomic(run_dir / CONFIG_FILE, config_text(cfg))
    return cfg, ckpt_path


def _same_run(a: RLConfig, b: RLConfig) -> bool:
    """Whether two configs describe the same run, but for the keys a resumed run may change."""
    free = {key: getattr(b.train, key) for key in RESUME_CHANGES}
    return replace(a, train=replace(a.train, **free)) == b


def _saved_config(run_dir: Path) -> RLConfig:
    """The config an agent run recorded; another kind of run directory is refused in one line."""
    try:
        return load_saved_config(run_dir / CONFIG_FILE)
    except ConfigError as e:
        raise ConfigError(
            f"--resume: {run_dir} does not hold an agent run ({e}); `rl train --resume` continues runs of `rl train`"
        ) from None


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
        """The actors of checkpoint ``ckpt``; what does not fit this run is a one-line :class:`CheckpointError`."""
        try:
            restore_actors(self.actors, self.envs, ckpt.data_state)
            self.actors.memory = self.agent.core.state_from_tensors(ckpt.memory or {})
        except (ValueError, KeyError, TypeError, RuntimeError) as e:
            raise CheckpointError(
                f"checkpoint {ckpt.path}: {str(e).splitlines()[0] if str(e) else type(e).__name__}; it cannot be "
                "resumed (start the run again in a new --run-dir)"
            ) from None

    def close(self) -> None:
        self.envs.close()


def _learn(
    agent: ActorCritic, optimizer: torch.optim.Optimizer, roll: Rollout, start: CoreState, tc: RLTrainConfig
) -> tuple[Losses, torch.Tensor]:
    """One learner update on an unroll: the V-trace losses, clipped gradients, an optimizer step. A loss or gradient
    norm that is not finite stops training before it changes the weights (:class:`AgentDiverged`)."""
    out = agent.replay(roll.obs, roll.reads) if agent.can_replay else agent(roll.obs, roll.first, start)
    losses = vtrace_losses(
        out,
        roll,
        gamma=tc.gamma,
        entropy_cost=tc.entropy_cost,
        value_cost=tc.value_cost,
        rho_clip=tc.rho_clip,
        c_clip=tc.c_clip,
        reduction=tc.loss_reduction,
    )
    require_finite("the loss", losses.total.detach())
    optimizer.zero_grad(set_to_none=True)
    losses.total.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(agent.parameters(), tc.grad_clip)
    require_finite("the gradient norm", grad_norm)
    optimizer.step()
    require_finite_weights(agent)
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
    learner = Learner(agent, build_optimizer(agent.parameters(), tc), Episodes(deque(maxlen=tc.window)))
    if resume:  # train.lr may change on resume (the remedy for divergence): each update sets its own rate
        assert ckpt_path is not None
        ckpt = load_checkpoint(ckpt_path, model=agent, optimizer=learner.optimizer)
        learner.update = ckpt.step
        _restore_episodes(learner.episodes, ckpt)
        if local is not None:
            local.restore(ckpt)
    else:
        run_dir.mkdir(parents=True, exist_ok=True)
        write_text_atomic(run_dir / CONFIG_FILE, config_text(cfg))
    actors = local or ActorPool(cfg, agent, learner.update, lockstep=tc.actors_lockstep)
    return learner, actors


def _restore_episodes(episodes: Episodes, ckpt: Any) -> None:
    data = ckpt.data_state
    returns = data.get("returns") if isinstance(data, dict) else None
    count = data.get("episodes") if isinstance(data, dict) else None
    if not (isinstance(returns, list) and all(isinstance(r, float) for r in returns) and type(count) is int):
        raise CheckpointError(f"checkpoint {ckpt.path}: state.json holds no episode statistics (returns, episodes)")
    episodes.add(returns)
    episodes.count = count


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


def _train(
    cfg: RLConfig, run_dir: Path, learner: Learner, actors: Actors, progress: bool, last: Path | None
) -> Path | None:
    """The learner's loop: an unroll of every environment, an update, the weights published; metrics, the best
    policy (:mod:`~compressive_transformer.agents.best`, at each metrics line) and checkpoints on schedule. Returns
    the last checkpoint written, else ``last`` (the one the run resumed from). A value that stops being finite ends
    it in one line (:class:`AgentDiverged`)."""
    tc = cfg.train
    best = read_best_or_warn(run_dir, log=lambda line: print(line, file=sys.stderr))
    metrics = MetricsLogger(run_dir)  # TensorBoard too where it is installed
    metrics.truncate_after(learner.update)
    per_update = tc.n_envs * tc.unroll
    total = math.ceil(tc.env_steps / per_update)
    bar = tqdm(total=total * per_update, initial=learner.update * per_update, unit="step", disable=not progress)
    since_log: list[float] = []
    lags: list[int] | None = [] if tc.actors else None
    text = config_text(cfg)
    clock = cputime.Clock(run_dir, learner.update)
    try:
        while learner.update < total:
            unroll = actors.next()
            if lags is not None:
                lags.extend(learner.update - v for v in unroll.versions)
            set_learning_rate(learner.optimizer, learning_rate(tc, learner.update, total))
            losses, grad_norm = _learn(learner.agent, learner.optimizer, unroll.roll, unroll.start, tc)
            learner.update += 1
            actors.publish(learner.agent, learner.update)
            learner.episodes.add(unroll.finished)
            since_log.extend(unroll.finished)
            bar.update(per_update)
            if learner.update % tc.log_every == 0 or learner.update == total:
                step = learner.update
                record = _record(step, step * per_update, learner.episodes, since_log, losses, grad_norm, lags)
                record["lr"] = learner.optimizer.param_groups[0]["lr"]  # the last update's (train.lr_schedule)
                metrics.log(record)
                best = keep_if_best(run_dir, step, step * per_update, learner.agent, learner.episodes, text, best)
                since_log, lags = [], ([] if lags is not None else None)
                bar.set_postfix(ret=f"{record['mean_return']:.2f}", success=f"{record['success_rate']:.2f}")
            if learner.update % tc.checkpoint_every == 0 or learner.update == total:
                clock.lap(learner.update)  # before the checkpoint: a kill between them only repeats the lap
                last = _save(run_dir, cfg, learner, actors)
    except AgentDiverged as e:
        raise diverged(e, learner.update + 1, last) from None
    finally:
        bar.close()
        metrics.close()
    return last


def train_agent(
    cfg: RLConfig | None,
    run_dir: str | Path,
    *,
    resume: bool = False,
    progress: bool = True,
    log: Log = print,
) -> AgentSummary:
    """Train (or, with ``resume``, continue from the newest checkpoint that verifies) the agent of ``cfg`` in
    ``run_dir``. A resumed run keeps its config (``cfg`` None), but for :data:`RESUME_CHANGES`: ``train.env_steps``
    may grow to continue a finished run, ``train.lr`` and ``train.grad_clip`` change to continue a diverged one.
    (With ``train.lr_schedule = "linear"`` the anneal then stretches to the new end: a continued run is not the
    longer run from the start, as it is with a constant rate.)
    The run directory is locked meanwhile: a second process training it stops in one line."""
    run_dir = Path(run_dir)
    lock = RunLock(run_dir)
    try:
        if resume and run_dir.is_dir():
            lock.acquire()
        cfg, ckpt_path = _run_config(cfg, run_dir, resume, log)
        if cfg.core.kind == "transformer":  # sizes that cannot fit stop here, before anything is built or written
            check_model_size(cfg.model, device=torch.device("cpu"), bytes_per_parameter=TRAINING_BYTES)
        if not resume:
            run_dir.mkdir(parents=True, exist_ok=True)
            lock.acquire()
            _run_config(cfg, run_dir, resume, log)  # again, now that the directory is held: a racing start stops
        return _train_locked(cfg, run_dir, ckpt_path, resume, progress)
    finally:
        lock.release()


def _train_locked(cfg: RLConfig, run_dir: Path, ckpt_path: Path | None, resume: bool, progress: bool) -> AgentSummary:
    tc = cfg.train
    torch.set_num_threads(tc.threads)
    torch.manual_seed(tc.seed)
    np.random.seed(tc.seed)
    start_time = time.perf_counter()
    learner, actors = _setup(cfg, run_dir, ckpt_path, resume)
    try:  # actor processes stop however this is left: finished, failed or interrupted
        path = _train(cfg, run_dir, learner, actors, progress, ckpt_path) or _save(run_dir, cfg, learner, actors)
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
        best=read_best_or_warn(run_dir, log=lambda line: None),  # said when training began
    )


__all__ = ["AgentSummary", "collect", "train_agent"]
