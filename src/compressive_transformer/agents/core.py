"""Memory cores for agents: one observation embedding per environment per step in, features for the heads out.

A core carries one memory row per environment and empties the row of an environment whose episode starts at this
step (``first``), before the step reads it. Two kinds share one interface:

- :class:`TransformerCore`: any model of the family (Transformer-XL, the Compressive Transformer, GTrXL gating via
  ``model.gating``) run as segments of one step. Memory is the library's :class:`MemoryState`, updated by the same
  function as in training on text, so it is detached between steps: the task loss reaches how memory is *read*
  (queries, keys, values of the slots), not what was *written* at earlier steps, exactly as gradients stop at the
  memory of earlier segments in text training with ``seg_len = 1``.
- :class:`LSTMCore`: the baseline the paper replaced, back-propagating through the whole unroll (truncated at its
  start).

``unroll`` over T steps is ``step`` applied T times (the reference). A transformer core's memory is detached between
steps, so a learner that has the memory each step read (``CoreOutput.read``, recorded while acting) can process all
T steps as one batch: :meth:`TransformerCore.replay` runs the T x B rows in one model call per memory fill (all rows
of a call must share it: one call for Transformer-XL, at most c for the Compressive Transformer once memory is full).
Features and gradients equal stepping's to float tolerance, which the tests pin.

Compression groups follow the global step count, which all rows share; an episode that starts in the middle of a
group loses from the compressed memory the states of its first, partial group (they are compressed together with
the previous episode's and that slot is invalid). Episodes whose length is a multiple of the compression rate (the
``nonmatching`` environment's default) never start mid-group.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Sequence

import torch
from torch import Tensor, nn

from compressive_transformer.agents.config import QL_REFUSAL
from compressive_transformer.core.config import ConfigError, ModelConfig
from compressive_transformer.core.memory import ROW_TENSORS, MemoryState
from compressive_transformer.core.models.kinds import build_model

CoreState = Any  # MemoryState for a transformer core, (h, c) for the LSTM core


@dataclass
class CoreOutput:
    features: Tensor  # (B, d) from step, (T, B, d) from unroll
    state: CoreState  # the memory after the last step (replay: None, it does not advance memory)
    aux_loss: Tensor  # compression loss (mean over steps); its gradient reaches only the compressor
    read: CoreState = None  # step: the memory this step read (after the resets), what replay needs


class TransformerCore(nn.Module):
    """A memory model over observation embeddings: ``model.input_dim`` floats per step, ``model.d_model`` features."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        if cfg.input_dim <= 0 or cfg.vocab_size != 0:
            raise ValueError("an agent core reads embeddings: set model.input_dim > 0 and model.vocab_size = 0")
        if cfg.is_ql:
            raise ConfigError(f"model.ql: {QL_REFUSAL}")
        self.cfg = cfg
        self.model = build_model(cfg)
        self.features = cfg.d_model

    def initial_state(self, n_envs: int) -> MemoryState:
        return self.model.init_memory(n_envs)

    def step(self, x: Tensor, state: MemoryState, first: Tensor) -> CoreOutput:
        """x: (B, input_dim); first: (B,) bool, True where an episode starts with this observation."""
        state = self.read_state(state, first)
        out = self.model(x.unsqueeze(1), state)  # one segment of one step
        return CoreOutput(out.hidden[:, 0], out.memory, out.aux_loss, read=state)

    @staticmethod
    def read_state(state: MemoryState, first: Tensor) -> MemoryState:
        """The memory a step reads: ``state`` with the rows of environments whose episode starts emptied."""
        return state.reset(first) if bool(first.any()) else state

    def replay(self, x: Tensor, reads: Sequence[MemoryState]) -> CoreOutput:
        """The T steps of x (T, B, input_dim) as batches of rows, each step reading its recorded memory ``reads[t]``
        (what ``step`` returned as ``read``). The compression loss is averaged over the valid queries of all rows
        of a call (stepping averages per step first), weighted by the steps per call."""
        T, B = x.shape[:2]
        calls: dict[tuple, list[int]] = {}
        for t, read in enumerate(reads):  # rows of one call share fill (and, under BPTT, the young slots' ages)
            calls.setdefault(tuple((layer.fill, layer.young) for layer in read.layers), []).append(t)
        rows: list[Tensor | None] = [None] * T
        aux = x.new_zeros(())
        for steps in calls.values():
            memory = stack_rows([reads[t] for t in steps])
            out = self.model(x[steps].reshape(len(steps) * B, 1, -1), memory)  # (len(steps) * B, 1, d_model)
            hidden = out.hidden.view(len(steps), B, -1)
            for i, t in enumerate(steps):
                rows[t] = hidden[i]
            aux = aux + out.aux_loss * (len(steps) / T)
        return CoreOutput(torch.stack(rows), None, aux)

    def unroll(self, x: Tensor, state: MemoryState, first: Tensor) -> CoreOutput:
        """x: (T, B, input_dim); first: (T, B) bool."""
        return _unroll(self, x, state, first)

    def state_tensors(self, state: MemoryState) -> dict[str, Tensor]:
        return state.to_tensors()

    def state_from_tensors(self, tensors: dict[str, Tensor]) -> MemoryState:
        return MemoryState.from_tensors(tensors)


