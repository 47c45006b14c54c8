"""Environments with a memory demand: "select nonmatching object" (the task of the paper's agent experiment, reduced
to its logic) and MiniGrid's ``Memory`` rooms as an external check. Both become flat float observations.

Nonmatching episode (length ``show_steps + delay + 1``): one of ``n_objects`` objects is shown for ``show_steps``
steps, then ``delay`` steps show random distractor symbols, then two objects are presented: the one shown and a new
one. The action names an object; the new one earns reward 1, anything else 0, and the episode ends. Actions before
the choice do nothing. Choosing between the two presented objects at random succeeds half the time; doing better
needs the first steps of the episode at its last. (The agent chooses an object by its identity rather than by
walking to it, so the policy is a linear read of what memory holds: "not the one I saw".)
"""

from __future__ import annotations

import base64
import pickle
from typing import Any

import gymnasium as gym
import numpy as np

from compressive_transformer.agents.config import EnvConfig

PHASES = 3  # show, delay, choice


class NonmatchingEnv(gym.Env):
    """Observation: [phase one-hot (3) | shown object (K) | presented objects (K, two ones) | distractor (N)]."""

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(self, *, n_objects: int = 2, delay: int = 36, show_steps: int = 3, n_distractors: int = 4) -> None:
        if n_objects < 2:
            raise ValueError("n_objects must be >= 2 (a shown object and a new one)")
        self.n_objects, self.delay, self.show_steps, self.n_distractors = n_objects, delay, show_steps, n_distractors
        size = PHASES + 2 * n_objects + n_distractors
        self.observation_space = gym.spaces.Box(0.0, 1.0, (size,), np.float32)
        self.action_space = gym.spaces.Discrete(n_objects)
        self.episode_length = show_steps + delay + 1
        self._t = 0
        self._shown = self._new = 0

    def _obs(self) -> np.ndarray:
        K = self.n_objects
        obs = np.zeros(self.observation_space.shape, np.float32)
        if self._t < self.show_steps:
            obs[0] = 1.0
            obs[PHASES + self._shown] = 1.0
        elif self._t < self.show_steps + self.delay:
            obs[1] = 1.0
            obs[PHASES + 2 * K + int(self.np_random.integers(self.n_distractors))] = 1.0
        else:
            obs[2] = 1.0
            obs[PHASES + K + self._shown] = obs[PHASES + K + self._new] = 1.0
        return obs

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self._t = 0
        self._shown = int(self.np_random.integers(self.n_objects))
        self._new = (self._shown + 1 + int(self.np_random.integers(self.n_objects - 1))) % self.n_objects
        return self._obs(), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
        if self._t == self.episode_length - 1:  # the choice
            success = int(action) == self._new
            self._t += 1
            return np.zeros(self.observation_space.shape, np.float32), float(success), True, False, {}
        self._t += 1
        return self._obs(), 0.0, False, False, {}


def make_env(cfg: EnvConfig) -> gym.Env:
    """One environment of the configured kind, with flat float32 observations."""
    if cfg.name == "nonmatching":
        return NonmatchingEnv(
            n_objects=cfg.n_objects, delay=cfg.delay, show_steps=cfg.show_steps, n_distractors=cfg.n_distractors
        )
    import minigrid  # noqa: F401  (registers the MiniGrid environments)
    from minigrid.wrappers import ImgObsWrapper

    env = ImgObsWrapper(gym.make(cfg.minigrid_id))
    space = gym.spaces.Box(0.0, 1.0, (int(np.prod(env.observation_space.shape)),), np.float32)
    return gym.wrappers.TransformObservation(env, _flat_grid, space)


def _flat_grid(obs: np.ndarray) -> np.ndarray:
    """The agent's view, flat; MiniGrid's (object, colour, state) codes are integers up to 10, brought into [0, 1]
    (a named function, so the environment pickles into a checkpoint)."""
    return obs.reshape(-1).astype(np.float32) / 10.0


def make_vector_env(cfg: EnvConfig, n_envs: int) -> gym.vector.SyncVectorEnv:
    """``n_envs`` copies stepping in this process; a finished episode is replaced by a new one in the same step, so
    the observation after a done is the first of the next episode."""
    return gym.vector.SyncVectorEnv(
        [lambda: make_env(cfg) for _ in range(n_envs)], autoreset_mode=gym.vector.AutoresetMode.SAME_STEP
    )


def env_state(envs: gym.vector.SyncVectorEnv) -> str:
    """Everything the environments hold (positions, episode progress, random generators) as text for a checkpoint.
    With same-step autoreset the vector wrapper itself keeps nothing between steps."""
    return base64.b64encode(pickle.dumps(envs.envs)).decode("ascii")


def restore_env_state(envs: gym.vector.SyncVectorEnv, state: str) -> None:
    """Put the environments saved by :func:`env_state` (of the same run's checkpoint) back in place."""
    saved = pickle.loads(base64.b64decode(state))
    if len(saved) != len(envs.envs):
        raise ValueError(f"the checkpoint holds {len(saved)} environments, the run has {len(envs.envs)}")
    envs.envs = saved


__all__ = ["NonmatchingEnv", "env_state", "make_env", "make_vector_env", "restore_env_state"]
