"""The line a command prints after Ctrl-C: advice that matches what the interrupted command left behind."""

from __future__ import annotations

from pathlib import Path

from compressive_transformer.core.install import program
from compressive_transformer.runs.rundir import CONFIG_FILE
from compressive_transformer.runs.runlock import LOCK_FILE

RESUMABLE = {  # commands whose rerun continues where they stopped
    "study": "rerun the same command to continue; finished runs are reused",
    "compare": "rerun the same command to continue; finished runs are reused",
}


def interrupted_message(command: str, run_dir: Path | None = None, *, seeded: bool = False) -> str:
    """The line printed after Ctrl-C. For ``train`` and ``rl`` (``rl train``), ``run_dir`` is the run: resuming is advised only where the
    run directory holds a run that ``--resume`` accepts."""
    if command in ("train", "rl") and run_dir is not None:
        train = "train" if command == "train" else "rl train"
        if (run_dir / CONFIG_FILE).is_file():
            return f"interrupted; continue the run with `{program()} {train} --run-dir {run_dir} --resume`"
        if not run_dir.exists() or not any(p.name != LOCK_FILE for p in run_dir.iterdir()):
            return f"interrupted while {run_dir} was being set up, before its first step; nothing was kept: start it again with the same command"
        return f"interrupted while {run_dir} was being set up; it holds no complete run: delete it, then start it again"
    if command == "task" and seeded:
        return "interrupted; rerun the same command to continue: finished cells are reused"
    return "interrupted" + (f"; {RESUMABLE[command]}" if command in RESUMABLE else "")
