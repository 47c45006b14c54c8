"""What a user keeps of an agent run: its final weights and its best window's (``<run>/best``), each played on the
same fresh episodes (``rl evaluate``: 200 episodes, seeded apart from training), judged by the rule of
``README.md``, "The best policy kept".

    python -m benchmarks.agents.kept benchmarks/agents/kept [--episodes 200]

Writes ``kept.json`` and ``kept.md`` beside the study's results: per run, the window that made the best policy, both
evaluations, and whether the run ever solved (windowed success >= 0.9); then the paired comparison (runs whose kept
policy is solved, >= 0.9 on the fresh episodes, against those whose final policy is) by a one-sided exact test of
the discordant pairs, and the best window's optimism (its windowed success minus its evaluation) with a 95% t
interval. Runs not finished are left out. ``kept.json`` records the code commit and the machine that played them.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from scipy.stats import binomtest

from benchmarks.agents.run import run_records
from compressive_transformer.agents.best import read_best
from compressive_transformer.agents.config import EVAL_SEED
from compressive_transformer.agents.evaluate import evaluate_agent
from compressive_transformer.agents.report import SOLVED, read_run_metrics, stability
from compressive_transformer.analysis.stats import mean_interval
from compressive_transformer.core.config import load_toml
from compressive_transformer.core.fileio import write_text_atomic
from compressive_transformer.runs.provenance import code_label, mixed_lines, report_provenance


def finished_runs(folder: Path, spec: dict[str, Any]) -> dict[str, Path]:
    """``MODEL-seedN`` -> run directory, for every run of the spec that trained all its steps."""
    out = {}
    for model in spec["models"]:
        for seed in spec["seeds"]:
            run = folder / "runs" / f"{model}-seed{seed}"
            records = read_run_metrics(run) if run.is_dir() else []
            if records and records[-1]["env_steps"] >= spec["env_steps"]:
                out[f"{model}-seed{seed}"] = run
    return out


def judge_run(run: Path, episodes: int) -> dict[str, Any]:
    best = read_best(run)
    assert best is not None, f"{run} kept no best policy"
    final = evaluate_agent(run, episodes=episodes, log=lambda _: None)
    kept = evaluate_agent(run, best=True, episodes=episodes, log=lambda _: None)
    return {
        "solved": stability(read_run_metrics(run))["solved_at"] is not None,
        "best_window": {"step": best.step, "env_steps": best.env_steps, "success_rate": best.success_rate},
        "final": {"step": final.step, "success_rate": final.success_rate, "interval": list(final.interval)},
        "kept": {"step": kept.step, "success_rate": kept.success_rate, "interval": list(kept.interval)},
        "episodes": final.episodes,
    }


def decide(runs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    held = lambda r, which: r[which]["success_rate"] >= SOLVED  # noqa: E731
    only_kept = sum(held(r, "kept") and not held(r, "final") for r in runs.values())
    only_final = sum(held(r, "final") and not held(r, "kept") for r in runs.values())
    discordant = only_kept + only_final
    p = binomtest(only_kept, discordant, alternative="greater").pvalue if discordant else 1.0
    solved = [name for name, r in runs.items() if r["solved"]]
    optimism = mean_interval([r["best_window"]["success_rate"] - r["kept"]["success_rate"] for r in runs.values()])
    return {
        "runs": len(runs),
        "kept_solved": sum(held(r, "kept") for r in runs.values()),
        "final_solved": sum(held(r, "final") for r in runs.values()),
        "only_kept": only_kept,
        "only_final": only_final,
        "p_kept_more": p,
        "solved_runs": len(solved),
        "solved_runs_kept_below": sorted(n for n in solved if not held(runs[n], "kept")),
        "optimism": {"mean": optimism.mean, "half_width": optimism.half_width} if optimism.n > 1 else None,
    }


def markdown(result: dict[str, Any]) -> str:
    d = result["decision"]
    episodes = next(iter(result["runs"].values()))["episodes"]
    lines = [
        f"# The best policy kept: {result['spec']}",
        "",
        f"`{result['command']}`; {episodes} fresh episodes per policy ({result['episodes']} asked, rounded up to a "
        f"multiple of the environments; seed {result['seed']}). Machine: {result['machine']['cpu']}, "
        f"{result['machine']['cores']} cores (flags in kept.json).",
        "",
        "| run | solved | best window (steps, windowed success) | best: evaluated | final: evaluated |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name, r in result["runs"].items():
        w, k, f = r["best_window"], r["kept"], r["final"]
        lines.append(
            f"| {name} | {'yes' if r['solved'] else 'no'} | {w['env_steps']:,}, {w['success_rate']:.3f} | "
            f"{k['success_rate']:.3f} [{k['interval'][0]:.3f}, {k['interval'][1]:.3f}] | "
            f"{f['success_rate']:.3f} [{f['interval'][0]:.3f}, {f['interval'][1]:.3f}] |"
        )
    lines += [
        "",
        f"Solved (>= {SOLVED} on the fresh episodes): the kept policy in {d['kept_solved']} of {d['runs']} runs, "
        f"the final one in {d['final_solved']}; discordant pairs {d['only_kept']} (kept only) and {d['only_final']} "
        f"(final only), one-sided exact p = {d['p_kept_more']:.2g}. Runs that ever solved: {d['solved_runs']}; "
        f"of those, kept policies below {SOLVED}: {', '.join(d['solved_runs_kept_below']) or 'none'}.",
    ]
    made = result.get("runs_provenance") or {}
    lines += ["", *mixed_lines(made)] if made else []
    lines.append(f"These evaluations: code {code_label(result.get('code'))}.")
    if d["optimism"]:
        o = d["optimism"]
        lines.append(
            f"The best window's windowed success minus its evaluation: {o['mean']:+.3f} ± {o['half_width']:.3f} "
            "(95% t interval over runs)."
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folder", type=Path, help="the study's output folder (its spec is FOLDER.toml)")
    p.add_argument("--episodes", type=int, default=200)
    args = p.parse_args(argv)
    spec = load_toml(args.folder.with_suffix(".toml"))
    runs = {name: judge_run(run, args.episodes) for name, run in finished_runs(args.folder, spec).items()}
    result = {
        "spec": str(args.folder.with_suffix(".toml")),
        "command": "python -m benchmarks.agents.kept " + " ".join(argv if argv is not None else sys.argv[1:]),
        "episodes": args.episodes,
        "seed": EVAL_SEED,
        **report_provenance(exclude=[args.folder]),  # the code and machine that played the episodes
        "runs": runs,
        # what trained each run (its last training call's record; None for runs trained before the records)
        "runs_provenance": {
            name: (run_records(run) or [None])[-1] for name, run in finished_runs(args.folder, spec).items()
        },
        "decision": decide(runs) if runs else None,
    }
    write_text_atomic(args.folder / "kept.json", json.dumps(result, indent=1) + "\n")
    if runs:
        write_text_atomic(args.folder / "kept.md", markdown(result))
        print(markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
