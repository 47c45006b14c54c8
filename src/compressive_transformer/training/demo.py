"""The demo: train a small Compressive Transformer on the pydoc topics, evaluate it, sample from it, and say what its
score means beside simple references on the same text."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path

from compressive_transformer.data import read_documents
from compressive_transformer.data.baselines import ReferenceScores, reference_scores
from compressive_transformer.inference.evaluate import EvalResult
from compressive_transformer.inference.generate import SamplingConfig
from compressive_transformer.inference.workflows import evaluate_run, generate_run
from compressive_transformer.runs.presets import DEMO_TOML
from compressive_transformer.runs.rundir import Log, config_from_text, fresh_run_dir, require_empty
from compressive_transformer.training.workflows import train_run


@dataclass
class DemoResult:
    run_dir: Path
    steps: int
    seconds: float
    validation: EvalResult
    sample: str
    references: ReferenceScores  # the validation text under simple references: what the score means


def demo(
    *, steps: int | None = None, run_dir: str | Path | None = None, log: Log = print, prompt: str = "The "
) -> DemoResult:
    """Train the demo config on the pydoc topics, evaluate on validation, sample; never reuses a run directory."""
    overrides = [f"train.steps={steps}"] if steps is not None else []
    cfg = config_from_text(DEMO_TOML, overrides)
    if steps is not None and steps < cfg.train.warmup_steps * 2:
        cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, warmup_steps=max(steps // 10, 0)))
    run_dir = Path(run_dir) if run_dir is not None else fresh_run_dir("demo")
    require_empty(run_dir, "the demo always trains a new run: choose another --run-dir, or leave it out")
    start = time.perf_counter()
    log(
        f"demo: training a {cfg.model.n_layers}-layer Compressive Transformer on the pydoc topics for {cfg.train.steps} steps"
    )
    train_run(cfg, run_dir, log=log)
    log("demo: evaluating on the whole validation split (memory carried through)")
    result = evaluate_run(run_dir, split="validation")
    references = reference_scores(read_documents(cfg.data, "train"), read_documents(cfg.data, "validation"))
    sample = generate_run(run_dir, prompt, max_tokens=200, sampling=SamplingConfig(temperature=0.8, top_k=40), seed=0)
    return DemoResult(
        run_dir=run_dir,
        steps=cfg.train.steps,
        seconds=time.perf_counter() - start,
        validation=result,
        sample=prompt + sample,
        references=references,
    )


__all__ = ["DemoResult", "demo"]
