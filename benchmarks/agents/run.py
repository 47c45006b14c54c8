"""The agent experiment: success rate against environment steps for LSTM, Transformer-XL and the Compressive
Transformer at c = 4 and c = 1 on "select nonmatching object", several seeds, intervals, one plot.

    python -m benchmarks.agents.run benchmarks/agents/pilot.toml [--out DIR] [--parallel N] [--report-only]
        [--check-finished]

Runs go seed by seed (every model of seed 0 first), one thread each, and resume: a finished run is skipped, a run
with a checkpoint continues from it (to the spec's steps, should they have grown). Whatever has finished is
summarized into results.json, results.md and success.png after every run.

A spec's top-level ``overrides`` apply to every arm before the arm's own (the learner a study ran with is pinned there,
so the spec keeps its meaning when the defaults change). A finished run's metrics are packed into
``metrics.jsonl.gz`` (what a study commits; the report reads it where ``metrics.jsonl`` is absent). Every arm's
windowed success is judged for stability (``agents.report.stability``: solved, drops after solving, stays solved),
and a spec's ``[[pooled]]`` comparisons (``name``, arm lists ``a`` and ``b`` paired by position and seed) decide
"a's runs stay solved more often than b's" by a one-sided Fisher exact test of the two fractions, with the drops
after solving per run compared by a one-sided exact paired sign-flip test beside it. Each arm's parameter count is
computed from its built model (the observation embedding counted, and given apart).

Training records its process CPU seconds at each checkpoint in the run's ``cpu_seconds.jsonl`` (``runs.cputime``), so a
run paused (SIGSTOP) or sharing the machine is charged only its own work. A spec's ``[[contrasts]]`` (``a``, ``b``,
optional ``shift`` added to a's values) are decided by one-sided exact permutation tests of final success over
seeds, "a above b"; the paired t-test and the paired sign-flip test are reported beside them. Where the output
folder holds ``cost.json`` (``python -m benchmarks.agents.cost``), its per-arm cost is tabled beside success.

An arm written ``[models.NAME] reuse = "STUDY"`` is the arm NAME of ``STUDY.toml`` beside this spec, with its
finished runs: its overrides are that spec's (its top-level ones, then the arm's), its runs are read from that
study's folder and never trained or written here, so a comparison against an arm that already ran costs nothing and
judges the very runs reported there. The seeds and steps must match the other study's, and its runs must be finished.

Provenance (``runs.provenance``): every training call appends to its run's ``provenance.json`` the code commit (and
whether the tree was dirty), the environment that generated the data (its settings and the packages' versions) and
the machine, with the environment steps it trained; ``results.json`` lists each run's records (``runs``) and the
distinct machines that ran them (``machines``), apart from the code and machine that made the report (``report``),
so ``--report-only`` never rewrites where the runs ran; ``results.md`` says, run by run, where the runs were made by
different code or data.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from importlib import metadata
from pathlib import Path
from typing import Any

from scipy.stats import fisher_exact

from benchmarks.agents.cost import arm_overrides, parameter_counts
from compressive_transformer.agents.config import load_rl_config
from compressive_transformer.agents.report import pack_metrics, plot_success, read_run_metrics, summarize
from compressive_transformer.agents.train import train_agent
from compressive_transformer.analysis.stats import paired_t_test, permutation_test
from compressive_transformer.core.config import load_toml
from compressive_transformer.core.fileio import write_text_atomic
from compressive_transformer.runs import cputime
from compressive_transformer.runs.checkpoint import latest_checkpoint
from compressive_transformer.runs.provenance import (
    code_label,
    code_state,
    mixed_lines,
    report_provenance,
    run_provenance,
)

MAX_SIGN_FLIP_PAIRS = 20  # 2 ** 20 sign flips, enumerated in seconds


class SpecError(ValueError):
    """A spec that cannot be run as written; the message says what to change."""


def resolve_reused(spec: dict[str, Any], spec_path: Path) -> dict[str, Any]:
    """The spec with every ``reuse`` arm replaced by the other study's arm: its full overrides and its runs' folder
    (``runs_from``), checked to have this spec's seeds and steps."""
    models = {}
    for name, arm in spec["models"].items():
        if "reuse" not in arm:
            models[name] = arm
            continue
        other_path = spec_path.parent / f"{arm['reuse']}.toml"
        if not other_path.is_file():
            raise SpecError(f"models.{name}.reuse: no study {other_path}; name a spec beside {spec_path.name}")
        other = load_toml(other_path)
        if name not in other["models"]:
            raise SpecError(
                f"models.{name}.reuse: {other_path.name} has no arm {name!r}; use one of {sorted(other['models'])}"
            )
        if other["env_steps"] != spec["env_steps"] or not set(spec["seeds"]) <= set(other["seeds"]):
            raise SpecError(
                f"models.{name}.reuse: {other_path.name} ran {other['env_steps']} steps on seeds {other['seeds']}; "
                f"this spec asks {spec['env_steps']} on {spec['seeds']}"
            )
        runs_from = other_path.parent / other_path.stem / "runs"
        models[name] = {"reuse": arm["reuse"], "overrides": arm_overrides(other, name), "runs_from": runs_from}
    return spec | {"models": models}


