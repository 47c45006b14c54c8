"""Metrics sinks: one JSON object per line in ``metrics.jsonl``, mirrored to TensorBoard when it is installed.

A process killed mid-write can leave a cut last line; readers skip it (saying so once), and a logger appends on a
fresh line, so records never run together (:mod:`~compressive_transformer.runs.jsonl`).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from compressive_transformer.core.fileio import write_text_atomic
from compressive_transformer.runs.jsonl import append_record, read_records

METRICS_FILE = "metrics.jsonl"


def _open_tensorboard(run_dir: Path) -> Any:
    try:
        from torch.utils.tensorboard import SummaryWriter
    except Exception:  # tensorboard is an optional extra
        return None
    return SummaryWriter(log_dir=str(run_dir / "tensorboard"))


def _json_safe(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)  # JSON has no nan/inf
    if isinstance(v, (list, tuple)):
        return [_json_safe(x) for x in v]
    return v


def _step_of(record: dict[str, Any]) -> float:
    step = record.get("step", 0)
    return step if isinstance(step, (int, float)) else 0


class MetricsLogger:
    """Appends records to ``<run>/metrics.jsonl``; a resumed run first drops records past its checkpoint."""

    def __init__(self, run_dir: str | Path, *, tensorboard: bool = True, enabled: bool = True) -> None:
        self.path = Path(run_dir) / METRICS_FILE
        self.enabled = enabled  # one writer per run: only the main process of a multi-process run logs
        if enabled:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        self.use_tensorboard = tensorboard and enabled
        self.tb: Any = None  # opened on the first record, so a closed logger can log again

    def truncate_after(self, step: int) -> None:
        """Forget records logged after ``step`` (they belong to the part of a killed run that is being redone)."""
        if not self.enabled or not self.path.is_file():
            return
        kept = [r for r in read_records(self.path) if _step_of(r) <= step]
        write_text_atomic(self.path, "".join(json.dumps(r) + "\n" for r in kept))  # a kill here loses no record

    def log(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        append_record(self.path, {k: _json_safe(v) for k, v in record.items()})
        if self.use_tensorboard and self.tb is None:
            self.tb = _open_tensorboard(self.path.parent)
            self.use_tensorboard = self.tb is not None
        if self.tb is not None:
            step = int(record.get("step", 0))
            for key, value in record.items():
                if key == "step":
                    continue
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    self.tb.add_scalar(key, value, step)
                elif isinstance(value, list) and all(isinstance(x, (int, float)) for x in value):
                    for i, x in enumerate(value):
                        self.tb.add_scalar(f"{key}/{i}", x, step)

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()
            self.tb = None


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    """The run's metric records in order; a line a killed write cut short is skipped, said once on stderr."""
    return read_records(Path(run_dir) / METRICS_FILE)
