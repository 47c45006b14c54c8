"""Quality per wall clock: every implementation trained for the same seconds on PG-19 books (bytes), then its
validation bits per byte — what a user with a fixed time budget gets — in fp32 and under bf16 autocast, over seeds.

    python -m benchmarks.quality --budget 600 --seeds 0,1,2                           # ours and the peers, fp32 + bf16
    python -m benchmarks.quality --impl ours --precisions fp32 --budget 5 --seeds 0 --out /tmp/q   # smoke run

Each run is one child process (``child.py --phase quality``): the workload's model (vocabulary 256: bytes; same
widths, lengths, batch, optimizer, no dropout), seeded, trains on ``--threads`` threads until ``--budget`` seconds of
wall clock have passed, then reads the first ``--val-segments`` segments of each validation stream with memory
carried. One JSON per run in ``<out>/quality/`` (``<impl>@<precision>-seed<k>.json``); a finished run with the same
settings is reused, so an interrupted sweep resumes where it stopped. The aggregate (``quality.json``, ``quality.md``, ``quality.png``) gives
per implementation and precision the mean validation BPC over seeds with its 95% Student-t interval.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path
from typing import Any

from benchmarks.common import repo_path, under_autocast
from compressive_transformer.analysis.stats import mean_interval
from compressive_transformer.data.readers import data_root_path
from compressive_transformer.runs.provenance import code_state

HERE = Path(__file__).resolve().parent

PRECISIONS = {"fp32": "none", "bf16": "bf16"}  # precision label -> child.py --amp
# where `compressive-transformer data download pg19 data` puts PG-19 (or $CT_DATA_ROOT/pg19 when that is set)
DEFAULT_DATA = HERE.parent / data_root_path("data/pg19")
DEFAULT_IMPLS = ("ours", "lucidrains", "lucidrains_fixed", "labml")
CURVE_POINTS = 200  # training losses kept per run (evenly spaced over its steps)


# ----------------------------------------------------------------------------------------------------------------
# one run (inside the child)


def byte_stream(data: Path, split: str):
    """The split's books (sorted by file name) as one uint8 tensor of their UTF-8 bytes, books back to back."""
    import torch

    files = sorted((data / split).glob("*.txt"))
    if not files:
        raise SystemExit(f"--data: no {split}/*.txt books under {data}; point it at a PG-19-layout directory")
    raw = b"".join(f.read_bytes() for f in files)
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8)


def row_segments(stream, *, batch: int, seg_len: int, starts: list[int]):
    """An endless iterator of (inputs, targets) (batch, seg_len) int64: row r reads the stream from ``starts[r]``
    onwards, contiguous from segment to segment (memory is meaningful), wrapping round at the end."""
    import torch

    n, base = stream.numel(), torch.tensor(starts)[:, None] + torch.arange(seg_len + 1)  # (batch, seg_len + 1)
    offset = 0
    while True:
        rows = stream[(base + offset) % n].long()
        yield rows[:, :-1].contiguous(), rows[:, 1:].contiguous()
        offset += seg_len


