"""Acting: environments stepped with the core's memory and no gradient, recording what the learner needs (the
behaviour policy's log-probabilities and, for transformer cores, the memory each step read). The same code acts in
the learner's process (``train.actors = 0``) and in each actor process (:mod:`compressive_transformer.agents.actors`).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from compressive_transformer.agents.actor_critic import ActorCritic, Rollout
from compressive_transformer.agents.config import RLConfig
from compressive_transformer.agents.core import CoreState, join_states, stack_rows
from compressive_transformer.agents.envs import env_state, make_vector_env, restore_env_state
from compressive_transformer.agents.health import require_finite_logits


@dataclass
class ActorState:
    """What the actors carry from one unroll to the next."""

    obs: torch.Tensor  # (B, obs_dim) the next observation
    first: torch.Tensor  # (B,) bool: it starts an episode
    memory: CoreState
    episode_return: np.ndarray  # (B,) return so far of each environment's episode


@dataclass
class Episodes:
    """The learner's count of finished episodes and the window of recent returns its metrics report."""

    returns: deque
    count: int = 0

    def add(self, finished: list[float]) -> None:
        self.returns.extend(finished)
        self.count += len(finished)

    @property
    def successes(self) -> int:
        """Episodes of the window won (a positive return)."""
        return sum(r > 0 for r in self.returns)

    @property
    def success_rate(self) -> float:
        return self.successes / len(self.returns) if self.returns else math.nan

    @property
    def mean_return(self) -> float:
        return float(np.mean(self.returns)) if self.returns else math.nan


@dataclass
class Unroll:
    """One unroll as the learner receives it: the rollout, the memory it started from, the returns of the episodes
    that ended in it and the versions of the weights it was acted with (one per actor process it comes from; none
    from the learner's own process)."""

    roll: Rollout
    start: CoreState
    finished: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)


@dataclass
class Step:
    """One step of every environment, as :func:`act` took it."""

    read: Any  # the memory the step read (what the learner replays)
    dist: torch.distributions.Categorical  # the policy it sampled from
    action: torch.Tensor  # (B,)
    reward: np.ndarray  # (B,)
    done: np.ndarray  # (B,) bool: the episode ended with this step
    ended: list[tuple[int, float]]  # (environment, return) of each episode that ended


@torch.no_grad()
def act(agent: ActorCritic, envs: Any, actors: ActorState) -> Step:
    """Sample an action for every environment from the policy, step them and carry the actors to the next step."""
    out, read = agent.step(actors.obs, actors.first, actors.memory)
    require_finite_logits(out.logits)
    dist = torch.distributions.Categorical(logits=out.logits)
    action = dist.sample()
    next_obs, reward, terminated, truncated, _ = envs.step(action.numpy())
    done = terminated | truncated
    actors.episode_return += reward
    ended = []
    for i in np.flatnonzero(done):
        ended.append((int(i), float(actors.episode_return[i])))
        actors.episode_return[i] = 0.0
    actors.memory = out.state
    actors.obs = torch.as_tensor(next_obs, dtype=torch.float32)
    actors.first = torch.as_tensor(done)
    return Step(read, dist, action, reward, done, ended)


@torch.no_grad()
def collect(agent: ActorCritic, envs: Any, actors: ActorState, unroll: int) -> tuple[Rollout, CoreState, list[float]]:
    """Step every environment ``unroll`` times; returns the rollout, the memory it started from and the returns of
    the episodes that ended."""
    start = actors.memory
    obs, first = [actors.obs], [actors.first]
    actions, logps, rewards, dones, reads, finished = [], [], [], [], [], []
    for _ in range(unroll):
        step = act(agent, envs, actors)
        reads.append(step.read)
        finished.extend(r for _, r in step.ended)
        obs.append(actors.obs)
        first.append(actors.first)
        actions.append(step.action)
        logps.append(step.dist.log_prob(step.action))
        rewards.append(torch.as_tensor(step.reward, dtype=torch.float32))
        dones.append(torch.as_tensor(step.done))
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