def arm_run_dir(spec: dict[str, Any], out: Path, model: str, seed: int) -> Path:
    """Where an arm's run for ``seed`` lives: under ``out``, or in the study it is reused from."""
    return spec["models"][model].get("runs_from", out / "runs") / f"{model}-seed{seed}"


def _overrides(spec: dict[str, Any], model: str, seed: int) -> list[str]:
    return [*arm_overrides(spec, model), f"train.seed={seed}", f"train.env_steps={spec['env_steps']}"]


def _done(run_dir: Path, steps: int) -> bool:
    records = read_run_metrics(run_dir)
    return bool(records) and records[-1]["env_steps"] >= steps


PROVENANCE = "provenance.json"  # in each run directory: one record per training call


def env_generator(cfg: Any) -> dict[str, Any]:
    """What generates an agent's data: the environment's settings and the versions of the packages that run it."""
    versions = {}
    for package in ("gymnasium", "minigrid", "torchrl"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = None
    return {
        "generator": "compressive_transformer.agents.envs",
        "env": dataclasses.asdict(cfg.env),
        "versions": versions,
    }


def run_records(run_dir: Path) -> list[dict[str, Any]]:
    """A run's provenance records, oldest first ([] for a run trained before they were kept)."""
    try:
        return json.loads((run_dir / PROVENANCE).read_text(encoding="utf-8"))["calls"]
    except (OSError, ValueError, KeyError, TypeError):
        return []


def record_call(run_dir: Path, cfg: Any, env_steps: tuple[int, int]) -> None:
    """Append this training call's code, data generator and machine to the run's ``provenance.json``."""
    code = code_state(exclude=[run_dir.parents[1]])  # the study's own folder (its reports) does not count as dirty
    call = run_provenance(code, {"generator": env_generator(cfg)}) | {"env_steps": list(env_steps)}
    calls = [*run_records(run_dir), call]
    write_text_atomic(run_dir / PROVENANCE, json.dumps({"calls": calls}, indent=1) + "\n")


def run_one(spec: dict[str, Any], model: str, seed: int, run_dir: Path) -> float:
    """Train (or finish) one run; returns its wall-clock seconds in this call."""
    start = time.perf_counter()
    if not _done(run_dir, spec["env_steps"]):
        cfg = load_rl_config(spec["config"], _overrides(spec, model, seed))
        ckpt = latest_checkpoint(run_dir)
        records = read_run_metrics(run_dir) if ckpt is not None else []
        before = records[-1]["env_steps"] if records else 0
        train_agent(cfg, run_dir, resume=ckpt is not None, progress=False)  # may extend a run; records its CPU time
        after = read_run_metrics(run_dir)
        record_call(run_dir, cfg, (before, after[-1]["env_steps"] if after else before))
    if (run_dir / "metrics.jsonl").is_file():
        pack_metrics(run_dir)
    return time.perf_counter() - start


def train_cpu(run_dir: Path) -> float | None:
    """The run's training CPU seconds, where every update it logged was counted (None for runs before the record)."""
    total = cputime.total(run_dir)
    records = read_run_metrics(run_dir)
    updates = records[-1]["step"] if records else 0
    return total["seconds"] if total and updates and total["steps"] >= updates else None


METRICS = ("final_quarter", "windowed", "solve_speed")


def metric_by_seed(s: dict[str, Any], metric: str, total_steps: int) -> dict[int, float]:
    """One arm's per-seed values of ``metric``: "final_quarter", the success of the episodes in the run's last
    ``final_fraction``; "windowed", the windowed success (last 200 episodes) at the end; "solve_speed", minus the
    millions of steps to the first windowed success >= 0.9 (a run that never solves counts as solving at the end), so
    that "a above b" reads "a solves sooner"."""
    if metric == "final_quarter":
        return {int(k): v for k, v in s["final_by_seed"].items()}
    st = {int(k): v for k, v in s["stability_by_seed"].items()}
    if metric == "windowed":
        return {k: v["final"] for k, v in st.items()}
    return {k: -(total_steps if v["solved_at"] is None else v["solved_at"]) / 1e6 for k, v in st.items()}


def contrast(
    summary: dict[str, Any], c: dict[str, Any], metric: str = "final_quarter", total: int = 0
) -> dict[str, Any]:
    """One "a above b" decision on ``c``'s metric (else ``metric``; :func:`metric_by_seed`): the exact permutation
    test's one-sided p, and beside it the paired t-test's and the paired sign-flip test's (over the seeds both
    finished)."""
    a, b, shift = c["a"], c["b"], float(c.get("shift", 0.0))
    metric = c.get("metric", metric)
    fa = {k: v + shift for k, v in metric_by_seed(summary[a], metric, total).items()}
    fb = metric_by_seed(summary[b], metric, total)
    out: dict[str, Any] = {"a": a, "b": b, "shift": shift, "metric": metric, "n": [len(fa), len(fb)]}
    if min(len(fa), len(fb)) < 2:
        return out | {"p_permutation": None, "p_paired_t": None, "p_sign_flip": None}
    out["p_permutation"] = permutation_test(list(fa.values()), list(fb.values()), alternative="greater")
    seeds = sorted(fa.keys() & fb.keys())
    paired = len(seeds) >= 2
    out["p_paired_t"] = paired_t_test(fa, fb, alternative="greater") if paired else None
    out["p_sign_flip"] = (
        permutation_test([fa[s] for s in seeds], [fb[s] for s in seeds], paired=True, alternative="greater")
        if paired
        else None
    )
    return out


def pooled(summary: dict[str, Any], c: dict[str, Any]) -> dict[str, Any]:
    """One pooled stability comparison: arms ``a`` against arms ``b`` (paired by position), every finished seed."""
    pairs = [(x, y, s) for x, y in zip(c["a"], c["b"]) for s in summary[x]["stability_by_seed"]]
    pairs = [(x, y, s) for x, y, s in pairs if s in summary[y]["stability_by_seed"]]
    runs_a = [summary[x]["stability_by_seed"][s] for x, _, s in pairs]
    runs_b = [summary[y]["stability_by_seed"][s] for _, y, s in pairs]
    stay_a, stay_b = sum(r["stays_solved"] for r in runs_a), sum(r["stays_solved"] for r in runs_b)
    drops_a, drops_b = [len(r["drops"]) for r in runs_a], [len(r["drops"]) for r in runs_b]
    n = len(pairs)
    out: dict[str, Any] = {
        "name": c["name"],
        "a": c["a"],
        "b": c["b"],
        "runs": n,
        "stays_solved": [stay_a, stay_b],
        "solved": [sum(r["solved_at"] is not None for r in runs_a), sum(r["solved_at"] is not None for r in runs_b)],
        "drops": [sum(drops_a), sum(drops_b)],
        "p_fisher": None,
        "p_drops_sign_flip": None,
    }
    if n:
        table = [[stay_a, n - stay_a], [stay_b, n - stay_b]]
        out["p_fisher"] = float(fisher_exact(table, alternative="greater").pvalue)
    if 2 <= n <= MAX_SIGN_FLIP_PAIRS:
        out["p_drops_sign_flip"] = permutation_test(drops_a, drops_b, paired=True, alternative="less")
    return out


def arm_parameters(spec: dict[str, Any], model: str) -> dict[str, int]:
    return parameter_counts(load_rl_config(spec["config"], arm_overrides(spec, model)))


def report(spec: dict[str, Any], out: Path, spec_path: Path) -> dict[str, Any]:
    runs = {m: {s: arm_run_dir(spec, out, m, s) for s in spec["seeds"]} for m in spec["models"]}
    summary = summarize(
        runs, total_steps=spec["env_steps"], bin_steps=spec["bin_steps"], final_fraction=spec["final_fraction"]
    )
    for model, s in summary.items():
        s["train_cpu_seconds"] = {str(k): train_cpu(runs[model][k]) for k in s["seeds"]}
        s["parameters"] = arm_parameters(spec, model)
    cost_path = out / "cost.json"
    cost = json.loads(cost_path.read_text(encoding="utf-8"))["models"] if cost_path.is_file() else {}
    records = {f"{m}-seed{s}": run_records(runs[m][s]) for m in summary for s in summary[m]["seeds"]}
    result = {
        "spec": str(spec_path),
        "command": f"python -m benchmarks.agents.run {spec_path}",
        **runs_machines(records, out / "results.json"),
        "runs": records,
        "report": report_provenance(exclude=[out]),  # what made this report, not where its runs ran
        "env_steps": spec["env_steps"],
        "models": summary,
        "contrasts": [
            contrast(summary, c, spec.get("final_metric", "final_quarter"), spec["env_steps"])
            for c in spec.get("contrasts", [])
        ],
        "pooled": [pooled(summary, c) for c in spec.get("pooled", [])],
    }
    write_text_atomic(out / "results.json", json.dumps(result, indent=1))
    write_text_atomic(out / "results.md", "\n".join(markdown(spec, spec_path, result, cost)) + "\n")
    if any(s["seeds"] for s in summary.values()):
        plot_success(summary, out / "success.png", title=f"select nonmatching object ({spec_path.stem})")
    return result


def runs_machines(records: dict[str, list[dict[str, Any]]], previous: Path) -> dict[str, Any]:
    """``machines``: the distinct machines the runs' records name; where a run has no record (trained before they were
    kept), the machine an earlier ``results.json`` recorded for the runs is carried over as ``machine_before_records``
    (never the machine making this report)."""
    seen = {json.dumps(c["machine"], sort_keys=True) for calls in records.values() for c in calls}
    out: dict[str, Any] = {"machines": [json.loads(m) for m in sorted(seen)]}
    if any(not calls for calls in records.values()) and previous.is_file():
        try:
            old = json.loads(previous.read_text(encoding="utf-8"))
        except ValueError:
            old = {}
        before = old.get("machine_before_records") or (old.get("machine") if "report" not in old else None)
        if before:
            out["machine_before_records"] = before
    return out


def provenance_markdown(result: dict[str, Any]) -> list[str]:
    """Which code, data and machines made the runs (run by run where they differ), and what made this report."""
    last = {name: (calls[-1] if calls else None) for name, calls in result["runs"].items()}
    several = [name for name, calls in result["runs"].items() if len({json.dumps(c["code"]) for c in calls}) > 1]
    lines = ["", *mixed_lines(last)]
    if several:
        lines.append(
            f"Runs trained in several calls by different code (each call in results.json): {', '.join(several)}."
        )
    machines = [f"{m.get('cpu')} ({m.get('cores')} cores), torch {m.get('torch')}" for m in result["machines"]]
    if result.get("machine_before_records"):
        m = result["machine_before_records"]
        machines.append(
            f"{m.get('cpu')} ({m.get('cores')} cores), torch {m.get('torch')} (recorded before per-run records)"
        )
    r = result["report"]
    lines += [
        "",
        f"Runs' machines: {'; '.join(machines) or 'not recorded'}. This report: code "
        f"{code_label(r['code'])}, on {r['machine'].get('cpu')} ({r['machine'].get('cores')} cores).",
    ]
    return lines


def markdown(spec: dict[str, Any], spec_path: Path, result: dict[str, Any], cost: dict[str, Any]) -> list[str]:
    summary = result["models"]
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
    lines += stability_markdown(summary)
    lines += provenance_markdown(result)
    if result.get("pooled"):
        lines += pooled_markdown(result["pooled"])
    if cost:
        lines += [
            "",
            "Cost per arm (`cost.json`): keys each query reads per step and layer, FLOPs per environment step of the "
            "acting core (forward, one environment) and of learning (forward + backward of an update, per step), "
            "and training CPU seconds per run (process CPU time; mean over the seeds that recorded it; for runs made "
            "before that record, in brackets, the cost pilot's CPU seconds per step x the run's steps).",
            "",
            "| model | keys per query | acting FLOPs / step | learning FLOPs / step | training CPU s per run |",
            "| --- | --- | --- | --- | --- |",
        ]
        for model, s in summary.items():
            c = cost.get(model, {})
            cpu = [v for v in s["train_cpu_seconds"].values() if v is not None]
            pilot = c.get("cpu_seconds_per_million_steps")
            cpu_text = (
                f"{sum(cpu) / len(cpu):,.0f} ({len(cpu)} seeds)"
                if cpu
                else (f"[{pilot * spec['env_steps'] / 1e6:,.0f}, pilot]" if pilot else "-")
            )
            lines.append(
                f"| {model} | {c.get('keys_per_query') or '-'} | {_num(c.get('acting_flops_per_step'))} | "
                f"{_num(c.get('learning_flops_per_step'))} | {cpu_text} |"
            )
    if result["contrasts"]:
        lines += [
            "",
            'Contrasts, final success, "a above b" (one-sided; `shift` is added to a\'s values first): the exact '
            "permutation test over seeds decides at 0.05 (its floor: 1/20 with 3 seeds per arm, 1/252 with 5); the "
            "paired t-test and the paired sign-flip test are reported beside it. Metric: final_quarter = success of "
            "the episodes in the last quarter; windowed = the last 200 episodes at the end; solve_speed = minus the "
            "millions of steps to the first windowed success >= 0.9 (never: the run's end).",
            "",
            "| a | b | metric | shift | exact permutation p | decided | paired t p | sign-flip p |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for c in result["contrasts"]:
            p = c.get("p_permutation")
            decided = "-" if p is None else ("yes" if p <= 0.05 + 1e-12 else "no")
            lines.append(
                f"| {c['a']} | {c['b']} | {c.get('metric', 'final_quarter')} | {c['shift']:g} | {_p(p)} | {decided} | {_p(c.get('p_paired_t'))} | "
                f"{_p(c.get('p_sign_flip'))} |"
            )
    return lines


def stability_markdown(summary: dict[str, Any]) -> list[str]:
    """Per arm: parameters, and per seed the windowed success (the last 200 episodes) at the end, when it first
    reached 0.9, and its drops after solving (below 0.6 after >= 0.9)."""
    lines = [
        "",
        "Stability (`agents.report.stability`, windowed success = the last 200 episodes at each metrics record): "
        "solved = first record >= 0.9; a drop = a fall below 0.6 after a record >= 0.9 (the next counts once the "
        "run is >= 0.9 again); stays solved = solved, no drop, and >= 0.9 at the end. Parameters: the built model's, "
        "with the observation embedding's share in brackets.",
        "",
        "| model | parameters (embedding) | stays solved | drops after solving | windowed success at the end, per seed "
        "| first >= 0.9 (k steps), per seed | drops per seed |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for model, s in summary.items():
        st = s["stability_by_seed"]
        finals = ", ".join(f"{v['final']:.3f}" for v in st.values())
        solved = ", ".join("-" if v["solved_at"] is None else f"{v['solved_at'] / 1000:.0f}" for v in st.values())
        drops = ", ".join(str(len(v["drops"])) for v in st.values())
        p = s["parameters"]
        lines.append(
            f"| {model} | {p['total']:,} ({p['observation_embedding']:,}) | {s['stays_solved']} of {len(st)} | "
            f"{s['drops_after_solving']} | {finals} | {solved} | {drops} |"
        )
    return lines


def pooled_markdown(rows: list[dict[str, Any]]) -> list[str]:
    lines = [
        "",
        "Pooled comparisons, \"a's runs stay solved more often than b's\": one-sided Fisher exact test of the two "
        "fractions (decides at 0.05); drops after solving per run, one-sided exact paired sign-flip test (a fewer).",
        "",
        "| comparison | runs per side | solved, a / b | stay solved, a / b | Fisher p | decided | drops, a / b | "
        "sign-flip p (drops) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for c in rows:
        p = c["p_fisher"]
        decided = "-" if p is None else ("yes" if p <= 0.05 else "no")
        lines.append(
            f"| {c['name']} | {c['runs']} | {c['solved'][0]} / {c['solved'][1]} | {c['stays_solved'][0]} / "
            f"{c['stays_solved'][1]} | {_p(p)} | {decided} | {c['drops'][0]} / {c['drops'][1]} | "
            f"{_p(c['p_drops_sign_flip'])} |"
        )
    return lines


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:,.0f}"


def _p(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("spec", type=Path)
    p.add_argument("--out", type=Path, help="default: the spec's folder / the spec's name")
    p.add_argument("--parallel", type=int, default=1, help="runs at a time (one thread each)")
    p.add_argument("--report-only", action="store_true", help="summarize what has finished, train nothing")
    p.add_argument(
        "--check-finished", action="store_true", help="exit 0 if every run has finished, else 1; write nothing"
    )
    args = p.parse_args(argv)
    try:
        spec = resolve_reused(load_toml(args.spec), args.spec)
    except SpecError as e:
        p.exit(2, f"error: {e}\n")
    out = args.out or args.spec.parent / args.spec.stem
    jobs = [(m, s) for s in spec["seeds"] for m in spec["models"]]
    if args.check_finished:
        return int(not all(_done(arm_run_dir(spec, out, m, s), spec["env_steps"]) for m, s in jobs))
    reused = [arm_run_dir(spec, out, m, s) for m, s in jobs if "reuse" in spec["models"][m]]
    unfinished = [d for d in reused if not _done(d, spec["env_steps"])]
    if unfinished and not args.report_only:
        p.exit(2, f"error: {unfinished[0]} is not finished; run the study it belongs to first\n")
    trained = [(m, s) for m, s in jobs if "reuse" not in spec["models"][m]]  # another study's runs are only read
    if not args.report_only:
        with ProcessPoolExecutor(max_workers=args.parallel) as pool:
            futures = {(m, s): pool.submit(run_one, spec, m, s, arm_run_dir(spec, out, m, s)) for m, s in trained}
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
