"""The tuned speech comparison's specs, written by its pre-registered rules (README.md, "Tuned transformers").

    python -m benchmarks.speech.tune sweep    # lr-sweep.toml: both transformers at 3e-4, 1e-3, 3e-3 (seed 0)
    python -m benchmarks.speech.tune extra    # lr-sweep-extra.toml: one value further where a best is at an edge
    python -m benchmarks.speech.tune tuned    # tuned.toml: three arms at their chosen rates, seeds 0-4
    python -m benchmarks.speech.tune seeds    # tuned.toml's seeds grown where CT - TXL is still wider than +-0.1

The rule is the WaveNet sweep's (wavenet-sweep.toml): the lowest validation bits per sample of seed 0 at 1500
updates; where the best is the grid's highest (lowest) value, one more value a factor ~3 higher (lower) is run and
the best of the four taken. Every arm otherwise is fair.toml's: the same [base], data, budget and schedule.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from compressive_transformer.analysis.stats import paired_differences, t_quantile
from compressive_transformer.core.config import load_toml
from compressive_transformer.core.fileio import write_text_atomic
from compressive_transformer.runs.toml_writer import dumps

HERE = Path(__file__).resolve().parent
GRID = (3e-4, 1e-3, 3e-3)
BEYOND = {3e-3: 1e-2, 3e-4: 1e-4}  # the value run where the best is at an edge of the grid
TRANSFORMERS = ("compressive", "transformer-xl-wide")
WAVENET = "wavenet30"  # its rate is its own sweep's choice (wavenet-sweep.toml: 3e-3)
SEEDS = 5
MAX_SEEDS = 10
HALF_WIDTH = 0.1  # CT - TXL at the judged level: more seeds while its interval is wider than this
JUDGED = (("compressive", "transformer-xl-wide"), (WAVENET, "compressive"), (WAVENET, "transformer-xl-wide"))
LEVEL = 1 - 0.05 / len(JUDGED)  # Bonferroni over the three judged differences: 98.3%


def lr_name(lr: float) -> str:
    return f"{lr:.0e}".replace("e-0", "e-")  # 3e-4, 1e-3, 1e-2


def fair_spec() -> dict[str, Any]:
    return load_toml(HERE / "fair.toml")


def study_table(title: str, seeds: list[int], splits: list[str], baseline: str) -> dict[str, Any]:
    return {
        "title": title,
        "seeds": seeds,
        "baseline": baseline,
        "splits": splits,
        "lookback_edges": [256, 512, 1280, 2047],
        "attention_segments": 0,
        "parallel": 1,
        "threads": 1,
    }


def variant(arm: str, lr: float) -> dict[str, Any]:
    """fair.toml's arm ``arm`` at learning rate ``lr``."""
    v = fair_spec()["variants"][arm]
    return {"model": dict(v["model"]), "train": {**v.get("train", {}), "lr": lr}}


def spec_text(header: str, study: dict[str, Any], variants: dict[str, dict[str, Any]]) -> str:
    base = fair_spec()["base"]
    tables = {"study": study, **{f"base.{k}": v for k, v in base.items()}}
    tables |= {f"variants.{name}.{part}": table for name, v in variants.items() for part, table in v.items()}
    comment = "".join(f"# {line}".rstrip() + "\n" for line in header.splitlines())
    return comment + "\n" + dumps(tables)


def validation_bits(folder: Path) -> dict[str, float]:
    """Seed 0's validation bits per sample of each variant a sweep folder holds."""
    out = {}
    for path in sorted((folder / "results").glob("*/seed-0.json")):
        r = json.loads(path.read_text(encoding="utf-8"))
        out[r["variant"]] = r["evaluations"]["train"]["validation"]["bits_per_char"]
    return out


def swept(arm: str) -> dict[float, float]:
    """``arm``'s validation bits by learning rate, over the sweep and its extension (what has finished)."""
    bits = validation_bits(HERE / "lr-sweep") | validation_bits(HERE / "lr-sweep-extra")
    rates = (*GRID, *BEYOND.values())
    return {lr: bits[f"{arm}-lr{lr_name(lr)}"] for lr in rates if f"{arm}-lr{lr_name(lr)}" in bits}


def beyond(bits: dict[float, float]) -> float | None:
    """The extra value the rule runs for an arm's grid results, or None (the best is inside the grid)."""
    if not all(lr in bits for lr in GRID):
        raise SystemExit("the sweep has not finished: run lr-sweep.toml first")
    return BEYOND.get(min(GRID, key=lambda lr: bits[lr]))


def chosen(bits: dict[float, float]) -> float:
    extra = beyond(bits)
    if extra is not None and extra not in bits:
        raise SystemExit(f"the rule asks for lr {lr_name(extra)} first: run lr-sweep-extra.toml")
    return min(bits, key=lambda lr: bits[lr])


def write_sweep() -> Path:
    variants = {f"{arm}-lr{lr_name(lr)}": variant(arm, lr) for arm in TRANSFORMERS for lr in GRID}
    header = (
        'The transformers\' learning-rate sweep (README.md, "Tuned transformers"); written by\n'
        "`python -m benchmarks.speech.tune sweep`. fair.toml's Compressive Transformer and parameter-matched\n"
        "Transformer-XL at 3e-4, 1e-3, 3e-3; seed 0, validation only, as wavenet-sweep.toml.\n\n"
        "  nice -n 19 compressive-transformer study benchmarks/speech/lr-sweep.toml --out benchmarks/speech/lr-sweep "
        "--parallel 1 --threads 1"
    )
    study = study_table(
        "Speech: learning-rate sweep of the transformers (seed 0, validation only)",
        [0],
        ["validation"],
        "compressive-lr1e-3",
    )
    path = HERE / "lr-sweep.toml"
    write_text_atomic(path, spec_text(header, study, variants))
    return path


