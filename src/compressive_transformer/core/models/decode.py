"""Token-by-token decoding: the model's own layers at T = 1, with the state that makes a token cost one token's work.

A step runs :meth:`CompressiveTransformerLM.layers` on one token: the same attention, blocks and Algorithm 1 memory
update that training runs. What generation needs to be fast the :class:`Decoder` derives from the weights and owns,
one :class:`LayerCache` per layer: the positional tables at T = 1 (projected once, not per token) and the keys and
values of every memory slot (projected once, when the slot enters memory or the compressed memory). The model holds
none of it. Because that state is derived from the weights, a decoder refuses to step once they change
(:class:`~.weight_watch.WriteWatch`).

On a GPU, ``Decoder(..., cuda_graphs=True)`` replays each step as a CUDA graph: a step's shapes depend only on the
memories' sizes, which are fixed, and on how full memory is, which cycles through c values once memory is full, so
c graphs (captured on first use, over one set of static buffers) serve the whole generation.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import Tensor

from compressive_transformer.core.attention import AttentionOutput, RelativeAttention, Tables
from compressive_transformer.core.graphs import StaticGraphs, copied, rebuild, tensors_of
from compressive_transformer.core.memory import Eviction, LayerMemory, MemoryState, compressed_for_attention
from compressive_transformer.core.models.checks import check_memory, check_step_tokens
from compressive_transformer.core.models.lm import CompressiveTransformerLM
from compressive_transformer.core.models.weight_watch import WriteWatch


def unsupported(model: torch.nn.Module) -> str | None:
    """Why ``model`` cannot be decoded with a :class:`Decoder` (then ``model.forward`` is used), or None."""
    cfg = getattr(model, "cfg", None)
    if not isinstance(model, CompressiveTransformerLM):
        return "only CompressiveTransformerLM has a token-by-token decoder"
    if cfg.input_dim > 0 or cfg.vocab_size == 0:
        return "continuous inputs or no LM head"
    return None


@dataclass(frozen=True)
class LayerCache:
    """One layer's inference state: positional tables at T = 1 and the keys and values of [cmem] and of [mem]."""

    tables: Tables
    k_cmem: Tensor  # (B, H, C, dh)
    v_cmem: Tensor
    k_mem: Tensor  # (B, H, M, dh)
    v_mem: Tensor

    @property
    def parts(self) -> list[tuple[Tensor, Tensor]]:
        return [(self.k_cmem, self.v_cmem), (self.k_mem, self.v_mem)]

    def advance(
        self, attn: AttentionOutput, state: LayerMemory, eviction: Eviction | None, module: RelativeAttention
    ) -> "LayerCache":
        """The keys and values of ``state``, the memory :func:`~compressive_transformer.core.memory.update_layer`
        made after the step whose attention read ``attn``'s keys [cmem; mem; x]: memory keeps the newest M of
        [mem; x] (a view of those keys), the compressed memory gains the keys of its new slots, the only ones
        projected."""
        C, M, K = state.cmem_len, state.capacity, attn.k.shape[2]
        kc, vc = self.k_cmem, self.v_cmem
        if eviction is not None and C > 0:
            g = min(eviction.compressed.shape[1], C)
            new_k, new_v = module.keys_values(state.cmem[:, C - g :])
            kc = torch.cat([kc[:, :, g:], new_k.to(kc.dtype)], dim=2)
            vc = torch.cat([vc[:, :, g:], new_v.to(vc.dtype)], dim=2)
        return replace(self, k_cmem=kc, v_cmem=vc, k_mem=attn.k[:, :, K - M :], v_mem=attn.v[:, :, K - M :])


def _as_step_view(x: Tensor, n_cmem: int) -> Tensor:
    """The memory's keys or values (B, H, M, dh) laid out as every step leaves them, the newest M of a step's
    C + M + 1 keys, so that a compiled step sees the same strides from the first token on."""
    B, H, M, dh = x.shape
    step = x.new_zeros(B, H, n_cmem + M + 1, dh)
    step[:, :, n_cmem + 1 :] = x
    return step[:, :, n_cmem + 1 :]


