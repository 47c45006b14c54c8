"""The best policy a run has reached, kept apart from its checkpoints.

An agent can solve its task and then fall back to chance (``benchmarks/agents/README.md``: no learner we measured
prevents it without slowing learning). The checkpoints keep the newest state, for resuming; this keeps the weights
of the best window the run has reported, so what it solved is never lost. "Best" is the highest success rate over a
full window of ``train.window`` episodes, the mean return breaking ties; a later window must do strictly better to
replace it. It lives in ``<run>/best/checkpoints/step-N/`` (one checkpoint directory, weights only, written and
verified as checkpoints are), so a kill at any moment leaves the previous best or the new one.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from compressive_transformer.agents.acting import Episodes
from compressive_transformer.core.fileio import inside, remove
from compressive_transformer.runs.checkpoint import CheckpointError, checkpoint_extra, list_checkpoints, save_checkpoint

BEST_DIR = "best"


@dataclass(frozen=True)
class BestPolicy:
    """Where the best weights are and the window that earned them."""

    path: Path
    step: int  # the update after which the window was reported
    env_steps: int
    success_rate: float
    mean_return: float
    window: int  # episodes the rates are over

    @property
    def score(self) -> tuple[float, float]:
        return self.success_rate, self.mean_return


def read_best(run_dir: str | Path) -> BestPolicy | None:
    """The run's best policy, or None when it has none yet; a record that does not parse is a one-line error."""
    found = list_checkpoints(Path(run_dir) / BEST_DIR)
    if not found:
        return None
    path = found[-1]
    extra = checkpoint_extra(path)
    try:
        return BestPolicy(
            path=path,
            step=int(extra["step"]),
            env_steps=int(extra["env_steps"]),
            success_rate=float(extra["success_rate"]),
            mean_return=float(extra["mean_return"]),
            window=int(extra["window"]),
        )
    except (KeyError, TypeError, ValueError):
        raise CheckpointError(
            f"{path}: state.json does not record the window that made it the best policy; move it aside"
        ) from None


def read_best_or_warn(run_dir: str | Path, log: Callable[[str], None]) -> BestPolicy | None:
    """:func:`read_best`, but a damaged best is said (once, through ``log``) and treated as none: it is a side copy,
    and the run's checkpoints, not it, are what training continues from; the next better window replaces it."""
    try:
        return read_best(run_dir)
    except CheckpointError as e:
        log(f"warning: the best policy is unusable ({e}); training goes on and keeps the next best window in its place")
        return None


def keep_if_best(
    run_dir: Path,
    step: int,
    env_steps: int,
    agent: torch.nn.Module,
    episodes: Episodes,
    config_toml: str,
    best: BestPolicy | None,
) -> BestPolicy | None:
    """Save ``agent``'s weights as the run's best policy when ``episodes`` fill their window and beat ``best``;
    returns the best policy after the call. The one it replaces is deleted only once the new one is in place."""
    window = episodes.returns.maxlen
    if window is None or len(episodes.returns) < window:
        return best
    score = (episodes.success_rate, episodes.mean_return)
    if best is not None and score <= best.score:
        return best
    record = {"step": step, "env_steps": env_steps, "success_rate": score[0], "mean_return": score[1], "window": window}
    root = run_dir / BEST_DIR
    inside(run_dir, root)
    path = save_checkpoint(
        root,
        step,
        model=agent,
        optimizer=None,
        memory=None,
        data_state=None,
        config_toml=config_toml,
        extra=record,
        keep=len(list_checkpoints(root)) + 1,  # nothing pruned by step: a resumed run's best may have a lower one
    )
    for other in list_checkpoints(root):
        if other != path:
            remove(other, base=run_dir)
    return BestPolicy(path, **record)


__all__ = ["BEST_DIR", "BestPolicy", "keep_if_best", "read_best", "read_best_or_warn"]
