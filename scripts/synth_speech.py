"""Synthesise a small speech corpus with espeak-ng: passages of the PG-19-format sample books read aloud.

This is SYNTHETIC speech (a formant synthesiser, a few voices), not recordings: good for trying the audio pipeline
and for CPU-scale comparisons with no download, not a stand-in for the paper's 24.6 hours of real speech. The
layout is what ``data.format = "audio"`` reads: ``OUT/{train,validation,test}/NNNN.wav``, one passage per file,
train passages from the train books, validation from the validation books, test from the test books.

    apt-get install -y espeak-ng
    python scripts/synth_speech.py --books PATH/TO/pg19-sample --out data/synth-speech

Deterministic: the same books, options and espeak-ng build give the same passages, voices and files. The files are
espeak-ng's own WAVs at 22,050 Hz (the audio format resamples them to ``data.sample_rate`` when it reads them).
``OUT/generator.json`` records what made them: this script's commit, espeak-ng's version (and its Debian package's,
where there is one), the options, the books' hashes and each split's fingerprint
(``compressive_transformer.runs.provenance``), which a study's per-run records repeat.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from compressive_transformer.core.config import DataConfig
from compressive_transformer.runs.provenance import code_state, data_fingerprint, file_hash

VOICES = ("en-us+m3", "en-gb+f2", "en-us+f4", "en-gb-scotland+m1", "en+m7", "en-us+f1")
SPLITS = ("train", "validation", "test")


def passages(book: Path, words: int, count: int, skip: int = 200) -> list[str]:
    """``count`` passages of about ``words`` words from ``book``, spread evenly through it, each starting and ending
    at a sentence boundary; the first ``skip`` lines (title pages, contents) are left out."""
    text = " ".join(book.read_text(encoding="utf-8", errors="replace").splitlines()[skip:])
    sentences = [s.strip() for s in re.split(r"(?<=[.!?])\s+", re.sub(r"\s+", " ", text)) if len(s.split()) >= 4]
    if not sentences:
        return []
    out, stride = [], max(1, len(sentences) // max(count, 1))
    for start in range(0, len(sentences), stride):
        chunk, n = [], 0
        for s in sentences[start:]:
            chunk.append(s)
            n += len(s.split())
            if n >= words:
                break
        out.append(" ".join(" ".join(chunk).split()[: 2 * words]))  # a run-on sentence is cut short
        if len(out) == count:
            break
    return out


def speak(text: str, voice: str, path: Path, speed: int) -> None:
    subprocess.run(["espeak-ng", "-v", voice, "-s", str(speed), "-w", str(path), text], check=True)


def espeak_version() -> dict[str, str | None]:
    """espeak-ng's own version line and, where dpkg knows it, its package's version (the build)."""
    line = subprocess.run(["espeak-ng", "--version"], capture_output=True, text=True, check=True).stdout.strip()
    try:
        package = subprocess.run(
            ["dpkg-query", "-W", "-f", "${Version}", "espeak-ng"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        package = None
    return {"espeak-ng": line.split("Data at:")[0].strip(), "package": package or None}


def generator_record(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    """What made the corpus in ``out``: script, commit, synthesiser build, options, books and each split's files."""
    books = {str(b.relative_to(args.books)): file_hash(b) for b in sorted(args.books.glob("*/*.txt"))}
    fingerprint = data_fingerprint(DataConfig(format="audio", path=str(out)), SPLITS)
    for split in fingerprint["splits"].values():  # paths relative to the corpus, so two builds compare
        for row in split["files"]:
            row["path"] = str(Path(row["path"]).relative_to(out))
    return {
        "generator": "scripts/synth_speech.py",
        "code": code_state(Path(__file__).resolve().parent),
        "synthesiser": espeak_version(),
        "options": {"files": list(args.files), "words": args.words, "speed": args.speed, "voices": list(VOICES)},
        "books": books,
        "splits": fingerprint["splits"],
    }


def split_passages(books: list[Path], n_files: int, words: int) -> list[str]:
    """``n_files`` passages from ``books``: an even share of each book first (what earlier corpora were made of, so
    the same options still give the same files), then, where a book yields fewer, more passages of the others."""
    per_book = -(-n_files // len(books))
    texts = [t for b in books for t in passages(b, words, per_book)][:n_files]
    for book in books:  # top up from denser spreads of each book, skipping passages already taken
        if len(texts) >= n_files:
            break
        texts += [t for t in passages(book, words, n_files) if t not in texts][: n_files - len(texts)]
    return texts


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--books", type=Path, required=True, help="a PG-19-format folder: train/ validation/ test/ <id>.txt")
    p.add_argument("--out", type=Path, required=True, help="folder to write train/ validation/ test/ WAV files into")
    p.add_argument(
        "--files", type=int, nargs=3, default=(60, 8, 8), metavar=("TRAIN", "VAL", "TEST"), help="passages per split"
    )
    p.add_argument("--words", type=int, default=12, help="words per passage (about 0.4 s of speech per word)")
    p.add_argument("--speed", type=int, default=160, help="espeak-ng words per minute")
    args = p.parse_args(argv)
    if shutil.which("espeak-ng") is None:
        print("synth_speech: espeak-ng is not installed; apt-get install -y espeak-ng", file=sys.stderr)
        return 2
    if any(n < 1 for n in args.files):
        print(f"synth_speech: --files {' '.join(map(str, args.files))}: each split needs at least 1", file=sys.stderr)
        return 2
    plans = {}
    for split, n_files in zip(SPLITS, args.files):
        books = sorted((args.books / split).glob("*.txt"))
        if not books:
            print(f"synth_speech: {args.books / split} has no books; give a PG-19-format folder", file=sys.stderr)
            return 2
        if any((args.out / split).glob("*.wav")):
            print(f"synth_speech: {args.out / split} already holds WAV files; give a new --out", file=sys.stderr)
            return 2
        plans[split] = (books, split_passages(books, n_files, args.words))
    for (split, (books, texts)), n_files in zip(plans.items(), args.files):
        folder = args.out / split
        folder.mkdir(parents=True, exist_ok=True)
        for i, text in enumerate(texts):
            speak(text, VOICES[i % len(VOICES)], folder / f"{i:04d}.wav", args.speed)
        short = (
            ""
            if len(texts) == n_files
            else (
                f", not the {n_files} asked for: its {len(books)} book(s) hold only {len(texts)} passages of "
                f"{args.words}+ words after their first 200 lines"
            )
        )
        print(f"{split}: {len(texts)} files in {folder}{short}", file=sys.stderr if short else sys.stdout)
    (args.out / "README.txt").write_text(
        "Synthetic speech (espeak-ng) reading passages of public-domain books; made by scripts/synth_speech.py\n"
        "(generator.json records the build, the options and every file's hash).\n"
    )
    record = generator_record(args, args.out)
    (args.out / "generator.json").write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
