"""What a run models: ``text`` (token ids of text), ``audio`` (8-bit μ-law samples, one per token) or ``continuous``
(vectors through ``model.input_dim``, an agent's observations). Read from the config alone, so every command can
refuse an input of another modality in one line before loading weights, and report units that fit the run."""

from __future__ import annotations

from compressive_transformer.core.config import ConfigError, RunConfig
from compressive_transformer.core.registry import corpus_format

TEXT, AUDIO, CONTINUOUS = "text", "audio", "continuous"
TOKEN_UNITS = {AUDIO: "sample"}  # what one token is where it is not a piece of text: metrics per sample


def format_modality(fmt: str) -> str:
    """The modality of the corpus format ``fmt`` (``data.format``)."""
    return AUDIO if corpus_format(fmt).token_unit == "sample" else TEXT


def run_modality(cfg: RunConfig) -> str:
    if cfg.model.input_dim > 0:
        return CONTINUOUS
    return format_modality(cfg.data.format)


def token_unit(modality: str) -> str:
    """What one token is called in reported units ("" for text: per token, character, byte and word)."""
    return TOKEN_UNITS.get(modality, "")


# a file is not text when it holds a NUL byte, control characters text does not use, or mostly bytes that are not
# UTF-8; text in a legacy encoding (Latin-1 accents: a few percent of its bytes) stays text
_CONTROL = "".join(chr(c) for c in range(32) if c not in (9, 10, 11, 12, 13, 27))  # all but tabs, breaks, ESC
MAX_CONTROL_SHARE, MAX_INVALID_SHARE = 0.05, 0.3


def binary_reason(document: str | bytes) -> str | None:
    """Why a file's content (bytes, or the text it decoded to) is not text, or None when it is."""
    if not document:
        return None
    raw = isinstance(document, bytes)
    nul = document.find(b"\x00" if raw else "\x00")
    if nul >= 0:
        return f"a NUL at {'byte' if raw else 'character'} {nul}"
    text = document.decode("utf-8", errors="replace") if raw else document
    control = sum(text.count(c) for c in _CONTROL) / len(text)
    if control > MAX_CONTROL_SHARE:
        return f"{control:.0%} control characters"
    invalid = text.count("\ufffd") / len(document) if raw else 0.0
    if invalid > MAX_INVALID_SHARE:
        return f"{invalid:.0%} of its bytes are not UTF-8"
    return None


def require_modality(have: str, given: str, what: str, remedy: str) -> None:
    """Refuse ``what`` (an input of modality ``given``) for a run of modality ``have``, in one line with ``remedy``:
    ``--text FILE: this run models audio, not text; score sound files with ...``."""
    if have != given:
        raise ConfigError(f"{what}: this run models {have}, not {given}; {remedy}")


__all__ = [
    "AUDIO",
    "CONTINUOUS",
    "TEXT",
    "binary_reason",
    "format_modality",
    "require_modality",
    "run_modality",
    "token_unit",
]
