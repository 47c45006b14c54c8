"""Triton kernels on CPU tensors through Triton's interpreter, chosen per call rather than through the process
environment.

Triton compiles for GPUs only; its interpreter runs the same kernel code on NumPy. It is normally selected by setting
``TRITON_INTERPRET=1`` before the kernels are decorated, which changes every Triton user in the process. Instead,
:func:`interpreted` copies a ``@triton.jit`` kernel and each jitted helper it reaches into an ``InterpretedFunction``
over a private copy of its module's namespace: the compiled kernel (CUDA tensors) and the interpreted one (CPU
tensors) live side by side, and nothing reads or writes ``os.environ``. Copies are made on first use and kept.
"""

from __future__ import annotations

import functools
import types

import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction
from triton.runtime.jit import JITFunction

_JITTED = (JITFunction, InterpretedFunction)  # InterpretedFunction: decorated while TRITON_INTERPRET=1 was set
_namespaces: dict[int, tuple[dict, dict]] = {}  # id(module globals) -> (the globals, their interpreted copy)
_copies: dict[int, tuple[object, InterpretedFunction]] = {}  # id(kernel) -> (the kernel, its interpreted copy)


class _Language(types.ModuleType):
    """``triton.language`` as an interpreted kernel sees it: its own jitted functions (``tl.zeros``, ``tl.sum``, ...)
    interpreted, everything else read through at call time (the interpreter swaps the builtins while it runs)."""

    def __getattr__(self, name: str):
        value = getattr(tl, name)
        return interpreted(value) if isinstance(value, _JITTED) else value


@functools.cache
def _language() -> _Language:
    return _Language(tl.__name__)


def _namespace(module_globals: dict) -> tuple[dict, bool]:
    """The private copy of a module's namespace, and whether it was just made (its helpers still to be swapped)."""
    entry = _namespaces.get(id(module_globals))
    if entry is not None:
        return entry[1], False
    space = {name: _language() if value is tl else value for name, value in module_globals.items()}
    space["__triton_language__"] = tl  # where the interpreter looks for the modules whose builtins it swaps
    # ... and tl.core, so that a launch swaps (and then restores) its builtins too: a helper's call swaps them again
    # with nothing to restore them, and a kernel compiled for a GPU afterwards would build through the interpreter
    space["__triton_language_core__"] = tl.core
    _namespaces[id(module_globals)] = (module_globals, space)  # the original kept alive: its id stays unique
    return space, True


def interpreted(kernel) -> InterpretedFunction:
    """``kernel`` (a ``@triton.jit`` function) for CPU tensors: launch it as ``interpreted(kernel)[grid](...)``."""
    entry = _copies.get(id(kernel))
    if entry is not None:
        return entry[1]
    fn = kernel.fn
    space, new = _namespace(fn.__globals__)
    copy = types.FunctionType(fn.__code__, space, fn.__name__, fn.__defaults__, fn.__closure__)
    for attr in ("__annotations__", "__kwdefaults__", "__qualname__", "__module__", "__doc__"):
        setattr(copy, attr, getattr(fn, attr))  # annotations: the interpreter reads which arguments are constexpr
    result = InterpretedFunction(copy)
    _copies[id(kernel)] = (kernel, result)
    if new:  # after registering this copy, so helpers that call back into this module find it
        for name, value in fn.__globals__.items():
            if isinstance(value, _JITTED):
                space[name] = interpreted(value)
    return result


__all__ = ["interpreted"]
