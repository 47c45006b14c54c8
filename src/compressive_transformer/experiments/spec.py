"""Variant specs: one ``[base]`` run config and ``[variants.NAME]`` tables holding only what differs from it.

Shared by ``compare`` (one run per variant) and ``study`` (variants x seeds). A variant table may also carry keys
that are not run config (``extras``: e.g. a study's per-variant evaluation memories); they are returned apart.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from compressive_transformer.core.config import ConfigError, RunConfig, apply_run_overrides, load_toml
from compressive_transformer.core.config_base import merge_tables as merge


def load_variants(
    raw: dict[str, Any],
    path: str | Path,
    overrides: list[str] | tuple[str, ...] = (),
    *,
    tables: tuple[str, ...] = ("base", "variants"),
    extras: tuple[str, ...] = (),
) -> tuple[dict[str, RunConfig], dict[str, dict[str, Any]]]:
    """(variant name -> resolved RunConfig, variant name -> its ``extras`` tables); ``overrides``
    (section.key=value) apply to every variant. Top-level tables other than ``tables`` are errors."""
    unknown = sorted(set(raw) - set(tables))
    if unknown:
        known = ", ".join(f"[{t}]" if t != "variants" else "[variants.NAME]" for t in tables)
        raise ConfigError(f"{path}: unknown table [{unknown[0]}]; this spec has {known}")
    variants = raw.get("variants")
    if not isinstance(variants, dict) or not variants:
        raise ConfigError(f"{path}: no [variants.NAME] tables; add at least one variant")
    base = apply_run_overrides(raw.get("base", {}), overrides)
    configs, extra_tables = {}, {}
    for name, table in variants.items():
        if not isinstance(table, dict):
            raise ConfigError(f"{path}: variants.{name} must be a table")
        run_part = apply_run_overrides({k: v for k, v in table.items() if k not in extras}, ())
        extra_tables[name] = {k: v for k, v in table.items() if k in extras}
        try:
            configs[name] = RunConfig.from_raw(merge(base, run_part))
        except ConfigError as e:
            raise ConfigError(f"variants.{name}: {e}") from None
    return configs, extra_tables


def load_spec(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> dict[str, RunConfig]:
    """Variant name -> resolved RunConfig of a comparison spec (``[base]`` and ``[variants.NAME]`` only)."""
    configs, _ = load_variants(load_toml(path), path, overrides)
    return configs


__all__ = ["load_spec", "load_variants", "merge"]
