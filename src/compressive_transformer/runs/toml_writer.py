"""Write the plain nested dicts of :func:`config.to_dict` as TOML (the standard library only reads TOML)."""

from __future__ import annotations

import json
from typing import Any

from compressive_transformer.core.config import RunConfig, to_dict


def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v) if not isinstance(v, float) or v == v and abs(v) != float("inf") else _special(v)
    if isinstance(v, str):
        return json.dumps(v)  # JSON string escapes are valid TOML basic strings
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    raise TypeError(f"cannot write {v!r} as TOML")


def _special(v: float) -> str:
    return "nan" if v != v else ("inf" if v > 0 else "-inf")


def dumps(sections: dict[str, dict[str, Any]]) -> str:
    """``{"model": {...}, "train": {...}}`` -> TOML text with one table per section; ``None`` values are left out."""
    lines: list[str] = []
    for name, table in sections.items():
        lines.append(f"[{name}]")
        lines.extend(
            f"{key} = {_value(val)}" for key, val in table.items() if val is not None and not isinstance(val, dict)
        )
        lines.append("")
        nested = {f"{name}.{key}": val for key, val in table.items() if isinstance(val, dict)}  # e.g. [model.adaptive]
        if nested:
            lines.append(dumps(nested))
    return "\n".join(lines)


def config_text(cfg: RunConfig) -> str:
    """The resolved config of a run, as written to ``config.toml`` and into every checkpoint."""
    return "# resolved config of this run (written by compressive-transformer)\n" + dumps(to_dict(cfg))
