"""The ``audio`` corpus format: a directory of sound files, each one stream of 8-bit μ-law samples.

Every file is read mono at ``data.sample_rate`` (resampled with soxr where it differs) and μ-law encoded, so one
sample is one byte and the byte tokenizer's ids are the codes (vocabulary 256). A file is a document: memory is
carried through it and reset at the next, as for the books of PG-19. Splits follow the text format's rules:
``train/ validation/ test/`` subdirectories when present, else the files (found recursively, sorted by path) are
split 90/5/5 by count. ``data download librispeech-dev-clean`` fetches a real speech corpus that fits this layout.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

from compressive_transformer.core.config import ConfigError, DataConfig
from compressive_transformer.data.documents import DocumentSource, FileList, Piece, SplitStream, rechunk
from compressive_transformer.data.download import Source
from compressive_transformer.data.mulaw import mulaw_encode
from compressive_transformer.data.readers import RawSplit, existing_path, materialize, split_directory
from compressive_transformer.data.soundfiles import AUDIO_SUFFIXES, downmix_note, read_audio_channels


def files(cfg: DataConfig, split: str) -> FileList:
    """The sound files of ``split``, without reading them."""
    root = existing_path(cfg)
    if root.is_file():
        raise ConfigError(f"data.path: {root} is one file; the audio format reads a directory of sound files")
    return split_directory(root, split, _sound_files, "sound")


def _sound_files(directory: Path) -> FileList:
    files = FileList.of(sorted(p for p in directory.rglob("*") if p.suffix.lower() in AUDIO_SUFFIXES and p.is_file()))
    if not files:
        raise ConfigError(
            f"data.path: {directory} has no sound files ({', '.join(AUDIO_SUFFIXES)}); point it at a folder of WAV files"
        )
    return files


def encode_file(path: Path, sample_rate: int) -> tuple[bytes, int]:
    """One file as its μ-law codes, one byte per sample at ``sample_rate``, and its number of channels."""
    samples, channels = read_audio_channels(path, sample_rate)
    return mulaw_encode(samples).tobytes(), channels


def stream(cfg: DataConfig, split: str) -> SplitStream:
    """One document per sound file, decoded when the stream reaches it."""
    paths = files(cfg, split)
    root = existing_path(cfg)
    channels: dict[Path, int] = {}

    def document(path: Path) -> DocumentSource:
        def pieces() -> Iterator[Piece]:
            codes, channels[path] = encode_file(path, cfg.sample_rate)
            for i, text in enumerate(rechunk([codes])):
                yield Piece(text, path.stat().st_size if i == 0 else 0)

        return DocumentSource(str(path.relative_to(root)), path.stat().st_size, (path,), pieces)

    def notes() -> list[str]:
        read = [p for p in paths if p in channels]
        note = downmix_note(read, [channels[p] for p in read])
        return [note] if note is not None else []

    return SplitStream(split, [document(p) for p in paths], tuple(paths), notes)


def read(cfg: DataConfig, split: str) -> RawSplit:
    return materialize(stream(cfg, split))


# LibriSpeech dev-clean (OpenSLR 12, CC BY 4.0): 5.4 hours of read English speech, 16 kHz FLAC, 40 speakers.
# Size and sha256 of the archive as published (its md5 is in the corpus's md5sum.txt: 42e2234ba48799c1f50f24a7926300a1).
LIBRISPEECH_DEV_CLEAN = Source(
    url="https://www.openslr.org/resources/12",
    filename="dev-clean.tar.gz",
    size=337_926_286,
    sha256="76f87d090650617fca0cac8f88b9416e0ebf80350acb97b343a85fa903728ab3",
    members={"LibriSpeech/dev-clean/": None},
    target="LibriSpeech/dev-clean",
)

SOURCES = {"librispeech-dev-clean": LIBRISPEECH_DEV_CLEAN}
