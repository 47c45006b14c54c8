"""Evaluating a trained agent: its policy (the run's newest checkpoint, or its best window's weights) acts on fresh
episodes, seeded apart from training's, as it acted in training (actions sampled, memory reset at each episode's
start); the success rate comes with an exact binomial interval.

Each environment plays the same number of episodes and those alone are counted: counting the first N episodes to
end would favour short ones (a MiniGrid room solved quickly ends sooner than one that times out).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from scipy.stats import binomtest
from tqdm.auto import tqdm

from compressive_transformer.agents.acting import Episodes, act, start_actors
from compressive_transformer.agents.best import read_best
from compressive_transformer.agents.config import EVAL_EPISODES, EVAL_SEED, RLConfig, load_saved_config
from compressive_transformer.core.config import ConfigError, Log
from compressive_transformer.core.fileio import check_links
from compressive_transformer.runs.checkpoint import WEIGHTS_FILES, checkpoint_step, load_weights, newest_good_checkpoint

SEED_RANGE = 2**32  # seeds of numpy's generators, as train.seed's


@dataclass(frozen=True)
class AgentEvaluation:
    checkpoint: Path
    step: int  # the update the weights are from
    episodes: int
    successes: int
    success_rate: float
    interval: tuple[float, float]  # exact (Clopper-Pearson) 95% interval of the success rate
    mean_return: float
    seed: int


def policy_checkpoint(run_dir: Path, best: bool, log: Log = print) -> tuple[Path, int]:
    """The checkpoint to evaluate and its update: the best window's (``best``) or the newest that verifies."""
    if best:
        found = read_best(run_dir)
        if found is None:
            raise ConfigError(
                f"{run_dir} holds no best policy yet (one is kept once train.window episodes have ended); "
                "evaluate its newest checkpoint without --best"
            )
        return found.path, found.step
    path = newest_good_checkpoint(run_dir, WEIGHTS_FILES, log)
    if path is None:
        raise ConfigError(f"{run_dir} holds no checkpoint of an agent run; train one with `rl train`")
    return path, checkpoint_step(path)


def _play(cfg: RLConfig, path: Path, n_envs: int, per_env: int, seed: int, progress: bool) -> list[float]:
    """The returns of each environment's first ``per_env`` episodes, played by the weights of ``path``."""
    envs, agent, actors = start_actors(cfg, n_envs, seed)
    try:
        load_weights(path, agent)
        played, returns = np.zeros(n_envs, dtype=int), []
        with tqdm(total=per_env * n_envs, unit="episode", disable=not progress) as bar:
            while played.min() < per_env:
                for i, r in act(agent, envs, actors).ended:
                    if played[i] < per_env:
                        played[i] += 1
                        returns.append(r)
                        bar.update(1)
        return returns
    finally:
        envs.close()


def evaluate_agent(
    run_dir: str | Path,
    *,
    best: bool = False,
    episodes: int = EVAL_EPISODES,
    n_envs: int | None = None,
    seed: int = EVAL_SEED,
    progress: bool = False,
    log: Log = print,
) -> AgentEvaluation:
    """Play ``episodes`` episodes (rounded up to a multiple of the environments, ``train.n_envs`` by default) with
    the policy of ``run_dir`` and report how many it won."""
    run_dir = Path(run_dir)
    if episodes < 1:
        raise ConfigError(f"--episodes {episodes}: give at least 1")
    if n_envs is not None and n_envs < 1:
        raise ConfigError(f"--envs {n_envs}: give at least 1")
    if not 0 <= seed < SEED_RANGE:
        raise ConfigError(f"--seed {seed}: give a whole number from 0 to {SEED_RANGE - 1} (the environments' seeds)")
    if run_dir.is_dir():
        check_links(run_dir)  # what is read and played is the run's own, not what a link leads to
    try:
        cfg = load_saved_config(run_dir / "config.toml")
    except ConfigError as e:
        raise ConfigError(
            f"{run_dir} does not hold an agent run ({e}); `rl evaluate` reads runs of `rl train`"
        ) from None
    path, step = policy_checkpoint(run_dir, best, log)
    n_envs = min(n_envs or cfg.train.n_envs, episodes)
    per_env = math.ceil(episodes / n_envs)
    threads = torch.get_num_threads()
    # the run's torch threads, as it acted in training: an agent's steps are tiny, and more threads than cores
    # free spin-wait (300 times slower on a busy 2-core machine); the caller's random state is left as it was
    torch.set_num_threads(cfg.train.threads)
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            returns = _play(cfg, path, n_envs, per_env, seed, progress)
    finally:
        torch.set_num_threads(threads)
    tally = Episodes(deque(returns))
    ci = binomtest(tally.successes, len(returns)).proportion_ci(0.95, method="exact")
    return AgentEvaluation(
        checkpoint=path,
        step=step,
        episodes=len(returns),
        successes=tally.successes,
        success_rate=tally.success_rate,
        interval=(float(ci.low), float(ci.high)),
        mean_return=tally.mean_return,
        seed=seed,
    )


__all__ = ["AgentEvaluation", "evaluate_agent", "policy_checkpoint"]
