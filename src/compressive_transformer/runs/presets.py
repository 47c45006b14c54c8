"""Built-in run configs, so ``train`` without ``--config`` and ``demo`` work from any install.

They are package data (``compressive_transformer/configs/*.toml``), the same text as ``configs/tiny.toml`` and
``configs/pydoc-cpu.toml`` of the repository (a test keeps them in sync).
"""

from __future__ import annotations

from importlib.resources import files


def packaged_config(name: str) -> str:
    """The text of the packaged config ``name`` (e.g. ``"tiny.toml"``)."""
    return files("compressive_transformer").joinpath("configs", name).read_text(encoding="utf-8")


TINY_TOML = packaged_config("tiny.toml")
DEMO_TOML = packaged_config("pydoc-cpu.toml")

__all__ = ["DEMO_TOML", "TINY_TOML", "packaged_config"]
