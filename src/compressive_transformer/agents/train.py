"""Training an agent: actors step a gymnasium vector environment with the core's memory (no gradient), the learner
recomputes the unroll and takes an IMPALA step (V-trace targets). A transformer core's learner processes the unroll
as one batch from the memories the actors read (memory is detached between steps, so nothing is lost); the LSTM's
unrolls step by step from the state the actors started with (back-propagation through the unroll).

Actors and learner share one process and one set of weights, so the behaviour policy differs from the learner's
not at all (the same code on the same inputs; V-trace's importance weights are 1), and V-trace reduces to n-step
returns; the weights matter once actors lag the learner. A checkpoint holds weights, optimizer, the actors' memory, the
environments and every random generator, so a resumed run continues bit for bit.
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

from compressive_transformer.agents.actor_critic import ActorCritic, Losses, Rollout, vtrace_losses
from compressive_transformer.agents.config import RLConfig, RLTrainConfig, load_rl_config
from compressive_transformer.agents.core import CoreState, detach_state
from compressive_transformer.agents.envs import env_state, make_vector_env, restore_env_state
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


@dataclass
class ActorState:
    """What the actors carry from one unroll to the next."""

    obs: torch.Tensor  # (B, obs_dim) the next observation
    first: torch.Tensor  # (B,) bool: it starts an episode
    memory: CoreState
    episode_return: np.ndarray  # (B,) return so far of each environment's episode
    returns: deque  # of the last ``window`` finished episodes
    episodes: int = 0


def config_text(cfg: RLConfig) -> str:
    return "# resolved config of this agent run (written by compressive-transformer rl train)\n" + dumps(to_dict(cfg))


@torch.no_grad()
def collect(agent: ActorCritic, envs: Any, actors: ActorState, unroll: int) -> tuple[Rollout, CoreState, list[float]]:
    """Step every environment ``unroll`` times; returns the rollout, the memory it started from and the returns of
    the episodes that ended."""
    start = actors.memory
    obs, first = [actors.obs], [actors.first]
    actions, logps, rewards, dones, reads, finished = [], [], [], [], [], []
    for _ in range(unroll):
        out, read = agent.step(actors.obs, actors.first, actors.memory)
        reads.append(read)
        dist = torch.distributions.Categorical(logits=out.logits)
        action = dist.sample()
        next_obs, reward, terminated, truncated, _ = envs.step(action.numpy())
        done = terminated | truncated
        actors.episode_return += reward
        for i in np.flatnonzero(done):
            finished.append(float(actors.episode_return[i]))
            actors.returns.append(float(actors.episode_return[i]))
            actors.episode_return[i] = 0.0
        actors.episodes += int(done.sum())
        actors.memory = out.state
        actors.obs = torch.as_tensor(next_obs, dtype=torch.float32)
        actors.first = torch.as_tensor(done)
        obs.append(actors.obs)
        first.append(actors.first)
        actions.append(action)
        logps.append(dist.log_prob(action))
        rewards.append(torch.as_tensor(reward, dtype=torch.float32))
        dones.append(torch.as_tensor(done))
    if agent.can_replay:  # the memory the bootstrap step reads
        reads.append(agent.core.read_state(actors.memory, actors.first))
    roll = Rollout(
        obs=torch.stack(obs),
        first=torch.stack(first),
        actions=torch.stack(actions),
        behaviour_logp=torch.stack(logps),
        rewards=torch.stack(rewards),
        done=torch.stack(dones),
        reads=reads if agent.can_replay else None,
    )
    return roll, start, finished


def _success_rate(returns: deque | list) -> float:
    return float(np.mean([r > 0 for r in returns])) if returns else math.nan


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
    update: int, env_steps: int, actors: ActorState, finished: list[float], losses: Losses, grad_norm: torch.Tensor
) -> dict[str, Any]:
    """One metrics line: progress, the episodes finished since the last line and the recent window, the losses."""
    return {
        "step": update,
        "env_steps": env_steps,
        "episodes": actors.episodes,
        "new_episodes": len(finished),
        "new_successes": sum(r > 0 for r in finished),
        "success_rate": _success_rate(actors.returns),
        "mean_return": float(np.mean(actors.returns)) if actors.returns else math.nan,
        "loss": float(losses.total.detach()),
        "policy_loss": float(losses.policy),
        "value_loss": float(losses.value),
        "entropy": float(losses.entropy),
        "aux_loss": float(losses.aux),
        "grad_norm": float(grad_norm),
    }


def _actor_data(actors: ActorState, envs: Any) -> dict[str, Any]:
    """What a checkpoint keeps of the actors besides their memory: the environments' state, the pending observation,
    the running episode returns and the recent window, so a resumed run continues the same episodes."""
    return {
        "envs": env_state(envs),
        "obs": actors.obs,
        "first": actors.first,
        "episode_return": actors.episode_return,
        "returns": list(actors.returns),
        "episodes": actors.episodes,
    }


def _restore_actors(actors: ActorState, envs: Any, data: dict[str, Any]) -> None:
    """The inverse of :func:`_actor_data` (the actors' memory is restored by the core)."""
    restore_env_state(envs, data["envs"])
    actors.obs, actors.first = data["obs"], data["first"]
    actors.episode_return = data["episode_return"]
    actors.returns.extend(data["returns"])
    actors.episodes = data["episodes"]


def _start(cfg: RLConfig) -> tuple[Any, ActorCritic, ActorState]:
    """The environments (reset with the run's seed), the agent and its actors at the first step of every episode."""
    tc = cfg.train
    envs = make_vector_env(cfg.env, tc.n_envs)
    first_obs, _ = envs.reset(seed=tc.seed)
    obs_dim, n_actions = int(np.prod(envs.single_observation_space.shape)), int(envs.single_action_space.n)
    agent = ActorCritic(cfg, obs_dim, n_actions)
    agent.train()  # actors too: no dropout in an agent, and no inference cache, so actors and learner agree exactly
    actors = ActorState(
        obs=torch.as_tensor(first_obs, dtype=torch.float32),
        first=torch.ones(tc.n_envs, dtype=torch.bool),
        memory=agent.initial_state(tc.n_envs),
        episode_return=np.zeros(tc.n_envs),
        returns=deque(maxlen=tc.window),
    )
    return envs, agent, actors


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

    envs, agent, actors = _start(cfg)
    optimizer = torch.optim.Adam(agent.parameters(), lr=tc.lr)
    update = 0
    if resume:
        ckpt = load_checkpoint(ckpt_path, model=agent, optimizer=optimizer)
        update = ckpt.step
        _restore_actors(actors, envs, ckpt.data_state)
        actors.memory = agent.core.state_from_tensors(ckpt.memory)
    else:
        run_dir.mkdir(parents=True, exist_ok=True)
        write_text_atomic(run_dir / CONFIG_FILE, config_text(cfg))

    metrics = MetricsLogger(run_dir)  # TensorBoard too where it is installed
    metrics.truncate_after(update)
    per_update = tc.n_envs * tc.unroll
    total = math.ceil(tc.env_steps / per_update)
    start_time = time.perf_counter()
    bar = tqdm(total=total * per_update, initial=update * per_update, unit="step", disable=not progress)
    since_log: list[float] = []
    path = ckpt_path

    def save() -> Path:
        return save_checkpoint(
            run_dir,
            update,
            model=agent,
            optimizer=optimizer,
            memory=agent.core.state_tensors(actors.memory),
            data_state=_actor_data(actors, envs),
            config_toml=config_text(cfg),
            extra={"env_steps": update * per_update},
        )

    try:
        while update < total:
            roll, start, finished = collect(agent, envs, actors, tc.unroll)
            losses, grad_norm = _learn(agent, optimizer, roll, start, tc)
            actors.memory = detach_state(actors.memory)
            update += 1
            since_log.extend(finished)
            bar.update(per_update)
            if update % tc.log_every == 0 or update == total:
                record = _record(update, update * per_update, actors, since_log, losses, grad_norm)
                metrics.log(record)
                since_log = []
                bar.set_postfix(ret=f"{record['mean_return']:.2f}", success=f"{record['success_rate']:.2f}")
            if update % tc.checkpoint_every == 0 or update == total:
                path = save()
    finally:
        bar.close()
        metrics.close()
    return AgentSummary(
        updates=update,
        env_steps=update * per_update,
        episodes=actors.episodes,
        success_rate=_success_rate(actors.returns),
        mean_return=float(np.mean(actors.returns)) if actors.returns else math.nan,
        checkpoint=path if path is not None else save(),
        seconds=time.perf_counter() - start_time,
    )


__all__ = ["AgentSummary", "collect", "train_agent"]
