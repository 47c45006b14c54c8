"""CUDA graphs over explicit state: a step ``fn(inputs, state) -> (outputs, state)`` replayed as one launch.

The memories are explicit values (:class:`~compressive_transformer.core.memory.MemoryState`, a decoder's caches), so
a step's work is fixed by the tensors' shapes and by a few Python ints in the state (how full memory is, counters).
:class:`StaticGraphs` keeps, per set of shapes, one set of static buffers for the inputs and the state; each graph
reads the state from them and writes the next state back into them, so consecutive replays hand the state along
without copies and it never leaves the device. A graph is captured per value of the ints (the second time they occur:
the first run is eager and serves as the capture's warm-up), so a generation replays the c graphs of a full memory's
fill cycle and a training run the one graph of its steady state.
"""

from __future__ import annotations

from dataclasses import fields, replace
from typing import Any, Callable

import torch
from torch import Tensor

from compressive_transformer.core.attention import Tables

State = Any  # dataclasses, tuples and lists of tensors, ints and tables


def tensors_of(obj: State) -> list[Tensor]:
    """Every tensor of a state, in a fixed order; positional tables are constants, not state."""
    if isinstance(obj, Tables):
        return []
    if isinstance(obj, Tensor):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [t for item in obj for t in tensors_of(item)]
    if hasattr(obj, "__dataclass_fields__"):
        return [t for f in fields(obj) for t in tensors_of(getattr(obj, f.name))]
    return []


def key_of(obj: State) -> tuple:
    """What a graph is specialised on: the ints of a state, its tensors' shapes and dtypes, which tables it reads."""
    if isinstance(obj, Tables):
        return ("tables", id(obj))
    if isinstance(obj, Tensor):
        return ("tensor", tuple(obj.shape), obj.dtype)
    if isinstance(obj, (list, tuple)):
        return tuple(key_of(item) for item in obj)
    if hasattr(obj, "__dataclass_fields__"):
        return tuple(key_of(getattr(obj, f.name)) for f in fields(obj))
    return (obj,)


def rebuild(obj: State, tensors: list[Tensor]) -> State:
    """``obj`` with its tensors replaced, in :func:`tensors_of`'s order, by ``tensors`` (consumed from the front)."""
    if isinstance(obj, Tables):
        return obj
    if isinstance(obj, Tensor):
        return tensors.pop(0)
    if isinstance(obj, (list, tuple)):
        return type(obj)(rebuild(item, tensors) for item in obj)
    if hasattr(obj, "__dataclass_fields__"):
        return replace(obj, **{f.name: rebuild(getattr(obj, f.name), tensors) for f in fields(obj) if f.init})
    return obj


def copied(obj: State) -> State:
    """A state with every tensor cloned (what a caller may keep while the static buffers move on)."""
    return rebuild(obj, [t.clone() for t in tensors_of(obj)])


class CudaGraph:
    """A captured CUDA graph: :meth:`capture` records ``body`` without running it, :meth:`replay` runs it."""

    def __init__(self, pool) -> None:
        self.graph, self.pool = torch.cuda.CUDAGraph(), pool

    def capture(self, body: Callable[[], Any]) -> Any:
        torch.cuda.synchronize()
        with torch.cuda.graph(self.graph, pool=self.pool):
            return body()

    def replay(self) -> None:
        self.graph.replay()


class RecordedGraph:
    """A stand-in for :class:`CudaGraph` where there is no GPU (tests of everything around the capture on the CPU):
    "capturing" runs ``body`` once, the first replay is that run, every later replay runs it again and writes its
    outputs into the first run's tensors, as a graph's replay writes its static outputs."""

    def __init__(self, pool=None) -> None:
        self.body, self.outputs, self.fresh = None, None, False

    def capture(self, body: Callable[[], Any]) -> Any:
        self.body, self.fresh = body, True
        self.outputs = body()
        return self.outputs

    def replay(self) -> None:
        if self.fresh:
            self.fresh = False
            return
        for dst, src in zip(tensors_of(self.outputs), tensors_of(self.body())):
            if dst is not src:
                dst.copy_(src)


DEFAULT_GRAPH = CudaGraph  # tests substitute RecordedGraph to run everything around the capture on the CPU


class StaticGraphs:
    """``fn(inputs, state) -> (outputs, state)`` (inputs a tuple of tensors, outputs a tensor or a tuple of them)
    replayed as CUDA graphs; see the module docstring. The outputs a call returns are static buffers overwritten by the
    next replay (copy what must outlive it); so are the state's tensors, which a caller may hold and pass back."""

    def __init__(self, fn: Callable[[tuple[Tensor, ...], State], tuple[Any, State]]) -> None:
        self.fn = fn
        self.graph = DEFAULT_GRAPH
        self.seen: set[tuple] = set()
        self.graphs: dict[tuple, tuple[Any, Any, State]] = {}
        self.buffers: dict[tuple, tuple[list[Tensor], list[Tensor]]] = {}  # per shapes: static inputs and state
        self.pool = None

    def __call__(self, inputs: tuple[Tensor, ...], state: State) -> tuple[Any, State]:
        key = key_of((inputs, state))
        if key not in self.seen:  # the first run of a key: eager (the capture's warm-up, and a real step)
            self.seen.add(key)
            return self.fn(inputs, state)
        static_in, static_state = self._buffers(inputs, state)
        for dst, src in zip(static_in + static_state, list(inputs) + tensors_of(state)):
            if dst.data_ptr() != src.data_ptr():  # the state handed back by the last replay is already in place
                dst.copy_(src)
        if key not in self.graphs:
            self.graphs[key] = self._capture(tuple(static_in), rebuild(state, list(static_state)), static_state)
        graph, outputs, after = self.graphs[key]
        graph.replay()
        return outputs, rebuild(after, list(static_state))

    def _buffers(self, inputs: tuple[Tensor, ...], state: State) -> tuple[list[Tensor], list[Tensor]]:
        shapes = tuple((t.shape, t.dtype, t.device) for t in list(inputs) + tensors_of(state))
        if shapes not in self.buffers:
            self.buffers[shapes] = ([t.clone() for t in inputs], [t.clone() for t in tensors_of(state)])
        return self.buffers[shapes]

    def _capture(self, inputs: tuple[Tensor, ...], state: State, static_state: list[Tensor]) -> tuple:
        if self.pool is None and self.graph is CudaGraph:
            self.pool = torch.cuda.graph_pool_handle()
        graph = self.graph(self.pool)

        def body() -> tuple[Any, State]:
            outputs, new_state = self.fn(inputs, state)
            for dst, src in zip(static_state, tensors_of(new_state)):
                if dst is not src:
                    dst.copy_(src)
            return outputs, new_state

        outputs, new_state = graph.capture(body)
        return graph, outputs, new_state
