"""Tiny runs of every model kind and tokenizer for the lm-evaluation-harness tests, trained in-process on a small
text corpus in seconds."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Sequence

from compressive_transformer.runs.presets import TINY_TOML
from compressive_transformer.runs.rundir import config_from_text
from compressive_transformer.training.workflows import train_run

TEXT = "the cat sat on the mat. a dog ran in the park. " * 6
KINDS = {
    "compressive": (),
    "xl": ("model.cmem_len=0",),
    "ql": ("model.scales=[1, 1]", "model.cmem_len=0", "model.compression='max_pool'", "model.compression_loss='none'"),
}


def sentences(n_docs: int, seed: int = 0) -> list[str]:
    """Documents of the two sentences in random order: after "on the" comes "mat.", after "in the" "park."."""
    rng = random.Random(seed)
    pick = ("the cat sat on the mat.", "a dog ran in the park.")
    return [" ".join(rng.choice(pick) for _ in range(30)) for _ in range(n_docs)]


def train_tiny(
    root: Path, *overrides: str, tokenizer: str = "bytes", steps: int = 2, docs: Sequence[str] = (TEXT,)
) -> Path:
    """A run trained ``steps`` steps on a small text corpus (train/validation/test folders of ``docs``)."""
    corpus = root / "corpus"
    for split in ("train", "validation", "test"):
        (corpus / split).mkdir(parents=True)
        for i, doc in enumerate(docs):
            (corpus / split / f"{i}.txt").write_text(doc, encoding="utf-8")
    cfg = config_from_text(
        TINY_TOML,
        [
            "data.format=text",
            f"data.path={corpus}",
            f"data.tokenizer={tokenizer}",
            f"train.steps={steps}",
            "train.progress=false",
            "train.val_batches=1",
            *overrides,
        ],
    )
    train_run(cfg, root / "run", log=lambda s: None)
    return root / "run"