class Decoder:
    """Advances ``memory`` one token at a time for ``model`` in eval mode.

    Its tables and keys/values are derived from the weights when it is made, so it is scoped to them: after any write
    to the weights (an optimizer step of any ``torch.optim`` optimizer, fused or not, a ``load_state_dict``, an
    in-place op, or ``model.weights_changed()`` after a hand-made ``.data`` write) ``step`` raises; make a new Decoder
    from :meth:`memory`. ``compile``: each step under ``torch.compile`` (one graph per memory fill, c of them once
    memory is full; the first tokens pay the compilation); ``cuda_graphs``: each step replayed as a CUDA graph."""

    def __init__(
        self, model: CompressiveTransformerLM, memory: MemoryState, *, compile: bool = False, cuda_graphs: bool = False
    ) -> None:
        reason = unsupported(model)
        if reason is not None:
            raise ValueError(f"no decoder for this model: {reason}; use model(...) one token at a time")
        if model.training:
            raise ValueError("decode in eval mode: call model.eval() first")
        param = next(model.parameters())
        rows = memory.batch_size if isinstance(memory, MemoryState) else 0
        check_memory(
            model.cfg,
            memory,
            batch_size=rows,
            n_layers=len(model.blocks),
            dtype=param.dtype,
            device=param.device,
            compressive=True,
        )
        self.model = model
        self._tables: dict[int, list[Tables]] = {}  # per compressed-stream offset (the fill, for shared positions)
        memory = rebuild(memory, [t.contiguous() for t in tensors_of(memory)])  # the layout every later step has
        with torch.no_grad():
            tables = self._tables_for(memory)
            self._caches = []
            for block, layer, comp, t in zip(model.blocks, memory.layers, self._compressors(), tables):
                kc, vc = block.attn.keys_values(compressed_for_attention(layer, comp))
                km, vm = block.attn.keys_values(layer.mem)
                C = layer.cmem_len
                self._caches.append(
                    LayerCache(t, kc.contiguous(), vc.contiguous(), _as_step_view(km, C), _as_step_view(vm, C))
                )
        self._memory = memory
        self._watch = WriteWatch(model.parameters())
        self._ones = torch.ones(memory.batch_size, 1, dtype=torch.bool, device=memory.layers[0].mem.device)
        run = torch.compile(self._run, fullgraph=True) if compile else self._run
        self._graphs = StaticGraphs(lambda inputs, state: run(inputs[0], *state)) if cuda_graphs else None
        self._step = run

    def _compressors(self) -> list:
        comps = self.model.compressors
        return list(comps) if comps is not None else [None] * len(self.model.blocks)

    def _tables_for(self, memory: MemoryState) -> list[Tables]:
        """Each layer's tables at T = 1 for ``memory``: they depend on its fill only when the two positional streams
        are shared (the compressed stream's distances then start past the memory's)."""
        model, first = self.model, memory.layers[0]
        key = first.fill if model.cfg.positions.cmem == "shared" else 0
        if key not in self._tables:
            ref = first.mem
            positions = model.positions(first, 1, device=ref.device, dtype=ref.dtype)
            self._tables[key] = [block.attn.tables(positions) for block in model.blocks]
        return self._tables[key]

    def _run(
        self, tokens: Tensor, memory: MemoryState, caches: list[LayerCache]
    ) -> tuple[Tensor, tuple[MemoryState, list[LayerCache]]]:
        """One token per row, tokens (B, 1): the model's layers over the caches; the next-token logits (B, V)."""
        model = self.model
        out = model.layers(model.input(tokens), memory, self._ones, caches=caches)
        _, logits, _ = model.output(out.h, None)
        return logits[:, -1], (out.memory, out.caches)

    @torch.no_grad()
    def step(self, tokens: Tensor) -> Tensor:
        """Feed one token per row, tokens: (B,) ids; returns the next-token logits (B, V). Tokens of another
        shape, type or device, or ids outside the vocabulary, are a one-line ``ValueError``."""
        if self._watch.written:
            raise RuntimeError("the model's weights changed while decoding; make a new Decoder from decoder.memory()")
        check_step_tokens(self.model.cfg, tokens, batch_size=self._memory.batch_size, device=self._ones.device)
        tables = self._tables_for(self._memory)
        caches = [replace(c, tables=t) for c, t in zip(self._caches, tables)]
        tokens = tokens.reshape(-1, 1)
        if self._graphs is not None:
            logits, (self._memory, self._caches) = self._graphs((tokens,), (self._memory, caches))
            return logits.clone()  # a static buffer: the next replay overwrites it
        logits, (self._memory, self._caches) = self._step(tokens, self._memory, caches)
        return logits

    def memory(self) -> MemoryState:
        """The model's memory after the tokens fed so far, as ``model.forward`` returns it (a copy when CUDA graphs
        run the steps: theirs is overwritten in place by the next one)."""
        return self._memory if self._graphs is None else copied(self._memory)