def write_extra() -> Path | None:
    variants = {}
    for arm in TRANSFORMERS:
        extra = beyond(swept(arm))
        if extra is not None:
            variants[f"{arm}-lr{lr_name(extra)}"] = variant(arm, extra)
    if not variants:
        return None
    header = (
        'The sweep\'s extension by its rule (README.md, "Tuned transformers"): an arm whose best is at an edge of\n'
        "the grid is run one value further; written by `python -m benchmarks.speech.tune extra`.\n\n"
        "  nice -n 19 compressive-transformer study benchmarks/speech/lr-sweep-extra.toml --out "
        "benchmarks/speech/lr-sweep-extra --parallel 1 --threads 1"
    )
    first = next(iter(variants))
    study = study_table(
        "Speech: the transformers' sweep, one value further (seed 0, validation only)", [0], ["validation"], first
    )
    path = HERE / "lr-sweep-extra.toml"
    write_text_atomic(path, spec_text(header, study, variants))
    return path


def write_tuned(seeds: int) -> Path:
    rates = {arm: chosen(swept(arm)) for arm in TRANSFORMERS}
    wavenet = variant(WAVENET, fair_spec()["variants"][WAVENET]["train"]["lr"])
    variants = {arm: variant(arm, lr) for arm, lr in rates.items()} | {WAVENET: wavenet}
    chosen_text = ", ".join(f"{arm} {lr_name(lr)}" for arm, lr in rates.items())
    header = (
        'The tuned speech comparison (README.md, "Tuned transformers"): the three arms of fair.toml at the\n'
        f"learning rates their sweeps chose on validation ({chosen_text}; {WAVENET} {lr_name(wavenet['train']['lr'])}\n"
        "from wavenet-sweep.toml), equal updates, seeds 0 to N-1; written by `python -m benchmarks.speech.tune tuned`\n"
        "(and `... seeds`, which grows N by the pre-registered rule).\n\n"
        "  python -m benchmarks.speech.cost benchmarks/speech/tuned.toml --updates 20 60 --out benchmarks/speech/tuned\n"
        "  nice -n 19 compressive-transformer study benchmarks/speech/tuned.toml --out benchmarks/speech/tuned "
        "--parallel 2 --threads 2\n"
        "  python -m benchmarks.speech.compare benchmarks/speech/tuned --design tuned --split test\n\n"
        "(the commands benchmarks/queue.sh ran: two runs at a time, one thread each)"
    )
    study = study_table(
        "Speech (CPU, 16 kHz mu-law synthetic speech): the three arms at their tuned learning rates",
        list(range(seeds)),
        ["validation", "test"],
        "transformer-xl-wide",
    )
    path = HERE / "tuned.toml"
    write_text_atomic(path, spec_text(header, study, variants))
    return path


def seeds_needed(diffs: list[float], half_width: float = HALF_WIDTH) -> int:
    """The seeds the rule asks for: as many as there are while the CT - TXL interval at the judged level is within
    ``half_width``; else the fewest n (at most :data:`MAX_SEEDS`) with t(n - 1) x SD / sqrt(n) <= ``half_width``, the
    SD that of the differences so far."""

    n = len(diffs)
    mean = sum(diffs) / n
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1))

    def width(k: int) -> float:
        return t_quantile(1 - (1 - LEVEL) / 2, k - 1) * sd / math.sqrt(k)

    if width(n) <= half_width:
        return n
    return next((k for k in range(n + 1, MAX_SEEDS + 1) if width(k) <= half_width), MAX_SEEDS)


def grow_seeds() -> int:
    spec = load_toml(HERE / "tuned.toml")
    folder = HERE / "tuned"
    bits = {}
    for arm in ("compressive", "transformer-xl-wide"):
        bits[arm] = {}
        for path in sorted((folder / "results" / arm).glob("seed-*.json")):
            r = json.loads(path.read_text(encoding="utf-8"))
            bits[arm][int(r["seed"])] = r["evaluations"]["train"]["test"]["bits_per_char"]
    have = spec["study"]["seeds"]
    d = paired_differences(bits["compressive"], bits["transformer-xl-wide"], LEVEL)
    if d["n"] < len(have):
        raise SystemExit(f"tuned.toml's {len(have)} seeds have not all finished ({d['n']} have)")
    n = seeds_needed(list(d["per_seed"].values()))
    if n > len(have):
        text = (HERE / "tuned.toml").read_text(encoding="utf-8")
        old = "seeds = " + json.dumps(have)
        assert old in text, old
        write_text_atomic(HERE / "tuned.toml", text.replace(old, "seeds = " + json.dumps(list(range(n)))))
    return n


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("step", choices=("sweep", "extra", "tuned", "seeds"))
    p.add_argument("--seeds", type=int, default=SEEDS, help="tuned: the first N seeds (default 5)")
    args = p.parse_args(argv)
    if args.step == "sweep":
        print(write_sweep())
    elif args.step == "extra":
        path = write_extra()
        print(path or "no arm's best is at an edge of the grid: nothing more to run")
    elif args.step == "tuned":
        print(write_tuned(args.seeds))
    else:
        print(f"tuned.toml: seeds 0-{grow_seeds() - 1}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