def run_quality(
    impl, w, *, data: Path, seed: int, budget_s: float, val_segments: int, device: str = "cpu", amp: str = "none"
) -> dict[str, Any]:
    """Train ``impl`` on the train books for ``budget_s`` seconds (the clock includes every step, warm-up and
    allocation included, since a user waits for them too), then its mean validation loss in bits per byte."""
    import torch

    train, val = byte_stream(data, "train"), byte_stream(data, "validation")
    gen = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, train.numel(), (w.batch,), generator=gen).tolist()  # the data order is the seed's too
    batches = row_segments(train, batch=w.batch, seg_len=w.seg_len, starts=starts)
    step = under_autocast(impl.train_step, device, amp)
    impl.reset()
    losses: list[float] = []
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < budget_s:
        x, y = next(batches)
        losses.append(step(impl.prepare(x.to(device), y.to(device))))
    train_s = time.perf_counter() - t0
    if not losses or not all(math.isfinite(v) for v in losses[-10:]):
        raise SystemExit(f"training diverged or made no step in {budget_s} s (last loss {losses[-1:] or None})")

    per_row = val.numel() // w.batch
    n_val = per_row // w.seg_len if val_segments <= 0 else min(val_segments, per_row // w.seg_len)
    val_batches = row_segments(val, batch=w.batch, seg_len=w.seg_len, starts=[r * per_row for r in range(w.batch)])
    evaluate = under_autocast(impl.eval_step, device, amp)
    impl.reset()
    t1 = time.perf_counter()
    val_losses = [
        evaluate(impl.prepare(x.to(device), y.to(device))) for x, y in (next(val_batches) for _ in range(n_val))
    ]
    val_loss = sum(val_losses) / len(val_losses)  # equal-sized segments: the mean of the means is the mean
    every = max(1, len(losses) // CURVE_POINTS)
    return {
        "seed": seed,
        "budget_s": budget_s,
        "train_s": train_s,
        "steps": len(losses),
        "tokens_trained": len(losses) * w.batch * w.seg_len,
        "last_train_loss": losses[-1],
        "val_loss": val_loss,
        "val_bpc": val_loss / math.log(2),
        "val_tokens": n_val * w.batch * w.seg_len,
        "val_s": time.perf_counter() - t1,
        "curve": {"step": list(range(1, len(losses) + 1, every)), "loss": losses[::every]},
    }


# ----------------------------------------------------------------------------------------------------------------
# the sweep (the parent)


def run_key(impl: str, precision: str, seed: int) -> str:
    return f"{impl}@{precision}-seed{seed}"


def settings(a: argparse.Namespace) -> dict[str, Any]:
    """What decides a run's result besides implementation, precision and seed: a stored run is reused only if these
    match."""
    return {
        "workload": a.workload,
        "budget_s": a.budget,
        "threads": a.threads,
        "val_segments": a.val_segments,
        "data": repo_path(a.data),
    }


def run_one(a: argparse.Namespace, impl: str, precision: str, seed: int, path: Path) -> dict[str, Any]:
    from benchmarks.bench import child, python_for

    extra = (
        "--amp",
        PRECISIONS[precision],
        "--seed",
        str(seed),
        "--budget",
        str(a.budget),
        "--data",
        str(a.data),
        "--val-segments",
        str(a.val_segments),
    )
    timeout = int(a.budget * 3 + 1800)
    r = child(python_for(impl, a), impl, "quality", a.workload, a, timeout=timeout, extra=extra)
    record = {"impl": impl, "precision": precision, "seed": seed, "settings": settings(a), **r}
    if "error" not in r:  # failed runs are reported but not kept, so the next sweep tries them again
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(record, indent=1))
        tmp.replace(path)
    return record


