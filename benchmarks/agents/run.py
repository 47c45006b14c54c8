"""The agent experiment: success rate against environment steps for LSTM, Transformer-XL and the Compressive
Transformer at c = 4 and c = 1 on "select nonmatching object", several seeds, intervals, one plot.

    python -m benchmarks.agents.run benchmarks/agents/pilot.toml [--out DIR] [--parallel N] [--report-only]

Runs go seed by seed (every model of seed 0 first), one thread each, and resume: a finished run is skipped, a run
with a checkpoint continues from it (to the spec's steps, should they have grown). Whatever has finished is summarized into results.json, results.md and
success.png after every run.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from compressive_transformer.agents.config import load_rl_config
from compressive_transformer.agents.report import plot_success, summarize
from compressive_transformer.agents.train import train_agent
from compressive_transformer.core.config import load_toml
from compressive_transformer.core.fileio import write_text_atomic
from compressive_transformer.runs.checkpoint import latest_checkpoint
from compressive_transformer.runs.machine import machine_info
from compressive_transformer.runs.metrics import read_metrics


def _overrides(spec: dict[str, Any], model: str, seed: int) -> list[str]:
    return [*spec["models"][model]["overrides"], f"train.seed={seed}", f"train.env_steps={spec['env_steps']}"]


def _done(run_dir: Path, steps: int) -> bool:
    records = read_metrics(run_dir) if (run_dir / "metrics.jsonl").is_file() else []
    return bool(records) and records[-1]["env_steps"] >= steps


def run_one(spec: dict[str, Any], model: str, seed: int, run_dir: Path) -> float:
    """Train (or finish) one run; returns its wall-clock seconds in this call."""
    start = time.perf_counter()
    if not _done(run_dir, spec["env_steps"]):
        cfg = load_rl_config(spec["config"], _overrides(spec, model, seed))
        resume = latest_checkpoint(run_dir) is not None
        train_agent(cfg, run_dir, resume=resume, progress=False)  # a resumed run may be extended to more steps
    return time.perf_counter() - start


def report(spec: dict[str, Any], out: Path, spec_path: Path) -> dict[str, Any]:
    runs = {m: {s: out / "runs" / f"{m}-seed{s}" for s in spec["seeds"]} for m in spec["models"]}
    summary = summarize(
        runs, total_steps=spec["env_steps"], bin_steps=spec["bin_steps"], final_fraction=spec["final_fraction"]
    )
    result = {
        "spec": str(spec_path),
        "command": f"python -m benchmarks.agents.run {spec_path}",
        "machine": machine_info() | {"torch_threads": load_rl_config(spec["config"]).train.threads},  # per run
        "env_steps": spec["env_steps"],
        "models": summary,
    }
    write_text_atomic(out / "results.json", json.dumps(result, indent=1))
    lines = [
        f"# Agent experiment: {spec_path.name}",
        "",
        f"`{result['command']}`; {spec['env_steps']} environment steps per run; final success = episodes ending in "
        f"the last {spec['final_fraction']:.0%} of the steps; mean ± 95% t-interval over seeds.",
        "",
        "| model | seeds | final success | per seed |",
        "| --- | --- | --- | --- |",
    ]
    for model, s in summary.items():
        per_seed = ", ".join(f"{v:.3f}" for v in s["final_by_seed"].values())
        final = s["final"]
        value = (
            "-"
            if final["n"] == 0
            else f"{final['mean']:.3f}" + (f" ± {final['half_width']:.3f}" if final["half_width"] is not None else "")
        )
        lines.append(f"| {model} | {len(s['seeds'])} | {value} | {per_seed} |")
    write_text_atomic(out / "results.md", "\n".join(lines) + "\n")
    if any(s["seeds"] for s in summary.values()):
        plot_success(summary, out / "success.png", title=f"select nonmatching object ({spec_path.stem})")
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("spec", type=Path)
    p.add_argument("--out", type=Path, help="default: the spec's folder / the spec's name")
    p.add_argument("--parallel", type=int, default=1, help="runs at a time (one thread each)")
    p.add_argument("--report-only", action="store_true", help="summarize what has finished, train nothing")
    args = p.parse_args(argv)
    spec = load_toml(args.spec)
    out = args.out or args.spec.parent / args.spec.stem
    jobs = [(m, s) for s in spec["seeds"] for m in spec["models"]]
    if not args.report_only:
        with ProcessPoolExecutor(max_workers=args.parallel) as pool:
            futures = {(m, s): pool.submit(run_one, spec, m, s, out / "runs" / f"{m}-seed{s}") for m, s in jobs}
            for (m, s), f in futures.items():
                seconds = f.result()
                print(f"{m} seed {s}: {seconds:.0f} s", flush=True)
                report(spec, out, args.spec)
    result = report(spec, out, args.spec)
    for model, s in result["models"].items():
        f = s["final"]
        print(f"{model}: final success {f['mean']} ± {f['half_width']} over {f['n']} seeds")
    return 0


if __name__ == "__main__":
    sys.exit(main())
