"""The tokenizer-sample study: test bits per character with a BPE vocabulary learned from a sample of the train
split against one learned from all of it (README.md holds the design, predictions and decision rule).

    CT_DATA_ROOT=DIR python -m benchmarks.tokenizer_sample.run --out benchmarks/tokenizer_sample/runs --seeds 0,1,2,3,4

Each run is the command-line tool as a user runs it (``train`` then ``evaluate --split test``), one process at a
time under ``nice -n 19``. Resumable: a run with its ``eval_test.json`` is read, not rerun; a trained run is only
evaluated; an unfinished run directory is trained again from scratch. results.json and results.md are rewritten
after every run.
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from compressive_transformer.analysis.stats import paired_differences
from compressive_transformer.core.fileio import write_text_atomic
from compressive_transformer.data.readers import data_root_path
from compressive_transformer.runs import cputime
from compressive_transformer.runs.machine import machine_info

HERE = Path(__file__).parent
CONFIG = Path("benchmarks/tokenizer_sample/config.toml")  # run from the repository root, as the README shows
ARMS = {"full": 0, "one-book": 750_000, "middle": 2_000_000}  # arm -> data.tokenizer_sample (bytes; 0 = all)
BASELINE = "full"
MARGIN = 0.03  # bits/char: "no cost" when the paired interval lies within +-MARGIN (README, decision rule)
STEPS = 1200  # train.steps of config.toml: a run is trained when this checkpoint exists
TOOL = "compressive-transformer"


def cli_tool() -> str:
    """The ``compressive-transformer`` entry point beside this interpreter (the venv's), else the one on PATH."""
    beside = Path(sys.executable).with_name("compressive-transformer")
    return str(beside) if beside.is_file() else (shutil.which("compressive-transformer") or "compressive-transformer")


def train_command(run: Path, arm: str, seed: int, data: str) -> list[str]:
    sets = [f'data.path="{data}"', f"train.seed={seed}", f"data.tokenizer_sample={ARMS[arm]}"]
    if ARMS[arm]:
        sets.append(f"data.tokenizer_sample_seed={seed}")
    args = [TOOL, "train", "--config", str(CONFIG)]
    for s in sets:
        args += ["--set", s]
    return ["nice", "-n", "19", *args, "--run-dir", str(run)]


def eval_command(run: Path) -> list[str]:
    return ["nice", "-n", "19", TOOL, "evaluate", str(run), "--split", "test", "--threads", "1"]


def _run(cmd: list[str], log: Path) -> None:
    """Run ``cmd`` (as recorded: ``nice -n 19 compressive-transformer ...``) with this environment's entry point."""
    argv = [cli_tool() if a == TOOL else a for a in cmd]
    with log.open("a", encoding="utf-8") as out:
        code = subprocess.call(argv, stdout=out, stderr=subprocess.STDOUT)
    if code != 0:
        sys.exit(f"{shlex.join(cmd)} failed (exit {code}); see {log}")


def one_run(out: Path, arm: str, seed: int, data: str) -> dict[str, Any]:
    """Train and evaluate one (arm, seed) unless already done; its record for results.json."""
    run = out / f"{arm}-seed{seed}"
    train, evaluate = train_command(run, arm, seed, data), eval_command(run)
    log = out / f"{arm}-seed{seed}.log"  # beside the run: train wants a run directory it creates
    out.mkdir(parents=True, exist_ok=True)
    if not (run / "eval_test.json").is_file():
        if not (run / "checkpoints" / f"step-{STEPS:08d}").is_dir():
            shutil.rmtree(run, ignore_errors=True)
            _run(train, log)
        _run(evaluate, log)
    ev = json.loads((run / "eval_test.json").read_text(encoding="utf-8"))
    sample = json.loads((run / "tokenizer" / "tokenizer_sample.json").read_text(encoding="utf-8"))
    return {
        "arm": arm,
        "seed": seed,
        "tokenizer_sample": ARMS[arm],
        "sample_bytes_drawn": sample["bytes"],
        "sample_share": sample["bytes"] / sample["split_bytes"],
        "sample_documents": sample["names"],
        "train_split_bytes": sample["split_bytes"],
        "test_tokens": ev["tokens"],
        "test_chars": ev["chars"],
        "test_bits_per_char": ev["bits_per_char"],
        "test_bits_per_token": ev["bits_per_token"],
        "step": ev["step"],
        "train_cpu_seconds": (cputime.total(run) or {}).get("seconds"),
        "commands": [shlex.join(train), shlex.join(evaluate)],
        "machine": machine_line(machine_info()),
        "commit": git_commit("src"),
    }


def verdict(low: float, high: float, margin: float = MARGIN) -> str:
    """The README's decision rule on a paired interval (sampled arm minus full, bits/char)."""
    words = []
    if low > 0:
        words.append("costs")
    if high < 0:
        words.append("gains")
    if -margin <= low and high <= margin:
        words.append("no cost")
    if not words:
        return "not distinguishable"
    return "costs, within the margin" if words == ["costs", "no cost"] else " and ".join(words)


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per sampled arm: the paired differences against ``full`` over the seeds every arm finished, and the verdict."""
    by = {(r["arm"], r["seed"]): r for r in runs}
    seeds = sorted({s for _, s in by if all((a, s) in by for a in ARMS)})
    base = {s: by[BASELINE, s]["test_bits_per_char"] for s in seeds}
    base_tokens = {s: by[BASELINE, s]["test_tokens"] for s in seeds}
    out: dict[str, Any] = {"seeds": seeds, "margin": MARGIN, "arms": {}}
    for arm in ARMS:
        if arm == BASELINE or len(seeds) < 2:
            continue
        diff = paired_differences({s: by[arm, s]["test_bits_per_char"] for s in seeds}, base)
        iv = diff["interval"]
        tokens = paired_differences(
            {s: by[arm, s]["test_tokens"] / base_tokens[s] - 1 for s in seeds}, {s: 0.0 for s in seeds}
        )
        out["arms"][arm] = {
            "bits_per_char_minus_full": diff,
            "verdict": verdict(iv["low"], iv["high"]),
            "test_tokens_ratio_minus_1": tokens,
            "more_test_tokens_in": sum(by[arm, s]["test_tokens"] > base_tokens[s] for s in seeds),
        }
    return out


def render(record: dict[str, Any]) -> str:
    """results.md: one row per run, then the judged differences."""
    runs, summary, m = record["runs"], record["summary"], record["machine"]
    lines = [
        f"Machine: {machine_line(m)}, shared with other jobs, one thread per process; source at commit "
        f"{record['src_commit'][:12]}. Test split of the PG-19 sample "
        f"({runs[0]['test_chars']:,} characters) after {STEPS} updates."
        if runs
        else "No run finished yet.",
        "",
        "| arm | seed | tokenizer_sample | sample drawn (bytes, share of train) | test tokens | test bits/char | train CPU s |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in sorted(runs, key=lambda r: (list(ARMS).index(r["arm"]), r["seed"])):
        lines.append(
            f"| {r['arm']} | {r['seed']} | {r['tokenizer_sample']:,} | {r['sample_bytes_drawn']:,} "
            f"({100 * r['sample_share']:.1f}%) | {r['test_tokens']:,} | {r['test_bits_per_char']:.4f} | "
            f"{r['train_cpu_seconds']:.0f} |"
        )
    lines += [
        "",
        f"Paired over seeds {', '.join(map(str, summary['seeds'])) or '-'} (those every arm finished); margin "
        f"+-{summary['margin']} bits/char.",
        "",
        "| arm minus full | test bits/char: mean ± 95% t interval | seeds worse | test tokens: mean change | verdict |",
        "|---|---|---|---|---|",
    ]
    for arm, s in summary["arms"].items():
        d, t = s["bits_per_char_minus_full"], s["test_tokens_ratio_minus_1"]["interval"]
        iv = d["interval"]
        lines.append(
            f"| {arm} | {iv['mean']:+.4f} ± {iv['half_width']:.4f} [{iv['low']:+.4f}, {iv['high']:+.4f}] | "
            f"{d['n'] - d['lower_in']} of {d['n']} | {100 * t['mean']:+.1f}% ± {100 * t['half_width']:.1f}% "
            f"(more in {s['more_test_tokens_in']} of {d['n']}) | {s['verdict']} |"
        )
    return "\n".join(lines) + "\n"


def git_commit(path: str | None = None) -> str:
    """HEAD, or with ``path`` (relative to the repository root) the last commit that changed it: the commit of the
    code a run ran, which the study's own later commits (results, this script) do not move."""
    cmd = ["git", "log", "-1", "--format=%H", "--", path] if path else ["git", "rev-parse", "HEAD"]
    try:
        out = subprocess.run(cmd, cwd=HERE.parents[1], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return out or "unknown"


def machine_line(m: dict[str, Any]) -> str:
    return f"{m.get('cpu', '?')}, {m.get('cores')} cores, torch {m.get('torch')}"


def write(runs: list[dict[str, Any]], command: str) -> dict[str, Any]:
    record = {
        "command": command,
        "machine": machine_info(),
        "commit": git_commit(),
        "src_commit": git_commit("src"),
        "config": str(CONFIG),
        "runs": runs,
        "summary": summarize(runs),
    }
    write_text_atomic(HERE / "results.json", json.dumps(record, indent=1) + "\n")
    write_text_atomic(HERE / "results.md", render(record))
    return record


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default="data/pg19-sample", help="the PG-19 sample; data/... reads $CT_DATA_ROOT/...")
    p.add_argument("--out", type=Path, default=Path("benchmarks/tokenizer_sample/runs"))
    p.add_argument("--seeds", default="0,1,2,3,4")
    args = p.parse_args()
    if not Path(data_root_path(args.data)).is_dir():
        sys.exit(f"--data: {data_root_path(args.data)} is not a directory; pass the PG-19 sample (or set CT_DATA_ROOT)")
    command = "python -m benchmarks.tokenizer_sample.run " + shlex.join(sys.argv[1:])
    runs: list[dict[str, Any]] = []
    for seed in (int(s) for s in args.seeds.split(",")):
        for arm in ARMS:
            runs.append(one_run(args.out, arm, seed, args.data))
            print(f"{arm} seed {seed}: {runs[-1]['test_bits_per_char']:.4f} bits/char", flush=True)
            write(runs, command)
    print(render(write(runs, command)))


if __name__ == "__main__":
    main()
