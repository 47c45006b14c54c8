"""Metrics sinks: one JSON object per line in ``metrics.jsonl``, mirrored to TensorBoard when it is installed.

A process killed mid-write can leave a torn last line; readers skip lines that do not parse, and a logger repairs
the file (drops the torn tail) before appending, so records never run together.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from compressive_transformer.core.fileio import write_text_atomic

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


def _parse(line: str) -> dict[str, Any] | None:
    try:
        record = json.loads(line)
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


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
        self.repaired = False

    def truncate_after(self, step: int) -> None:
        """Forget records logged after ``step`` (they belong to the part of a killed run that is being redone)."""
        if not self.enabled or not self.path.is_file():
            return
        text = self.path.read_text(encoding="utf-8", errors="replace")
        kept = [line for line in text.splitlines() if (r := _parse(line)) is not None and _step_of(r) <= step]
        write_text_atomic(self.path, "".join(line + "\n" for line in kept))  # a kill here loses no record
        self.repaired = True

    def _repair_tail(self) -> None:
        """Drop a torn last line (no trailing newline) left by a killed writer, once, before the first append."""
        self.repaired = True
        if not self.path.is_file():
            return
        with self.path.open("rb+") as f:
            size = f.seek(0, 2)
            if size == 0:
                return
            f.seek(size - 1)
            if f.read(1) == b"\n":
                return
            f.seek(max(size - (1 << 20), 0))
            tail = f.read()
            cut = tail.rfind(b"\n")
            f.truncate(size - len(tail) + cut + 1 if cut >= 0 else size - len(tail))

    def log(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        if not self.repaired:
            self._repair_tail()
        with self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps({k: _json_safe(v) for k, v in record.items()}) + "\n")
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
    path = Path(run_dir) / METRICS_FILE
    if not path.is_file():
        return []
    records = (_parse(line) for line in path.read_text(encoding="utf-8", errors="replace").splitlines() if line.strip())
    return [r for r in records if r is not None]
