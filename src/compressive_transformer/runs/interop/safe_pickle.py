"""A pickle reader that builds plain containers and strings only, for vocabularies shipped as pickles.

``pickle.load`` runs whatever callable a file names (``os.system`` included). This reader resolves no global but
``dict``, ``list``, ``tuple``, ``set``, ``frozenset``, ``collections.OrderedDict`` and ``collections.Counter``;
every other global a file names (a regex, a tokenizer object, ``os.system``) becomes an inert :class:`Opaque` value:
nothing is imported and nothing the file names is called. Callers then read only the plain fields they need.
"""

from __future__ import annotations

import collections
import io
import pickle
from pathlib import Path
from typing import Any

ALLOWED = {
    ("builtins", "dict"): dict,
    ("builtins", "list"): list,
    ("builtins", "tuple"): tuple,
    ("builtins", "set"): set,
    ("builtins", "frozenset"): frozenset,
    ("collections", "OrderedDict"): collections.OrderedDict,
    ("collections", "Counter"): collections.Counter,
}


class Opaque:
    """Stands for an object of a class the reader does not build. Subclasses carry the global's name; constructor
    arguments and pickled state are dropped, and item or attribute additions ignored."""

    name = "?"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __setstate__(self, state: Any) -> None:
        pass

    def __setitem__(self, key: Any, value: Any) -> None:
        pass

    def append(self, value: Any) -> None:
        pass

    def extend(self, values: Any) -> None:
        pass

    def add(self, value: Any) -> None:
        pass

    def __repr__(self) -> str:
        return f"Opaque({self.name})"


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        allowed = ALLOWED.get((module, name))
        # a type (the NEWOBJ opcode needs one) whose construction stores nothing and calls nothing of the file's
        return allowed if allowed is not None else type("Opaque", (Opaque,), {"name": f"{module}.{name}"})

    def persistent_load(self, pid: Any) -> Opaque:
        return Opaque()


def load_plain(path: str | Path) -> Any:
    """The pickled value at ``path`` with only plain containers and scalars built (see the module docstring)."""
    data = Path(path).read_bytes()
    return _Unpickler(io.BytesIO(data)).load()


__all__ = ["ALLOWED", "Opaque", "load_plain"]
