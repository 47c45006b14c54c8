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

import copy
from typing import Any

import gymnasium as gym
import numpy as np

from compressive_transformer.agents.config import EnvConfig
from compressive_transformer.core.config import ConfigError

INSTALL_HINT = "pip install 'compressive-transformer[rl]'"

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
    try:
        import minigrid  # noqa: F401  (registers the MiniGrid environments)
        from minigrid.wrappers import ImgObsWrapper
    except ImportError:
        raise ConfigError(f"env.name = 'minigrid' needs the minigrid package; {INSTALL_HINT}") from None
    try:
        env = ImgObsWrapper(gym.make(cfg.minigrid_id))
    except gym.error.Error as e:  # NameNotFound, VersionNotFound, ...: the id names no registered environment
        known = ", ".join(sorted(i for i in gym.registry if i.startswith("MiniGrid-Memory")))
        raise ConfigError(
            f"env.minigrid_id: {cfg.minigrid_id!r} is not a MiniGrid environment ({e}); e.g. {known}"
        ) from None
    space = gym.spaces.Box(0.0, 1.0, (int(np.prod(env.observation_space.shape)),), np.float32)
    return gym.wrappers.TransformObservation(env, _flat_grid, space)


def _flat_grid(obs: np.ndarray) -> np.ndarray:
    """The agent's view, flat; MiniGrid's (object, colour, state) codes are integers up to 10, brought into [0, 1]."""
    return obs.reshape(-1).astype(np.float32) / 10.0


class EpisodeRecorder(gym.Wrapper):
    """Keeps what the current episode is made of: the seed or random-generator state it was reset from and the
    actions since. That (integers, JSON) is all a checkpoint stores of an environment; a resumed run rebuilds the
    environment by resetting it the same way and replaying the actions, so no object is ever deserialised."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.record: dict[str, Any] = {"seed": None, "rng": None, "actions": []}

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict]:
        rng = None if seed is not None else self.env.unwrapped.np_random.bit_generator.state
        out = self.env.reset(seed=seed, options=options)
        self.record = {"seed": None if seed is None else int(seed), "rng": rng, "actions": []}
        return out

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        self.record["actions"].append(int(action))
        return self.env.step(action)

    def replay(self, record: Any) -> np.ndarray:
        """Rebuild the episode of ``record`` (a :attr:`record` read back from JSON); returns its latest observation.
        A record that does not describe an episode of this environment is a ``ValueError``."""
        seed, rng, actions = _checked_record(record, int(self.action_space.n))
        if seed is None:
            try:
                self.env.unwrapped.np_random.bit_generator.state = rng
            except (TypeError, ValueError, KeyError, OverflowError) as e:
                raise ValueError(f"its random-generator state is not one ({type(e).__name__})") from None
        obs, _ = self.env.reset(seed=seed)
        for action in actions:
            obs, _, terminated, truncated, _ = self.env.step(action)
            if terminated or truncated:
                raise ValueError("its episode ends before its recorded actions do")
        self.record = {"seed": seed, "rng": rng, "actions": list(actions)}
        return obs


def _checked_record(record: Any, n_actions: int) -> tuple[int | None, dict | None, list[int]]:
    """The parts of an environment record, each of the type and range it must have."""
    if not isinstance(record, dict) or set(record) != {"seed", "rng", "actions"}:
        raise ValueError("it is not a record of seed, rng and actions")
    seed, rng, actions = record["seed"], record["rng"], record["actions"]
    if seed is not None and (type(seed) is not int or not 0 <= seed < 2**64):
        raise ValueError(f"its seed {seed!r} is not an integer in [0, 2**64)")
    if seed is None and not isinstance(rng, dict):
        raise ValueError("it has neither a seed nor a random-generator state")
    if not isinstance(actions, list) or not all(type(a) is int and 0 <= a < n_actions for a in actions):
        raise ValueError(f"its actions are not a list of integers in [0, {n_actions})")
    return seed, rng, actions


def make_vector_env(cfg: EnvConfig, n_envs: int) -> gym.vector.SyncVectorEnv:
    """``n_envs`` copies stepping in this process; a finished episode is replaced by a new one in the same step, so
    the observation after a done is the first of the next episode."""
    return gym.vector.SyncVectorEnv(
        [lambda: EpisodeRecorder(make_env(cfg)) for _ in range(n_envs)],
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
    )


def env_state(envs: gym.vector.SyncVectorEnv) -> list[dict[str, Any]]:
    """What a checkpoint keeps of the environments: each one's episode record (seed or random-generator state,
    actions; see :class:`EpisodeRecorder`). With same-step autoreset the vector wrapper keeps nothing between steps."""
    return [copy.deepcopy(env.record) for env in envs.envs]


def restore_env_state(envs: gym.vector.SyncVectorEnv, state: Any, obs: np.ndarray | None = None) -> None:
    """Rebuild the environments saved by :func:`env_state` by replaying their episodes; where ``obs`` (the pending
    observations the checkpoint saved, (n_envs, obs_dim)) is given, each replay must end on its row. Anything else
    than such records (a pickle of an earlier version included, which is never loaded) is a ``ValueError``."""
    if isinstance(state, str):
        raise ValueError(
            "it stores its environments as a pickle (an earlier version's format), which is never loaded since "
            "loading a pickle can run code"
        )
    if not isinstance(state, list) or len(state) != len(envs.envs):
        n = len(state) if isinstance(state, list) else "no list of"
        raise ValueError(f"it holds {n} environment records, the run has {len(envs.envs)} environments")
    for i, (env, record) in enumerate(zip(envs.envs, state)):
        try:
            last = env.replay(record)
        except ValueError as e:
            raise ValueError(f"environment {i} cannot be rebuilt: {e}") from None
        if obs is not None and not np.array_equal(np.asarray(last, np.float32), np.asarray(obs[i], np.float32)):
            raise ValueError(f"environment {i} does not replay to the observation it was saved with")


__all__ = ["EpisodeRecorder", "NonmatchingEnv", "env_state", "make_env", "make_vector_env", "restore_env_state"]
