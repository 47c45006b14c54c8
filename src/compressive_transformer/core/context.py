"""How far back a model sees: minimum, maximum and average context length of Transformer-XL, the Compressive
Transformer and Transformer-QL, and the Compressive Transformer paper's temporal range with its attention cost.

The definitions are the Transformer-QL paper's (section 2.1 and Appendix B), so that numbers
computed here can be compared with its tables:

- the *context length* of an output state is the number of past tokens it depends on;
- the *minimum* context length is the smallest over the output states of a segment (its first position);
- the *maximum* context length is the minimum plus the segment length ``n_s`` (Appendix B: "adding n_s to the
  minimum"); it counts the newest output's own token, so the strictly-past count of the newest output is
  ``max - 1``;
- the *average* context length is ``(min + max) / 2`` (Table 1's caption).

Per model:

- Transformer-XL, ``l`` layers: ``min = l * n_m`` (section 3.1);
- Compressive Transformer: ``min = l * (n_m + c * n_cm)``. Rae et al. (section 3.3) call ``l x (n_m + c * n_cm)``
  the *maximum temporal range*; it is what the oldest query of a segment reaches, so in the QL paper's terms it is
  the minimum, and the QL paper's Table 1 (04/06/06 -> 146 = (144 + 148) / 2) counts it that way;
- Transformer-QL: the algorithm of Appendix B (Figure 4), written for a general compression rate ``c``.

These are exact (checked against a brute-force dependency simulation in ``tests/reference_context.py``) when every
memory that a later layer reads is a whole number of shifts: a single layer, or ``n_s`` divides ``n_m``
(Transformer-XL), or ``n_s`` divides ``n_m + c * n_cm`` (Compressive Transformer); for Transformer-QL, ``n_m >= 1``
and at every scale the shift length ``n_s / c**i`` divides that scale's memory length. Otherwise a memory's oldest
slot lands mid-segment, the next layer reaches a little further back, and the value here is a lower bound on the
true minimum (the paper's tables use it that way, e.g. for the 04/06/06 Compressive Transformer).
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from compressive_transformer.core.config import ConfigError, ModelConfig
from compressive_transformer.core.registry import model_kind

MODELS = ("transformer-xl", "compressive", "transformer-ql")
_ALIASES = {
    "transformer-xl": "transformer-xl",
    "transformerxl": "transformer-xl",
    "txl": "transformer-xl",
    "xl": "transformer-xl",
    "compressive": "compressive",
    "compressive-transformer": "compressive",
    "transformer-ql": "transformer-ql",
    "transformerql": "transformer-ql",
    "ql": "transformer-ql",
}


@dataclass(frozen=True)
class ContextLength:
    """Context lengths in tokens, as the Transformer-QL paper defines them (see the module docstring)."""

    min: int
    max: int
    average: float


def _int(value: Any, name: str, lowest: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{name}: must be an integer, got {value!r}")
    if value < lowest:
        raise ConfigError(f"{name}: must be >= {lowest}, got {value}")
    return value


def _result(minimum: int, seg_len: int) -> ContextLength:
    maximum = minimum + seg_len
    return ContextLength(min=minimum, max=maximum, average=(minimum + maximum) / 2)


def transformer_ql_min_context(
    *, seg_len: int, mem_len: int, scales: tuple[int, ...], compression_rate: int, output_layers: int
) -> int:
    """Appendix B (Figure 4) of the Transformer-QL paper, for any compression rate ``c``.

    Scale ``i`` (0-based) works on states that each summarise ``c**i`` tokens; its segment holds
    ``min(W / c, n_s)`` states for ``i >= 1`` (the compression keeps the last ``n_s^{i-1}`` of the ``W / c``
    pooled states, ``W = n_s + n_m``), its memory the rest of the window ``W``, and each step shifts
    ``n_s / c**i`` states into memory. A Transformer-XL layer at scale ``i`` reaches ``n_m^i`` states, i.e.
    ``n_m^i * c**i`` tokens, further back. The compression into scale ``i + 1`` pools ``c * n_s^{i+1}`` states of
    scale ``i``, which reach ``min(n_m^i, (c - 1) * n_s^i)`` states into that scale's memory. The output layers
    work on tokens again with memory ``n_m``. Arguments are assumed validated (see :func:`context_length`).

    Against the paper's listing (written for ``c = 2``): ``cur_slen`` there is the shift length ``cur_shift`` here,
    line 10 adds ``min(cur_mlen, n_s) * n_s / cur_slen`` (``min(n_m^i, (c - 1) n_s^i)`` is its form for any ``c``)
    and line 11's ``(n_m + n_s) / 2`` is ``W / c``.
    """
    c, window = compression_rate, seg_len + mem_len
    cur_seg, cur_mem, cur_shift = seg_len, mem_len, seg_len  # in states of the current scale
    layer_reach = mem_len  # tokens one Transformer-XL layer of the current scale adds
    min_clen = 0
    for i, n_layers in enumerate(scales):
        min_clen += n_layers * layer_reach
        if i + 1 < len(scales):
            min_clen += min(cur_mem, (c - 1) * cur_seg) * (seg_len // cur_shift)
            cur_seg = min(window // c, cur_seg)
            cur_mem = window - cur_seg
            cur_shift //= c
            layer_reach = cur_mem * (seg_len // cur_shift)
    return min_clen + output_layers * mem_len


def context_length(
    cfg: Any = None,
    *,
    model: str | None = None,
    seg_len: int | None = None,
    mem_len: int | None = None,
    n_layers: int | None = None,
    cmem_len: int = 0,
    compression_rate: int = 1,
    scales: tuple[int, ...] | None = None,
    output_layers: int = 0,
) -> ContextLength:
    """Context lengths of one model of the family: ``context_length(cfg)`` for a model config, or the shape given
    by keywords (``model`` one of ``MODELS``).

    ``model`` is ``"transformer-xl"``, ``"compressive"`` or ``"transformer-ql"``. Transformer-XL and the
    Compressive Transformer need ``n_layers``; Transformer-QL needs ``scales`` (layers per temporal scale, finest
    first) and optionally ``output_layers``; its ``n_layers``, when given, must be their total. Transformer-QL
    needs ``seg_len`` divisible by ``c ** (len(scales) - 1)`` and ``seg_len + mem_len`` divisible by ``c``
    (the paper's integer-division assumption: whole pooling groups and whole shifts at every scale).
    """
    if cfg is not None:
        if model is not None or seg_len is not None or mem_len is not None:
            raise ConfigError("context_length: give a config or keywords, not both")
        return context_length_from_config(cfg)
    if not isinstance(model, str) or model not in MODELS:
        raise ConfigError(f"model: unknown {model!r}; use one of {', '.join(MODELS)}")
    seg_len = _int(seg_len, "seg_len", 1)
    mem_len = _int(mem_len, "mem_len", 0)
    cmem_len = _int(cmem_len, "cmem_len", 0)
    c = _int(compression_rate, "compression_rate", 1)
    output_layers = _int(output_layers, "output_layers", 0)

    if model in ("transformer-xl", "compressive"):
        if n_layers is None:
            raise ConfigError(f"n_layers: required for model {model!r}")
        n_layers = _int(n_layers, "n_layers", 1)
        if scales is not None:
            raise ConfigError("scales: only Transformer-QL has scales; use model='transformer-ql' or drop scales")
        if output_layers:
            raise ConfigError("output_layers: only Transformer-QL has output layers; count them in n_layers")
        if model == "transformer-xl":
            if cmem_len:
                raise ConfigError("cmem_len: Transformer-XL has no compressed memory; use model='compressive'")
            return _result(n_layers * mem_len, seg_len)
        return _result(n_layers * (mem_len + c * cmem_len), seg_len)

    if cmem_len:
        raise ConfigError("cmem_len: Transformer-QL has no compressed memory; set cmem_len=0")
    if scales is None or isinstance(scales, (str, bytes)) or len(tuple(scales)) == 0:
        raise ConfigError("scales: Transformer-QL needs a non-empty list of layers per scale, e.g. (3, 3)")
    scales = tuple(_int(n, "scales", 1) for n in scales)
    if n_layers is not None and _int(n_layers, "n_layers", 1) != sum(scales) + output_layers:
        raise ConfigError(
            f"n_layers: {n_layers} differs from sum(scales) + output_layers = {sum(scales) + output_layers}"
        )
    shrink = c ** (len(scales) - 1)
    if seg_len % shrink:
        raise ConfigError(
            f"seg_len: {seg_len} is not divisible by compression_rate ** (len(scales) - 1) = {shrink}; "
            "every scale must shift a whole number of states"
        )
    if len(scales) > 1 and (seg_len + mem_len) % c:
        raise ConfigError(
            f"mem_len: seg_len + mem_len = {seg_len + mem_len} is not divisible by compression_rate = {c}; "
            "the pooling needs whole groups"
        )
    minimum = transformer_ql_min_context(
        seg_len=seg_len, mem_len=mem_len, scales=scales, compression_rate=c, output_layers=output_layers
    )
    return _result(minimum, seg_len)


def context_length_from_config(cfg: Any) -> ContextLength:
    """Context lengths of the model a config describes.

    Accepts a :class:`~compressive_transformer.core.config.ModelConfig` (``cmem_len == 0`` is Transformer-XL, otherwise
    the Compressive Transformer; ``[model.ql]`` Transformer-QL) or any object with ``seg_len, mem_len, n_layers, cmem_len, compression_rate`` and
    optionally ``scales``, ``output_layers`` and ``model_type`` (a non-empty ``scales`` means Transformer-QL).
    """
    if isinstance(cfg, ModelConfig):  # the sections, read as the flat attributes a duck-typed config has
        ql = cfg.ql
        cfg = SimpleNamespace(
            seg_len=cfg.seg_len,
            mem_len=cfg.memory.mem_len,
            cmem_len=cfg.memory.cmem_len,
            n_layers=cfg.n_layers,
            compression_rate=cfg.compression.rate,
            scales=ql.scales if ql is not None else None,
            output_layers=ql.output_layers if ql is not None else 0,
        )
    scales = getattr(cfg, "scales", None)
    model_type = getattr(cfg, "model_type", None)
    if model_type is not None:
        key = str(model_type).strip().lower().replace("_", "-").replace(" ", "-")
        if key not in _ALIASES:
            raise ConfigError(f"model_type: unknown {model_type!r}; use one of {', '.join(MODELS)}")
        model = _ALIASES[key]
    elif scales:
        model = "transformer-ql"
    else:
        model = "compressive" if getattr(cfg, "cmem_len", 0) else "transformer-xl"
    try:
        common = dict(seg_len=cfg.seg_len, mem_len=cfg.mem_len, compression_rate=cfg.compression_rate)
    except AttributeError as e:
        raise ConfigError(f"{e.name}: the config lacks this attribute, which context lengths need") from None
    if model == "transformer-ql":
        return context_length(
            model=model,
            **common,
            cmem_len=getattr(cfg, "cmem_len", 0),
            scales=tuple(scales) if scales else None,
            output_layers=getattr(cfg, "output_layers", 0),
        )
    return context_length(
        model=model,
        **common,
        n_layers=getattr(cfg, "n_layers", None),
        cmem_len=getattr(cfg, "cmem_len", 0),
    )


# ---------------------------------------------------------------------------------------------------------------
# The same reach in the Compressive Transformer paper's terms (section 3.3), with the attention cost it comes at


@dataclass(frozen=True)
class TemporalRange:
    max_range: int  # l x (n_m + c * n_cm): how far back the top layer can see, in input positions
    attention_cost: int  # query-key pairs per layer and head for one segment: n_s x (n_s + n_m + n_cm)
    memory_slots: int  # n_m + n_cm per layer
    receptive_field: int = 0  # a convolutional model (WaveNet, no attention): 1 + sum of its dilations; 0 otherwise

    def __str__(self) -> str:
        if self.receptive_field:
            return (
                f"no attention: a receptive field of {self.receptive_field} positions (the output and the "
                f"{self.max_range} before it), no memory slots"
            )
        return (
            f"max temporal range {self.max_range} positions, attention cost {self.attention_cost} "
            f"query-key pairs per layer and head per segment, {self.memory_slots} memory slots per layer"
        )


def temporal_range(cfg: ModelConfig) -> TemporalRange:
    """l x (n_m + c n_cm) and the per-segment attention cost O(n_s^2 + n_s (n_m + n_cm)).

    A Transformer-XL (n_cm = 0) has l x n_m; with n_m = n_cm = n/2 and c = 3 the Compressive Transformer reaches
    twice as far at the same cost. WaveNet has no attention: it reaches back over its receptive field less one (the
    output's own position), at no attention cost.
    """
    if cfg.is_wavenet:
        field = receptive_field(cfg.wavenet.dilations)
        return TemporalRange(max_range=field - 1, attention_cost=0, memory_slots=0, receptive_field=field)
    c = cfg.compression.rate if cfg.memory.cmem_len > 0 else 0
    return TemporalRange(
        max_range=cfg.n_layers * (cfg.memory.mem_len + c * cfg.memory.cmem_len),
        attention_cost=cfg.seg_len * (cfg.seg_len + cfg.memory.mem_len + cfg.memory.cmem_len),
        memory_slots=cfg.memory.mem_len + cfg.memory.cmem_len,
    )


def receptive_field(dilations: tuple[int, ...] | list[int]) -> int:
    """WaveNet's reach: positions an output depends on, itself included, for kernel-2 convolutions with these
    dilations: 1 + sum of the dilations."""
    return 1 + sum(dilations)


def range_report(cfg: ModelConfig) -> str:
    """What ``compressive-transformer range`` prints: the temporal range and attention cost of ``cfg``, and the
    context lengths (Transformer-QL paper, Appendix B) of the three models at the same window and depth."""
    if cfg.is_wavenet:  # no attention: its whole reach is the receptive field of its convolutions
        return (
            f"WaveNet receptive field: {receptive_field(cfg.wavenet.dilations)} positions (1 + sum of the dilations "
            f"{list(cfg.wavenet.dilations)}); no attention, no memory beyond it"
        )
    lines = []
    kind = model_kind(cfg)
    if kind.temporal_range is not None:
        r = kind.temporal_range(cfg)
        lines += [
            f"max temporal range: {r.max_range} positions "
            f"(l={cfg.n_layers} x (n_m={cfg.memory.mem_len} + c={cfg.compression.rate} x n_cm={cfg.memory.cmem_len}))",
            f"attention cost: {r.attention_cost} query-key pairs per layer and head per segment (n_s={cfg.seg_len})",
            f"memory slots per layer: {r.memory_slots}",
        ]
    n_s, memory = cfg.seg_len, cfg.memory.mem_len + cfg.memory.cmem_len
    own = kind.context_length if kind.context_length is not None else context_length_from_config
    rows = [("this config", own(cfg))]
    rows.append(
        (
            f"Transformer-XL {n_s}/{memory}",
            context_length(model="transformer-xl", seg_len=n_s, mem_len=memory, n_layers=cfg.n_layers),
        )
    )
    half, c = memory // 2, max(cfg.compression.rate, 2)
    rows.append(
        (
            f"Compressive Transformer {n_s}/{memory - half}/{half} c={c}",
            context_length(
                model="compressive",
                seg_len=n_s,
                mem_len=memory - half,
                cmem_len=half,
                compression_rate=c,
                n_layers=cfg.n_layers,
            ),
        )
    )
    lines.append(
        f"context length (min / max / average) at window n_s + memory = {n_s + memory}, {cfg.n_layers} layers:"
    )
    lines += [f"  {name:<40} {ctx.min:>8} {ctx.max:>8} {ctx.average:>10g}" for name, ctx in rows]
    return "\n".join(lines)


__all__ = [
    "MODELS",
    "ContextLength",
    "TemporalRange",
    "context_length",
    "context_length_from_config",
    "range_report",
    "receptive_field",
    "temporal_range",
    "transformer_ql_min_context",
]
