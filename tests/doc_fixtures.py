"""The directory a page of the docs runs in: the repository's configs and scripts, the environment as `.venv`, and
small stand-ins for the files the pages name (your texts, the corpora under data/, sound files, a Transformer-XL
checkpoint), made here from the Python help topics every Python ships; nothing is downloaded."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from doc_runner import ROOT, missing

TEXT_CHARS = 24_000  # per stand-in document: a few hundred segments of a tiny model


def pydoc_text(start: int, chars: int) -> str:
    """``chars`` characters of the pydoc help topics from topic ``start`` on (each call a different stretch)."""
    from pydoc_data.topics import topics

    keys = sorted(topics)
    out, i = "", start
    while len(out) < chars:
        out += topics[keys[i % len(keys)]] + "\n"
        i += 1
    return out[:chars].rsplit("\n", 1)[0] + "\n"


def write_texts(tmp: Path) -> None:
    for i in range(4):
        (tmp / "my-texts").mkdir(exist_ok=True)
        (tmp / "my-texts" / f"doc{i}.txt").write_text(pydoc_text(10 * i, TEXT_CHARS))
    (tmp / "my-novel.txt").write_text(pydoc_text(50, 8_000))
    (tmp / "chapter2.txt").write_text(pydoc_text(60, 4_000))


def write_corpora(tmp: Path) -> None:
    """data/pg19 (books and metadata.csv), data/enwik8 (a short prefix), data/wikitext-103 and -2 (word tokens)."""
    pg19 = tmp / "data" / "pg19"
    books = {"train": [101, 102, 103], "validation": [201], "test": [301]}
    for split, ids in books.items():
        (pg19 / split).mkdir(parents=True)
        for n in ids:
            (pg19 / split / f"{n}.txt").write_text(pydoc_text(n, TEXT_CHARS))
    (pg19 / "metadata.csv").write_text(
        "".join(f'{n},"Book {n}",1900,https://example.org/{n}\n' for n in sum(books.values(), []))
    )
    (tmp / "data" / "enwik8").mkdir(parents=True)
    (tmp / "data" / "enwik8" / "enwik8").write_text(pydoc_text(0, 4 * TEXT_CHARS))
    for name in ("wikitext-103", "wikitext-2"):
        folder = tmp / "data" / name
        folder.mkdir(parents=True)
        for split, start in (("train", 0), ("valid", 40), ("test", 60)):
            lines = [
                " ".join(line.split())
                for line in pydoc_text(start, TEXT_CHARS // (1 if split == "train" else 4)).splitlines()
            ]
            (folder / f"wiki.{split}.tokens").write_text(f" = Topic {start} = \n" + "\n".join(lines) + "\n")


def write_wavs(tmp: Path) -> None:
    """my-wavs/{train,validation,test}/NNNN.wav: tones with a little noise, 16 kHz (needs the audio extra)."""
    import numpy as np
    import soundfile

    rng = np.random.default_rng(0)
    for split, count in (("train", 3), ("validation", 1), ("test", 1)):
        (tmp / "my-wavs" / split).mkdir(parents=True)
        for i in range(count):
            t = np.arange(4000) / 16000
            wave = 0.4 * np.sin(2 * np.pi * (200 + 50 * i) * t) + 0.01 * rng.standard_normal(len(t))
            soundfile.write(tmp / "my-wavs" / split / f"{i:04d}.wav", wave.astype(np.float32), 16000)


def write_transfo_xl(tmp: Path) -> None:
    """transfo-xl-wt103/: a small TransfoXLLMHeadModel as `transformers` saves one, and transfo-xl-tiny.toml, a run
    config of the same shape with compressed memory (what the 18-layer config is to the released checkpoint)."""
    import dataclasses

    from compressive_transformer.core.config import DataConfig, EvalConfig, RunConfig, TrainConfig
    from compressive_transformer.core.model_config import CompressionConfig
    from compressive_transformer.runs.interop.transfo_xl import model_config
    from compressive_transformer.runs.toml_writer import config_text
    from tests.test_import_transfo_xl import CONFIG, write_checkpoint

    write_checkpoint(tmp / "transfo-xl-wt103")
    model = model_config(CONFIG, seg_len=8)
    model = dataclasses.replace(  # as the ready config: an empty memory to start (the importer's zeros are for cmem 0)
        model, compression=CompressionConfig(rate=2), memory=dataclasses.replace(model.memory, init="empty")
    )
    cfg = RunConfig(
        model=model,
        data=DataConfig(format="wikitext", path="data/wikitext-103", tokenizer="words"),
        train=TrainConfig(steps=2, batch_size=2, warmup_steps=1, val_batches=2, checkpoint_every=0, num_threads=1),
        eval=EvalConfig(batch_size=2, max_batches=2),
    )
    (tmp / "transfo-xl-tiny.toml").write_text(config_text(cfg))


def prepare(tmp: Path, page_text: str) -> None:
    """Fill ``tmp`` with what a page's commands read."""
    for name in ("configs", "scripts"):
        shutil.copytree(ROOT / name, tmp / name, ignore=shutil.ignore_patterns("__pycache__"))
    (tmp / ".venv").symlink_to(Path(sys.prefix))
    write_texts(tmp)
    write_corpora(tmp)
    if "my-wavs" in page_text and not missing(["audio"]):  # else the blocks that read them are skipped too
        write_wavs(tmp)
    if "transfo-xl-wt103" in page_text:
        write_transfo_xl(tmp)
