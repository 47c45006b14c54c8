"""The files a run appends to one JSON record per line (``metrics.jsonl``, ``cpu_seconds.jsonl``).

A process killed mid-write can leave the last line cut short (part of a record, or a multi-byte character cut in
two). Appending then starts on a fresh line, so the next record never runs into the cut one; reading skips every line
that is not a whole record, and says so once, in one line that names the file. Nothing in the file is rewritten.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Callable

from compressive_transformer.core.fileio import append_bytes, inside

Record = dict[str, Any]
_noted: set[tuple[str, int, int]] = set()  # (file, first skipped line, lines skipped): each notice once per process


def _stderr(message: str) -> None:
    print(message, file=sys.stderr)


def append_record(path: Path, record: Record) -> None:
    """Append ``record`` as one line of ``path`` (created with its directory when missing), on a fresh line when
    the file's last line was cut short; a link that leads out of the file's folder (the run) is refused."""
    append_bytes(path, json.dumps(record).encode("utf-8") + b"\n")


def read_records(
    path: Path,
    *,
    valid: Callable[[Record], bool] = lambda record: True,
    log: Callable[[str], None] | None = _stderr,
) -> list[Record]:
    """The records of ``path`` in order ([] when it does not exist): each line that parses as a JSON object and
    passes ``valid``. Lines that do not (a line cut by a killed write, a damaged one) are skipped and reported
    through ``log`` once per process, in one line naming the file and the first of them."""
    if not path.is_file():
        return []
    data = inside(path.parent, path).read_bytes()
    lines = data.split(b"\n")
    records, skipped = [], []
    for number, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        record = _parse(raw)
        if record is not None and valid(record):
            records.append(record)
        else:
            skipped.append(number)
    if skipped and log is not None and (key := (str(path), skipped[0], len(skipped))) not in _noted:
        _noted.add(key)
        cut = skipped[-1] == len(lines) and not data.endswith(b"\n")
        what = (
            "its last line is cut short (a write was interrupted)"
            if cut and len(skipped) == 1
            else (f"{len(skipped)} line(s) are not whole records (the first: line {skipped[0]})")
        )
        log(f"note: {path}: {what}, skipped; {len(records)} record(s) read")
    return records


def _parse(raw: bytes) -> Record | None:
    try:
        record = json.loads(raw.decode("utf-8"))
    except (ValueError, UnicodeDecodeError):
        return None
    return record if isinstance(record, dict) else None


__all__ = ["append_record", "read_records"]