class LSTMCore(nn.Module):
    """An LSTM cell over observation embeddings; its state is zeroed where an episode starts."""

    def __init__(self, input_dim: int, hidden: int) -> None:
        super().__init__()
        self.cell = nn.LSTMCell(input_dim, hidden)
        self.features = hidden

    def initial_state(self, n_envs: int) -> tuple[Tensor, Tensor]:
        zeros = torch.zeros(n_envs, self.features)
        return zeros, zeros.clone()

    def step(self, x: Tensor, state: tuple[Tensor, Tensor], first: Tensor) -> CoreOutput:
        keep = (~first).to(x.dtype).unsqueeze(1)  # (B, 1)
        h, c = self.cell(x, (state[0] * keep, state[1] * keep))
        return CoreOutput(h, (h, c), x.new_zeros(()))

    def unroll(self, x: Tensor, state: tuple[Tensor, Tensor], first: Tensor) -> CoreOutput:
        return _unroll(self, x, state, first)

    def state_tensors(self, state: tuple[Tensor, Tensor]) -> dict[str, Tensor]:
        return {"h": state[0].detach(), "c": state[1].detach()}

    def state_from_tensors(self, tensors: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
        return tensors["h"], tensors["c"]


def _unroll(core: TransformerCore | LSTMCore, x: Tensor, state: CoreState, first: Tensor) -> CoreOutput:
    """``core.step`` over the T steps of x (T, B, d_in); features (T, B, d) and the mean compression loss."""
    features, aux = [], []
    for t in range(x.shape[0]):
        out = core.step(x[t], state, first[t])
        features.append(out.features)
        aux.append(out.aux_loss)
        state = out.state
    return CoreOutput(torch.stack(features), state, torch.stack(aux).mean())


def stack_rows(states: Sequence[MemoryState]) -> MemoryState:
    """One memory whose rows are those of ``states`` in order (the same fill and lengths)."""
    first = states[0]
    layers = []
    for i, layer in enumerate(first.layers):
        parts = [s.layers[i] for s in states]
        if any(p.fill != layer.fill or p.young != layer.young for p in parts):
            raise ValueError("stack_rows: memories of different fill cannot share a batch")
        joined = {
            name: torch.cat([getattr(p, name) for p in parts])
            for name in ROW_TENSORS
            if getattr(layer, name) is not None
        }
        layers.append(replace(layer, **joined))
    return MemoryState(tuple(layers))


def join_states(states: Sequence[CoreState]) -> CoreState:
    """One core state whose rows are those of ``states`` in order (memories, or the LSTM's (h, c))."""
    if isinstance(states[0], MemoryState):
        return stack_rows(states)
    return tuple(torch.cat(parts) for parts in zip(*states))


def detach_state(state: CoreState) -> CoreState:
    """The state with no graph behind it (the start of the next unroll)."""
    if isinstance(state, MemoryState):
        return state.detach()
    return tuple(t.detach() for t in state)


__all__ = ["CoreOutput", "CoreState", "LSTMCore", "TransformerCore", "detach_state", "join_states", "stack_rows"]
