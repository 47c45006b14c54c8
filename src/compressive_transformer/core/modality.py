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


def require_modality(have: str, given: str, what: str, remedy: str) -> None:
    """Refuse ``what`` (an input of modality ``given``) for a run of modality ``have``, in one line with ``remedy``:
    ``--text FILE: this run models audio, not text; score sound files with ...``."""
    if have != given:
        raise ConfigError(f"{what}: this run models {have}, not {given}; {remedy}")


__all__ = ["AUDIO", "CONTINUOUS", "TEXT", "format_modality", "require_modality", "run_modality", "token_unit"]
