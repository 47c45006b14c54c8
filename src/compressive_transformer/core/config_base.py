"""What every config section is built on: :class:`ConfigError` and :func:`require` (one line naming the key and the
fix), type checks of frozen dataclass fields, and the generic loading: mappings to dataclasses, TOML files, dotted
``section.key=value`` overrides."""

from __future__ import annotations

import dataclasses
import functools
import math
import numbers
import sys
import types
import typing
from pathlib import Path
from typing import Any, Callable, Mapping, TypeVar

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised only on Python 3.10
    import tomli as tomllib


class ConfigError(ValueError):
    """A configuration a user wrote cannot work; the message names the key and the fix."""


T = TypeVar("T")
Log = Callable[[str], None]  # where one-line notes for the user go (print, a progress bar's write, a file)


def require(ok: bool, key: str, message: str) -> None:
    """Stop with a one-line :class:`ConfigError` naming ``key`` unless ``ok``."""
    if not ok:
        raise ConfigError(f"{key}: {message}")


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _type_ok(value: Any, annotation: Any) -> bool:
    """Whether ``value`` has the annotated type (an int passes for a float; bools never pass for numbers)."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return any(_type_ok(value, a) for a in typing.get_args(annotation))
    if annotation is type(None):
        return value is None
    if dataclasses.is_dataclass(annotation):
        return isinstance(value, annotation)
    if origin is tuple:
        args = [a for a in typing.get_args(annotation) if a is not Ellipsis] or [Any]
        return isinstance(value, (tuple, list)) and all(_type_ok(v, args[0]) for v in value)
    if annotation is bool:
        return isinstance(value, bool)
    if annotation is int:
        return isinstance(value, numbers.Integral) and not isinstance(value, bool)
    if annotation is float:
        return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
    if annotation is str:
        return isinstance(value, str)
    return True


def check_types(obj: Any, section: str) -> None:
    """Every field of a config dataclass has its annotated type: ``ModelConfig(d_model="32")`` fails here, in one
    line naming the key, rather than somewhere inside torch."""
    for name, annotation in _hints(type(obj)).items():
        value = getattr(obj, name)
        if not _type_ok(value, annotation):
            kind = getattr(annotation, "__name__", None) or str(annotation).replace("typing.", "")
            raise ConfigError(
                f"{section}.{name}: expected {kind}{' (finite)' if annotation is float else ''}, got {value!r}"
            )


# --------------------------------------------------------------------------------------------------------------
# Generic loading: dicts -> frozen dataclasses, TOML files, dotted overrides.


def _coerce(value: Any, annotation: Any, key: str) -> Any:
    """Turn a TOML value into the annotated type (lists into tuples, ints into floats); reject what cannot fit."""
    if isinstance(annotation, str):
        annotation = eval(annotation, vars(typing) | {"tuple": tuple})  # postponed annotations of this module
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(annotation)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, key)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(errors[0] if errors else f"{key}: cannot be {value!r}")
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}: expected a list, got {value!r}")
        (inner, *_rest) = typing.get_args(annotation) or (Any,)
        return tuple(_coerce(v, inner, key) for v in value)
    if dataclasses.is_dataclass(annotation) and isinstance(value, Mapping):  # a nested table, e.g. [model.adaptive]
        return from_dict(annotation, value, key)
    if annotation is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if annotation in (int, float, str, bool):
        if type(value) is not annotation:
            raise ConfigError(f"{key}: expected {annotation.__name__}, got {value!r}")
        return value
    return value


def from_dict(cls: type[T], data: Mapping[str, Any], section: str) -> T:
    """Build the frozen dataclass ``cls`` from a mapping; unknown keys and wrong types are errors naming the key."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{section}: expected a table of keys, got {data!r}")
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ConfigError(f"{section}.{unknown[0]}: unknown key; known keys are {', '.join(sorted(fields))}")
    hints = typing.get_type_hints(cls)
    kwargs = {k: _coerce(v, hints[k], f"{section}.{k}") for k, v in data.items()}
    return cls(**kwargs)


def to_dict(obj: Any) -> dict[str, Any]:
    """A dataclass as plain TOML/JSON-friendly values (tuples become lists)."""

    def plain(v: Any) -> Any:
        if dataclasses.is_dataclass(v):
            return {f.name: plain(getattr(v, f.name)) for f in dataclasses.fields(v)}
        if isinstance(v, (tuple, list)):
            return [plain(x) for x in v]
        if isinstance(v, Path):
            return str(v)
        return v

    return plain(obj)


def load_toml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist; pass the path of a TOML file (see configs/)")
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: not valid TOML ({e}); fix the file") from None


def parse_override(text: str) -> tuple[list[str], Any]:
    """``"train.lr=3e-4"`` -> (["train", "lr"], 0.0003). Values are TOML literals; bare words are strings."""
    if "=" not in text:
        raise ConfigError(f"override {text!r}: write it as section.key=value")
    key, raw = text.split("=", 1)
    parts = key.strip().split(".")
    if len(parts) < 2 or not all(parts):
        raise ConfigError(f"override {text!r}: the key must be dotted, e.g. model.memory.mem_len=256")
    try:
        value = tomllib.loads(f"v = {raw.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw.strip()
    return parts, value


def apply_overrides(
    raw: Mapping[str, Any],
    overrides: list[str] | tuple[str, ...],
    rename: Callable[[list[str], Any], list[str]] | None = None,
) -> dict[str, Any]:
    """Return a copy of ``raw`` with each dotted override set (the dataclasses then reject unknown keys); ``rename``
    maps an override's path (given its value) to where the key lives now."""
    out: dict[str, Any] = _deepcopy(raw)
    for text in overrides:
        parts, value = parse_override(text)
        if rename is not None:
            parts = rename(parts, value)
        node = out
        for p in parts[:-1]:
            child = node.setdefault(p, {})
            if not isinstance(child, dict):
                raise ConfigError(f"override {text!r}: {p} is a value, not a section")
            node = child
        node[parts[-1]] = value
    return out


def merge_tables(base: Mapping[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``extra`` laid over it, tables merged key by key."""
    out = dict(base)
    for key, value in extra.items():
        both = isinstance(value, Mapping) and isinstance(out.get(key), Mapping)
        out[key] = merge_tables(out[key], value) if both else value
    return out


def flatten(tables: Mapping[str, Any]) -> dict[str, Any]:
    """Nested tables as one mapping of dotted keys (``model.compression.rate``), as overrides write them."""
    out: dict[str, Any] = {}
    for key, value in tables.items():
        out |= {f"{key}.{k}": v for k, v in flatten(value).items()} if isinstance(value, Mapping) else {key: value}
    return out


def unflatten(dotted: Mapping[str, Any]) -> dict[str, Any]:
    """The inverse of :func:`flatten`: dotted keys as nested tables."""
    out: dict[str, Any] = {}
    for key, value in dotted.items():
        *tables, name = key.split(".")
        node = out
        for t in tables:
            node = node.setdefault(t, {})
        node[name] = value
    return out


def _deepcopy(d: Mapping[str, Any]) -> dict[str, Any]:
    return {k: _deepcopy(v) if isinstance(v, Mapping) else v for k, v in d.items()}


__all__ = [
    "ConfigError",
    "Log",
    "apply_overrides",
    "check_types",
    "flatten",
    "from_dict",
    "load_toml",
    "merge_tables",
    "parse_override",
    "require",
    "to_dict",
    "tomllib",
    "unflatten",
]
