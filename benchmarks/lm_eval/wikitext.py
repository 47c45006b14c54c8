"""WikiText-103 test through lm-evaluation-harness's rolling perplexity, beside the library's own ``evaluate``.

    python -m benchmarks.lm_eval.wikitext --data ../shared/data/wikitext-103 --run-dir runs/lm-eval-wikitext

Trains ``configs/wikitext103-cpu.toml`` (shortened) into RUN_DIR when it has no checkpoint, writes a local task
directory (the test split's articles as JSON lines and a task YAML shaped like the harness's ``wikitext``), then
records the harness's word perplexity, byte perplexity and bits per byte (with the run's memory and with memory off)
next to ``evaluate --split test`` and ``evaluate --text`` on the same articles, in ``results.json`` and
``results.md`` beside this file.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

for _var in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE"):
    os.environ.setdefault(_var, "1")  # local files only

from compressive_transformer import evaluate_text, load_run  # noqa: E402
from compressive_transformer.core.fileio import write_text_atomic  # noqa: E402
from compressive_transformer.data.corpora.wikitext import _TITLE, wikitext_stream  # noqa: E402
from compressive_transformer.inference.workflows import evaluate_run  # noqa: E402
from compressive_transformer.runs.machine import machine_info  # noqa: E402
from compressive_transformer.runs.precision import describe  # noqa: E402
from compressive_transformer.runs.provenance import code_state  # noqa: E402

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
TASK = "wikitext103_articles"
TRAIN = [  # configs/wikitext103-cpu.toml shortened to about five minutes of one core (~1,100 tokens/s)
    "train.steps=300",
    "train.accumulate=[[0, 1]]",
    "train.val_every=0",
    "train.checkpoint_every=150",
    "train.progress=false",
]


def articles(test_file: Path) -> list[str]:
    """The split's articles (a top-level title between blank lines starts one), each as the library's WikiText
    reader writes text: every line's tokens followed by ``<eos>``."""
    lines = test_file.read_text(encoding="utf-8").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    starts = [
        i
        for i, line in enumerate(lines)
        if _TITLE.fullmatch(line)
        and (i == 0 or not lines[i - 1].strip())
        and (i + 1 >= len(lines) or not lines[i + 1].strip())
    ]
    # an article starts at the blank line before its title; text before the first title joins the first article
    cuts = [0] + [i - 1 for i in starts[1:]] + [len(lines)]
    return [wikitext_stream("\n".join(lines[a:b]))[0] for a, b in zip(cuts, cuts[1:])]


def write_task(directory: Path, docs: list[str]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    data = directory / f"{TASK}.jsonl"
    write_text_atomic(data, "".join(json.dumps({"page": d}) + "\n" for d in docs))
    yaml = (
        f"task: {TASK}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {data.resolve()}\n"
        "test_split: test\noutput_type: loglikelihood_rolling\ndoc_to_text: ''\ndoc_to_target: '{{page}}'\n"
        "metric_list:\n  - metric: word_perplexity\n  - metric: byte_perplexity\n  - metric: bits_per_byte\n"
    )
    write_text_atomic(directory / f"{TASK}.yaml", yaml)
    return directory


def train(run_dir: Path, data: Path) -> None:
    if list(run_dir.glob("checkpoints/step-*")):
        return
    cmd = [
        sys.executable,
        "-m",
        "compressive_transformer.cli",
        "train",
        "--config",
        str(ROOT / "configs/wikitext103-cpu.toml"),
    ]
    cmd += ["--run-dir", str(run_dir), "--set", f"data.path={data}"] + [a for s in TRAIN for a in ("--set", s)]
    subprocess.run(cmd, check=True)


def harness(run_dir: Path, tasks: Path, **model_args: int) -> dict:
    import lm_eval
    from lm_eval.tasks import TaskManager

    from compressive_transformer.harness.model import HarnessModel

    start = time.perf_counter()
    model = HarnessModel(run=str(run_dir), batch_size=8, **model_args)
    out = lm_eval.simple_evaluate(
        model=model, tasks=[TASK], task_manager=TaskManager(include_path=str(tasks), include_defaults=False)
    )
    r = out["results"][TASK]
    return {
        "model_args": model_args,
        "word_perplexity": r["word_perplexity,none"],
        "byte_perplexity": r["byte_perplexity,none"],
        "bits_per_byte": r["bits_per_byte,none"],
        "seconds": time.perf_counter() - start,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", type=Path, default=ROOT.parent / "shared/data/wikitext-103")
    p.add_argument("--run-dir", type=Path, default=ROOT / "runs/lm-eval-wikitext")
    p.add_argument("--out", type=Path, default=HERE)
    args = p.parse_args()
    test_file = args.data / "wiki.test.tokens"
    if not test_file.is_file():
        sys.exit(f"error: {test_file} does not exist; point --data at a WikiText-103 directory")
    train(args.run_dir, args.data.resolve())
    docs = articles(test_file)
    tasks = write_task(args.run_dir / "lm_eval_tasks", docs)

    split = evaluate_run(args.run_dir, split="test", progress=False)
    text = evaluate_text(load_run(args.run_dir), docs, name="test-articles")
    rows = {
        "evaluate --split test": {
            "word_perplexity": split.word_ppl,
            "byte_perplexity": 2**split.bits_per_byte,
            "bits_per_byte": split.bits_per_byte,
            "tokens": split.tokens,
        },
        "evaluate --text (the articles)": {
            "word_perplexity": text.word_ppl,
            "byte_perplexity": 2**text.bits_per_byte,
            "bits_per_byte": text.bits_per_byte,
            "tokens": text.tokens,
        },
        "lm-eval, the run's memory": harness(args.run_dir, tasks),
        "lm-eval, memory off": harness(args.run_dir, tasks, mem_len=0, cmem_len=0),
    }
    run = load_run(args.run_dir)
    record = {
        "command": "python -m benchmarks.lm_eval.wikitext " + " ".join(sys.argv[1:]),
        "machine": machine_info(),
        "code": code_state(),
        "run": {
            "dir": str(args.run_dir),
            "checkpoint": str(run.checkpoint),
            "step": run.step,
            "train_overrides": TRAIN,
        },
        "lengths": {"seg_len": run.seg_len, "mem_len": run.mem_len, "cmem_len": run.cmem_len},
        "precision": describe(run.config.eval.amp or run.config.train.amp, run.device),
        "articles": len(docs),
        "words": sum(len(d.split()) for d in docs),
        "bytes": sum(len(d.encode("utf-8")) for d in docs),
        "rows": rows,
    }
    write_text_atomic(args.out / "results.json", json.dumps(record, indent=2) + "\n")
    lines = [
        "| scored by | word perplexity | byte perplexity | bits per byte |",
        "|---|---|---|---|",
        *(
            f"| {name} | {r['word_perplexity']:.3f} | {r['byte_perplexity']:.5f} | {r['bits_per_byte']:.5f} |"
            for name, r in rows.items()
        ),
    ]
    write_text_atomic(args.out / "results.md", "\n".join(lines) + "\n")
    print("\n".join(lines))
    assert all(math.isfinite(r["bits_per_byte"]) for r in rows.values())


if __name__ == "__main__":
    main()
