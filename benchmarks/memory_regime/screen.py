"""Stage-1 screen on a fixed slice of the validation split: a trained run evaluated at several memory lengths.

    OMP_NUM_THREADS=1 python -m benchmarks.memory_regime.screen RUN_DIR [RUN_DIR ...]   # memories n_m, n_m/2, /4, /8
    OMP_NUM_THREADS=1 python -m benchmarks.memory_regime.screen --spec benchmarks/memory_regime/stage1.toml \
        --variants pg19-s64-1M,python-s32-250K        # train those cells first (resumable), then screen them

The study runner measures whole documents, one stream per document; on a single-document split (enwik8) that is
one stream of 200K bytes, which took 2-9 min per memory length on the shared machine. The screen reads the same
validation text as ``--rows`` parallel streams (a single document is cut into that many contiguous pieces, memory
reset at each piece start, as the trainer streams it) for the first ``--segments`` segments of each, so every
memory length is scored on the same bytes and the costs of a cut are paired. Writes one JSON per run beside this
file (``screen/RUN.json``) with bits per byte and the loss by lookback per memory length.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

from compressive_transformer.analysis.frequency import token_nll, token_words
from compressive_transformer.analysis.recurrence import loss_by_lookback
from compressive_transformer.core.fileio import write_text_atomic
from compressive_transformer.data import read_documents
from compressive_transformer.runs.machine import machine_info
from compressive_transformer.runs.metrics import read_metrics
from compressive_transformer.runs.provenance import code_state
from compressive_transformer.runs.rundir import load_model, open_run

HERE = Path(__file__).resolve().parent
EDGES = (16, 32, 64, 128, 256, 1024)


def screen(run_dir: Path, mems: list[int], *, rows: int, segments: int, split: str) -> dict:
    cfg, tokenizer = open_run(run_dir)
    mems = mems or [cfg.model.memory.mem_len // k for k in (1, 2, 4, 8)]
    model = load_model(run_dir, cfg)
    tw = token_words(tokenizer, read_documents(cfg.data, split))
    out = {"run": run_dir.name if run_dir.name != "seed-0" else run_dir.parent.name, "split": split}
    out |= {"rows": rows, "segments": segments, "seg_len": cfg.model.seg_len, "train_mem_len": cfg.model.memory.mem_len}
    records = read_metrics(run_dir)
    out |= {
        "format": cfg.data.format,
        "d_model": cfg.model.d_model,
        "updates": cfg.train.steps,
        "train_tokens": max((int(r["tokens"]) for r in records if "tokens" in r), default=0),
        "train_tokens_per_s": float(np.median([r["tokens_per_s"] for r in records if "tokens_per_s" in r])),
    }
    results = {}
    for mem in mems:
        t0 = time.perf_counter()
        nll = token_nll(model, tw, batch_size=rows, mem_len=mem, cmem_len=0, max_segments=segments)
        ok = ~np.isnan(nll)
        results[str(mem)] = {
            "predicted_bytes": int(ok.sum()),
            "bits_per_byte": float(nll[ok].sum() / ok.sum() / np.log(2)),
            "lookback": loss_by_lookback(tw, nll, seg_len=cfg.model.seg_len, edges=EDGES),
            "seconds": time.perf_counter() - t0,
        }
        print(
            f"{out['run']} mem {mem}: {results[str(mem)]['bits_per_byte']:.4f} bits/byte ({results[str(mem)]['seconds']:.0f} s)"
        )
    out["memories"] = results
    out["machine"] = machine_info()
    out["code"] = code_state()
    return out


def train_variants(spec: Path, names: list[str]) -> list[Path]:
    """Train (or resume) the named variants of a study spec into its run directories, seed 0, without the study's
    whole-split measurement; returns their run directories."""
    from compressive_transformer.experiments.study import load_study, study_jobs
    from compressive_transformer.training.workflows import train_run

    study = load_study(spec)
    jobs = {j.variant: j for j in study_jobs(study, spec.with_suffix(""), threads=1, progress=False) if j.seed == 0}
    unknown = [n for n in names if n not in jobs]
    if unknown:
        raise SystemExit(f"--variants: {unknown[0]} is not a variant of {spec}; use one of {', '.join(jobs)}")
    for name in names:
        job = jobs[name]
        train_run(job.config, job.run_dir, resume=(job.run_dir / "config.toml").is_file(), log=print)
    return [jobs[n].run_dir for n in names]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="*", type=Path)
    parser.add_argument("--spec", type=Path, help="study spec whose --variants to train first (seed 0)")
    parser.add_argument("--variants", default="", help="comma-separated variants of --spec")
    parser.add_argument("--mems", default="", help="memory lengths, e.g. 256,128 (default: n_m, n_m/2, /4, /8)")
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--segments", type=int, default=100)
    parser.add_argument("--split", default="validation")
    args = parser.parse_args()
    torch.set_num_threads(1)
    runs = list(args.runs)
    if args.spec:
        runs += train_variants(args.spec, [v for v in args.variants.split(",") if v])
    for run in runs:
        result = screen(
            run, [int(m) for m in args.mems.split(",") if m], rows=args.rows, segments=args.segments, split=args.split
        )
        write_text_atomic(HERE / "screen" / f"{result['run']}.json", json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
