"""What made a result: the code (its git commit, and whether the tree had changes), the data (per split: its files,
their sizes and a content hash; for generated data, the generator and its version) and the machine
(:mod:`.machine`). Every study runner records these per run, and a report records its own code and machine apart
from the runs', so rebuilding a report never rewrites where the runs ran; :func:`mixed_lines` says, run by run,
where a study's runs were made by different code or data."""

from __future__ import annotations

import hashlib
import json
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any, Iterable, Mapping

from compressive_transformer.core.config import ConfigError, DataConfig
from compressive_transformer.data.readers import source_files
from compressive_transformer.runs.machine import machine_info

BLOCK = 1 << 20  # bytes read at a time: hashing a corpus of many GB holds one block in memory
GENERATOR_FILE = "generator.json"  # written beside generated data by its generator (e.g. scripts/synth_speech.py)
PACKAGE_ROOT = Path(__file__).resolve().parents[1]  # the compressive_transformer package: its git tree is the code's
GIT_SECONDS = 30
MAX_FILES_LISTED = 100  # files listed per split in a record (a result file stays small; the hash covers them all)


def _git(root: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(root), *args], capture_output=True, text=True, timeout=GIT_SECONDS, check=True
    )
    return done.stdout


def code_state(root: Path | None = None, *, exclude: Iterable[Path] = ()) -> dict[str, Any]:
    """The commit of the git tree holding ``root`` (default: this package's source) and whether tracked files differ
    from it or files under ``root`` are new (``dirty``, with up to 20 of the changed paths). ``exclude``: paths whose changes do not count (a study's
    own output folder, which it rewrites as it runs). Without git or outside a tree, ``commit`` and ``dirty`` are
    None and ``why`` says why; the installed package's version is recorded either way."""
    root = Path(root) if root is not None else PACKAGE_ROOT
    state: dict[str, Any] = {"commit": None, "dirty": None, "changed": [], "package_version": _package_version()}
    try:
        top = Path(_git(root, "rev-parse", "--show-toplevel").strip())
        state["commit"] = _git(root, "rev-parse", "HEAD").strip()
        skip = [f":(top,exclude){Path(p).resolve().relative_to(top)}" for p in exclude if _inside(Path(p), top)]
        status = _git(top, "status", "--porcelain", "--untracked-files=no", "--", ".", *skip)
        status += _git(root, "status", "--porcelain", "--untracked-files=all", "--", ".", *skip)  # new code files
    except FileNotFoundError:
        return state | {"why": "git is not installed"}
    except subprocess.CalledProcessError as e:
        why = (e.stderr or "").strip().splitlines()
        return state | {"commit": None, "why": f"no git commit at {root}: {why[0] if why else 'git failed'}"}
    except (OSError, subprocess.TimeoutExpired) as e:
        return state | {"commit": None, "why": f"git could not be read: {e}"}
    changed = list(dict.fromkeys(line[3:] for line in status.splitlines() if line.strip()))
    return state | {"dirty": bool(changed), "changed": changed[:20], "why": None}


def _inside(path: Path, top: Path) -> bool:
    try:
        path.resolve().relative_to(top)
    except ValueError:
        return False
    return True


def _package_version() -> str | None:
    try:
        return metadata.version("compressive-transformer")
    except metadata.PackageNotFoundError:
        return None


def file_hash(path: Path, _seen: dict[tuple[str, int, int], str] | None = None) -> str:
    """sha256 of a file's contents, read in blocks of :data:`BLOCK` bytes."""
    st = path.stat()
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
    if _seen is not None and key in _seen:
        return _seen[key]
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(BLOCK):
            digest.update(block)
    if _seen is not None:
        _seen[key] = digest.hexdigest()
    return digest.hexdigest()


def data_fingerprint(cfg: DataConfig, splits: Iterable[str]) -> dict[str, Any]:
    """Per split: its files (``source_files``: path, bytes, sha256; the first :data:`MAX_FILES_LISTED` listed), their
    count and total size, and one hash over all of them in order; plus the
    generator's record where the data were generated (``generator.json`` at ``data.path``)."""
    seen: dict[tuple[str, int, int], str] = {}  # a file shared by splits (a 90/5/5 split of one file) hashed once
    out: dict[str, Any] = {"format": cfg.format, "path": cfg.path, "splits": {}}
    for split in dict.fromkeys(splits):
        try:
            files = [Path(f) for f in source_files(cfg, split)]
            rows = [{"path": str(f), "bytes": f.stat().st_size, "sha256": file_hash(f, seen)} for f in files]
        except (ConfigError, OSError) as e:  # a split the corpus lacks: said, not fatal (nothing read it)
            out["splits"][split] = {"unavailable": str(e)}
            continue
        combined = hashlib.sha256("\n".join(f"{r['bytes']} {r['sha256']}" for r in rows).encode()).hexdigest()
        out["splits"][split] = {
            "files": rows[:MAX_FILES_LISTED],  # the combined hash covers every file
            "file_count": len(rows),
            "bytes": sum(r["bytes"] for r in rows),
            "sha256": combined,
        }
    out["generator"] = read_generator(Path(cfg.path))
    return out