def aggregate(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Per ``impl@precision``: validation BPC and steps per run over seeds, mean with its 95% interval."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        if "val_bpc" in r:
            groups.setdefault(f"{r['impl']}@{r['precision']}", []).append(r)
    out = {}
    for key, rs in groups.items():
        rs.sort(key=lambda r: r["seed"])
        out[key] = {
            "impl": rs[0]["impl"],
            "precision": rs[0]["precision"],
            "seeds": [r["seed"] for r in rs],
            "val_bpc": mean_interval([r["val_bpc"] for r in rs]).to_dict(),
            "steps": mean_interval([r["steps"] for r in rs]).to_dict(),
            "per_seed_val_bpc": {str(r["seed"]): r["val_bpc"] for r in rs},
        }
    return out


def markdown(summary: dict[str, Any], records: list[dict[str, Any]], meta: dict[str, Any]) -> list[str]:
    def iv(d: dict[str, Any], digits: int) -> str:
        if d["half_width"] is None:
            return f"{d['mean']:.{digits}f}"
        return f"{d['mean']:.{digits}f} ± {d['half_width']:.{digits}f}"

    lines = [
        f"### Validation BPC after {meta['budget_s']:g} s of training — workload `{meta['workload']}`, PG-19 sample (bytes)",
        "",
        (
            f"Machine: {meta['machine']['cpu']}, bf16 instructions: {', '.join(meta['machine']['bf16_flags']) or 'none'}; "
            f"{meta['threads']} threads; validation: the first {meta['val_segments']} segments of each of the workload's "
            "streams. Mean over seeds ± the 95% Student-t half-width."
        ),
        "",
        "| impl | precision | seeds | validation BPC | steps in the budget | per seed |",
        "|---|---|---|---|---|---|",
    ]
    for _key, s in sorted(summary.items(), key=lambda kv: kv[1]["val_bpc"]["mean"]):
        per_seed = ", ".join(f"{v:.3f}" for v in s["per_seed_val_bpc"].values())
        lines.append(
            f"| {s['impl']} | {s['precision']} | {len(s['seeds'])} | {iv(s['val_bpc'], 3)} | {iv(s['steps'], 0)} | {per_seed} |"
        )
    errors = [r for r in records if "error" in r]
    if errors:
        lines += ["", "Runs that failed (tried again on the next sweep):"]
        lines += [f"- `{run_key(r['impl'], r['precision'], r['seed'])}`: {r['error']}" for r in errors]
    return lines + [""]


def plot(summary: dict[str, Any], records: list[dict[str, Any]], path: Path) -> Path:
    """Left: each run's training loss against its steps; right: validation BPC per implementation and precision."""
    from compressive_transformer.analysis.plots import save_figure, subplots

    fig, (left, right) = subplots(1, 2, figsize=(11, 4))
    keys = sorted(summary)
    for i, key in enumerate(keys):
        for r in (r for r in records if f"{r.get('impl')}@{r.get('precision')}" == key and "curve" in r):
            left.plot(
                r["curve"]["step"],
                [v / math.log(2) for v in r["curve"]["loss"]],
                color=f"C{i}",
                alpha=0.6,
                label=key if r["seed"] == summary[key]["seeds"][0] else None,
            )
    left.set_xlabel("step")
    left.set_ylabel("training loss (bits per byte)")
    left.grid(alpha=0.3)
    left.legend(fontsize=7)
    means = [summary[k]["val_bpc"]["mean"] for k in keys]
    errs = [summary[k]["val_bpc"]["half_width"] or 0.0 for k in keys]
    right.bar(range(len(keys)), means, yerr=errs, color=[f"C{i}" for i in range(len(keys))], capsize=4)
    right.set_xticks(range(len(keys)), keys, rotation=30, ha="right", fontsize=8)
    right.set_ylabel("validation BPC (95% interval)")
    right.set_ylim(min(means) * 0.9 if means else 0, max(means) * 1.05 if means else 1)
    right.grid(alpha=0.3, axis="y")
    fig.suptitle("quality per wall clock: same training time, PG-19 sample")
    return save_figure(fig, path)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--workload", default="reference", help="a workload of benchmarks/workloads.py (model shape, batch, lr)"
    )
    ap.add_argument("--impl", default=",".join(DEFAULT_IMPLS), help="comma-separated implementations")
    ap.add_argument("--precisions", default="fp32,bf16", help="comma-separated: fp32 and/or bf16")
    ap.add_argument("--seeds", default="0,1,2", help="comma-separated seeds (at least 3 for an interval worth reading)")
    ap.add_argument("--budget", type=float, default=600.0, help="seconds of training per run (wall clock)")
    ap.add_argument("--val-segments", type=int, default=256, help="validation segments per stream (0: the whole split)")
    ap.add_argument("--data", default=str(DEFAULT_DATA), help="PG-19-layout directory: train/ and validation/ of .txt")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=str(HERE / "results"))
    ap.add_argument(
        "--python", default=None, help="interpreter for the children (default: benchmarks/.venv-peers if present)"
    )
    a = ap.parse_args(argv)
    a.steps = a.warmup = None  # bench.child's optional step counts: a quality run is bounded by its budget instead

    from benchmarks import workloads
    from benchmarks.bench import ALL, peers_available

    workloads.get(a.workload)  # an unknown name stops here, with the choices
    impls = [s.strip() for s in a.impl.split(",") if s.strip()]
    precisions = [s.strip() for s in a.precisions.split(",") if s.strip()]
    bad = [i for i in impls if i not in ALL] + [p for p in precisions if p not in PRECISIONS]
    if bad:
        raise SystemExit(f"unknown {bad[0]!r}; implementations: {', '.join(ALL)}; precisions: {', '.join(PRECISIONS)}")
    if not Path(a.data).is_dir():
        raise SystemExit(f"--data: {a.data} is not a directory; point it at the PG-19 sample (train/, validation/)")
    missing = [i for i in impls if not peers_available(i, a)]
    if missing:
        print(f"[quality] skipping {', '.join(missing)}: not installed (run benchmarks/setup_peers.sh)", flush=True)
        impls = [i for i in impls if i not in missing]
    seeds = [int(s) for s in a.seeds.split(",") if s.strip()]
    root = Path(a.out) / "quality"
    records = []
    for seed in seeds:  # seed-major: a sweep cut short still has every implementation at the first seeds
        for precision in precisions:
            for impl in impls:
                path = root / f"{run_key(impl, precision, seed)}.json"
                if path.exists():
                    old = json.loads(path.read_text())
                    if old.get("settings") == settings(a) and "val_bpc" in old:
                        records.append(old)
                        print(f"[quality] {path.stem}: reused, val BPC {old['val_bpc']:.4f}", flush=True)
                        continue
                r = run_one(a, impl, precision, seed, path)
                records.append(r)
                got = (
                    f"val BPC {r['val_bpc']:.4f} after {r['steps']} steps" if "val_bpc" in r else f"ERROR {r['error']}"
                )
                print(f"[quality] {path.stem}: {got}", flush=True)
    from benchmarks.bench import machine_info

    summary = aggregate(records)
    meta = {**settings(a), "machine": machine_info(), "code": code_state(), "threads": a.threads}
    result = {
        "meta": meta,
        "summary": summary,
        "runs": [run_key(r["impl"], r["precision"], r["seed"]) for r in records],
    }
    lines = markdown(summary, records, meta)
    workloads.write_report(root.parent, "quality", result, lines)
    if summary:
        plot(summary, records, root.parent / "quality.png")


if __name__ == "__main__":
    main()