def start_actors(cfg: RLConfig, n_envs: int, seed: int) -> tuple[Any, ActorCritic, ActorState]:
    """``n_envs`` environments (reset with seeds ``seed``, ``seed + 1``, ...), an agent and its actors at the first
    step of every episode."""
    envs = make_vector_env(cfg.env, n_envs)
    first_obs, _ = envs.reset(seed=seed)
    obs_dim, n_actions = int(np.prod(envs.single_observation_space.shape)), int(envs.single_action_space.n)
    agent = ActorCritic(cfg, obs_dim, n_actions)
    agent.train()  # actors too: no dropout in an agent, and no inference cache, so actors and learner agree exactly
    actors = ActorState(
        obs=torch.as_tensor(first_obs, dtype=torch.float32),
        first=torch.ones(n_envs, dtype=torch.bool),
        memory=agent.initial_state(n_envs),
        episode_return=np.zeros(n_envs),
    )
    return envs, agent, actors


def actor_data(actors: ActorState, envs: Any) -> dict[str, Any]:
    """What a checkpoint keeps of in-process actors besides their memory: the environments' state, the pending
    observation and the running episode returns, so a resumed run continues the same episodes."""
    return {"envs": env_state(envs), "obs": actors.obs, "first": actors.first, "episode_return": actors.episode_return}


def restore_actors(actors: ActorState, envs: Any, data: Any) -> None:
    """The inverse of :func:`actor_data` (the actors' memory is restored by the core): the environments are rebuilt
    by replaying their episodes up to the saved observations. A ``ValueError`` says what does not fit."""
    if not isinstance(data, dict) or not {"envs", "obs", "first", "episode_return"} <= set(data):
        raise ValueError("it holds no state of the actors (envs, obs, first, episode_return)")
    n = actors.obs.shape[0]
    obs, first, returns = data["obs"], data["first"], data["episode_return"]
    if not (isinstance(obs, torch.Tensor) and obs.shape == actors.obs.shape and obs.dtype == torch.float32):
        raise ValueError(f"its pending observations are not a float32 tensor of shape {tuple(actors.obs.shape)}")
    if not (isinstance(first, torch.Tensor) and first.shape == (n,) and first.dtype == torch.bool):
        raise ValueError(f"its episode starts are not a bool tensor of shape ({n},)")
    if not (isinstance(returns, np.ndarray) and returns.shape == (n,) and returns.dtype.kind == "f"):
        raise ValueError(f"its episode returns are not a float array of shape ({n},)")
    restore_env_state(envs, data["envs"], obs.numpy())
    actors.obs, actors.first, actors.episode_return = obs, first, returns


def join_unrolls(parts: list[Unroll]) -> Unroll:
    """One unroll whose environments are those of ``parts`` in order (the learner's batch of every actor's
    environments); each step's recorded memories are joined row-wise, which needs every actor's memory at the same
    fill (actors start together and step alike, so they are)."""
    rolls = [p.roll for p in parts]
    cat = lambda name: torch.cat([getattr(r, name) for r in rolls], dim=1)  # noqa: E731  (T(+1), sum B, ...)
    reads = None
    if rolls[0].reads is not None:
        reads = [stack_rows([r.reads[t] for r in rolls]) for t in range(len(rolls[0].reads))]
    roll = Rollout(
        obs=cat("obs"),
        first=cat("first"),
        actions=cat("actions"),
        behaviour_logp=cat("behaviour_logp"),
        rewards=cat("rewards"),
        done=cat("done"),
        reads=reads,
    )
    finished = [r for p in parts for r in p.finished]
    return Unroll(roll, join_states([p.start for p in parts]), finished, [v for p in parts for v in p.versions])


__all__ = [
    "ActorState",
    "Episodes",
    "Step",
    "Unroll",
    "act",
    "actor_data",
    "collect",
    "join_unrolls",
    "restore_actors",
    "start_actors",
]