def read_generator(path: Path) -> dict[str, Any] | None:
    """The generator record of generated data (``generator.json`` in ``path`` or the folder holding it), or None."""
    for folder in (path, path.parent) if path.suffix else (path,):
        record = folder / GENERATOR_FILE
        if record.is_file():
            try:
                return json.loads(record.read_text(encoding="utf-8"))
            except (OSError, ValueError) as e:
                return {"unreadable": f"{record}: {e}"}
    return None


def run_provenance(
    code: Mapping[str, Any], data: Mapping[str, Any] | None, machine: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """One run's record: the code and data that made it and the machine it ran on (this one by default)."""
    return {
        "code": dict(code),
        "data": None if data is None else dict(data),
        "machine": dict(machine or machine_info()),
    }


def generated(generator: str, settings: Mapping[str, Any]) -> dict[str, Any]:
    """The data record of data generated by this package (a task, an environment): the generator's module and its
    settings; its version is the code's commit, recorded beside it."""
    return {"generator": {"generator": generator, "settings": dict(settings)}}


def report_provenance(exclude: Iterable[Path] = ()) -> dict[str, Any]:
    """What made a report (not its runs): this code and this machine."""
    return {"code": code_state(exclude=exclude), "machine": machine_info()}


def code_label(code: Mapping[str, Any] | None) -> str:
    """``abc1234``, ``abc1234 (dirty)``, or ``unknown (why)`` for a run without a commit or record."""
    if not code:
        return "unknown (no record)"
    if not code.get("commit"):
        return f"unknown ({code.get('why') or 'no commit'})"
    return code["commit"][:7] + (" (dirty)" if code.get("dirty") else "")


def data_label(data: Mapping[str, Any] | None) -> str:
    """The data's hashes per split, shortened (``train 1a2b3c4d, test ...``), a generator's record hashed
    (``generated 1a2b3c4d``: its name, version and options), or ``unknown``."""
    if data and data.get("splits"):
        return ", ".join(f"{s} {v['sha256'][:8]}" for s, v in data["splits"].items() if "sha256" in v)
    if data and data.get("generator"):
        return "generated " + hashlib.sha256(json.dumps(data["generator"], sort_keys=True).encode()).hexdigest()[:8]
    return "unknown (no record)"


def mixed_lines(records: Mapping[str, Mapping[str, Any] | None]) -> list[str]:
    """Markdown lines for a study's provenance: one line when every run shares its code and data, else one line
    per run naming its commit and data (``records``: run name -> its provenance record, or None)."""
    codes = {name: code_label((r or {}).get("code")) for name, r in records.items()}
    datas = {name: data_label((r or {}).get("data")) for name, r in records.items()}
    if not records:
        return []
    if len(set(codes.values())) == 1 and len(set(datas.values())) == 1:
        return [f"Provenance: every run made by code {next(iter(codes.values()))}, data {next(iter(datas.values()))}."]
    lines = [
        f"Provenance: **the runs were made by {len(set(codes.values()))} code state(s) and "
        f"{len(set(datas.values()))} data state(s)**; run by run:",
        "",
        "| run | code | data |",
        "| --- | --- | --- |",
    ]
    lines += [f"| {name} | {codes[name]} | {datas[name]} |" for name in records]
    return lines


def is_mixed(records: Mapping[str, Mapping[str, Any] | None]) -> bool:
    """Whether the runs differ in code or data (a run without a record counts as differing from those with one)."""
    codes = {code_label((r or {}).get("code")) for r in records.values()}
    datas = {data_label((r or {}).get("data")) for r in records.values()}
    return len(codes) > 1 or len(datas) > 1


__all__ = [
    "BLOCK",
    "GENERATOR_FILE",
    "code_label",
    "code_state",
    "data_fingerprint",
    "data_label",
    "file_hash",
    "generated",
    "is_mixed",
    "mixed_lines",
    "read_generator",
    "report_provenance",
    "run_provenance",
]
