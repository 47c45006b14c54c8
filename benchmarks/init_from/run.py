"""The `train --init-from` demo: a small Transformer-XL turned into a Compressive Transformer, per seed.

    CT_DATA_ROOT=DIR python -m benchmarks.init_from.run --out runs/init_from --seeds 0,1,2

(DIR holds wikitext-103/; or pass --data PATH.)

For each seed: train ``txl.toml``; ``--init-from`` it into ``ct.toml`` training only what is new (the compressor and
the compressed memory's positional stream: ``train.freeze = ["copied"]``); ``--init-from`` that into ``ct.toml``
training everything; as a control, ``--init-from`` the Transformer-XL into ``ct.toml`` without compressed memory
(the same number of further updates). Each is evaluated on the first 100 batches of wiki.test.tokens, the
Compressive Transformers with and without their compressed memory. Resumable: finished runs and evaluations are
kept. Writes results.json, results.md and results.png beside this file.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from compressive_transformer import cli
from compressive_transformer.analysis.stats import mean_interval, paired_differences
from compressive_transformer.core.fileio import write_text_atomic
from compressive_transformer.data.readers import data_root_path
from compressive_transformer.runs.machine import machine_info
from compressive_transformer.runs.provenance import code_state

HERE = Path(__file__).parent
CMEM = 32
# (name, run, eval.cmem_len or None for the run's own)
EVALS = [
    ("Transformer-XL", "txl", None),
    ("CT, compressor trained, no compressed memory", "ct_frozen", 0),
    ("CT, compressor trained", "ct_frozen", CMEM),
    ("CT, then everything trained, no compressed memory", "ct_full", 0),
    ("CT, then everything trained", "ct_full", CMEM),
    ("control: Transformer-XL, as many more updates", "txl_more", None),
]


def train(run: Path, config: str, seed: int, data: str, *extra: str) -> None:
    if (run / "config.toml").is_file() and any((run / "checkpoints").glob("step-*")):
        return
    args = ["train", "--config", str(HERE / config), "--run-dir", str(run), "--set", f"train.seed={seed}"]
    code = cli.main(args + ["--set", f'data.path="{data}"', *extra])
    if code != 0:
        sys.exit(f"training {run} failed")


def evaluate(run: Path, cmem: int | None, out: Path) -> dict:
    if not out.is_file():
        extra = ["--set", f"eval.cmem_len={cmem}"] if cmem is not None else []
        if cli.main(["evaluate", str(run), "--split", "test", "--out", str(out), *extra]) != 0:
            sys.exit(f"evaluating {run} failed")
    return json.loads(out.read_text())


def one_seed(out: Path, seed: int, data: str) -> dict[str, float]:
    d = out / f"seed{seed}"
    train(d / "txl", "txl.toml", seed, data)
    train(d / "ct_frozen", "ct.toml", seed, data, "--init-from", str(d / "txl"), "--set", 'train.freeze=["copied"]')
    train(d / "ct_full", "ct.toml", seed, data, "--init-from", str(d / "ct_frozen"))
    train(d / "txl_more", "ct.toml", seed, data, "--init-from", str(d / "txl"), "--set", "model.cmem_len=0")
    results = {}
    for name, run, cmem in EVALS:
        record = evaluate(d / run, cmem, d / f"eval_{run}_{cmem}.json")
        results[name] = record["bits_per_token"]
    return results


def plot(summary: dict[str, dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(summary)
    means = [summary[n]["mean"] for n in names]
    errs = [summary[n]["half_width"] for n in names]
    fig, ax = plt.subplots(figsize=(8, 3.6))
    ax.barh(range(len(names)), means, xerr=errs, color="#4c72b0", capsize=3)
    ax.set_yticks(range(len(names)), names, fontsize=8)
    ax.invert_yaxis()
    lo = min(m - e for m, e in zip(means, errs))
    ax.set_xlim(lo - 0.1, max(m + e for m, e in zip(means, errs)) + 0.05)
    ax.set_xlabel("bits per token, first 25,600 tokens of wiki.test.tokens (mean, 95% interval)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--data",
        default="data/wikitext-103",
        help="the WikiText-103 directory (wiki.valid.tokens, wiki.test.tokens); data/... reads $CT_DATA_ROOT/...",
    )
    p.add_argument("--out", type=Path, default=Path("runs/init_from"))
    p.add_argument("--seeds", default="0,1,2")
    args = p.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    data = str(Path(data_root_path(args.data)).resolve())
    start = time.time()
    per_seed = {seed: one_seed(args.out, seed, data) for seed in seeds}
    names = [n for n, _, _ in EVALS]
    summary = {n: mean_interval([per_seed[s][n] for s in seeds]).to_dict() for n in names}
    col = lambda n: {s: per_seed[s][n] for s in seeds}  # noqa: E731
    comparisons = {
        "CT (compressor only) with minus without compressed memory": paired_differences(col(names[2]), col(names[1])),
        "CT (compressor only, no compressed memory) minus Transformer-XL": paired_differences(
            col(names[1]), col(names[0])
        ),
        "CT (everything) with minus without compressed memory": paired_differences(col(names[4]), col(names[3])),
        "CT (everything) minus control": paired_differences(col(names[4]), col(names[5])),
    }
    command = "python -m benchmarks.init_from.run " + " ".join(sys.argv[1:])
    record = {
        "command": command,
        "machine": machine_info(),
        "code": code_state(),
        "wall_seconds_this_call": round(time.time() - start, 1),
        "per_seed": {str(s): v for s, v in per_seed.items()},
        "summary": summary,
        "comparisons": comparisons,
    }
    write_text_atomic(HERE / "results.json", json.dumps(record, indent=1) + "\n")
    lines = [
        f"Command: `{command}`; machine: {record['machine'].get('cpu', '?')}, {record['machine'].get('cores')} cores "
        f"shared with other jobs, one thread per process, torch {record['machine'].get('torch')}; {len(seeds)} seeds.",
        "",
        "| model | bits per token (mean ± 95% interval) | per seed |",
        "|---|---|---|",
    ]
    for n in names:
        iv = summary[n]
        lines.append(
            f"| {n} | {iv['mean']:.4f} ± {iv['half_width']:.4f} | {', '.join(f'{per_seed[s][n]:.4f}' for s in seeds)} |"
        )
    lines += ["", "| paired difference (bits per token) | mean ± 95% interval | seeds lower |", "|---|---|---|"]
    for n, c in comparisons.items():
        iv = c["interval"]
        lines.append(f"| {n} | {iv['mean']:+.4f} ± {iv['half_width']:.4f} | {c['lower_in']} of {c['n']} |")
    write_text_atomic(HERE / "results.md", "\n".join(lines) + "\n")
    plot(summary, HERE / "results.png")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
