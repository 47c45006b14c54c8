"""Context lengths: the Transformer-QL paper's numbers, formulas, properties, and a brute-force dependency check."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from reference_context import simulate_compressive, simulate_transformer_ql, simulate_transformer_xl

from compressive_transformer.core.config import ConfigError, ModelConfig
from compressive_transformer.core.context import ContextLength, context_length, context_length_from_config

FAST = settings(max_examples=60, deadline=None)


def ql(seg_len: int, mem_len: int, scales: tuple[int, ...], c: int, output_layers: int = 0) -> ContextLength:
    return context_length(
        model="transformer-ql",
        seg_len=seg_len,
        mem_len=mem_len,
        scales=scales,
        compression_rate=c,
        output_layers=output_layers,
    )


def xl(seg_len: int, mem_len: int, n_layers: int) -> ContextLength:
    return context_length(model="transformer-xl", seg_len=seg_len, mem_len=mem_len, n_layers=n_layers)


def comp(seg_len: int, mem_len: int, cmem_len: int, c: int, n_layers: int) -> ContextLength:
    return context_length(
        model="compressive",
        seg_len=seg_len,
        mem_len=mem_len,
        cmem_len=cmem_len,
        compression_rate=c,
        n_layers=n_layers,
    )


def ql_shapes(seg_len: int, mem_len: int, n_scales: int, c: int) -> list[tuple[int, int, int]]:
    """(segment, memory, shift) per scale, in states of that scale, as Figure 2 builds them."""
    window, out = seg_len + mem_len, [(seg_len, mem_len, seg_len)]
    for _ in range(n_scales - 1):
        seg = min(window // c, out[-1][0])
        out.append((seg, window - seg, out[-1][2] // c))
    return out


# --- the paper's worked example and tables ---------------------------------------------------------------------


def test_figure_5_example() -> None:
    # Figure 5: 4-token segments (the S^0 row), memory 4, pooling by 2 twice (S^1 -> S^2, S^3 -> S^4), one
    # Transformer-XL layer per scale and one output layer; the same shape as Transformer-XL has 4 layers.
    got = ql(4, 4, (1, 1, 1), 2, output_layers=1)
    assert got == ContextLength(min=44, max=48, average=46.0)
    assert xl(4, 4, 4).min == 16
    # the top row of the figure: every current output depends on S_{t-47}; the oldest one, t-3, on 44 past tokens
    sim = simulate_transformer_ql(seg_len=4, mem_len=4, scales=(1, 1, 1), compression_rate=2, output_layers=1)
    assert (sim.min, sim.max_inclusive) == (44, 48)
    assert simulate_transformer_xl(seg_len=4, mem_len=4, n_layers=4).min == 16


@pytest.mark.parametrize(
    ("model", "kwargs", "average"),
    [
        # Table 1 (8 layers; Transformer-QL: scales 3+3, 2 output layers; c = 2)
        ("transformer-xl", dict(seg_len=4, mem_len=12, n_layers=8), 98),
        ("transformer-xl", dict(seg_len=8, mem_len=24, n_layers=8), 196),
        ("compressive", dict(seg_len=4, mem_len=6, cmem_len=6, compression_rate=2, n_layers=8), 146),
        ("compressive", dict(seg_len=8, mem_len=12, cmem_len=12, compression_rate=2, n_layers=8), 292),
        ("transformer-ql", dict(seg_len=4, mem_len=12, scales=(3, 3), compression_rate=2, output_layers=2), 138),
        ("transformer-ql", dict(seg_len=8, mem_len=24, scales=(3, 3), compression_rate=2, output_layers=2), 276),
        # Tables 3 and 5
        ("transformer-xl", dict(seg_len=8, mem_len=8, n_layers=8), 68),
        ("transformer-xl", dict(seg_len=16, mem_len=16, n_layers=8), 136),
        ("transformer-xl", dict(seg_len=2, mem_len=30, n_layers=8), 241),
        ("transformer-ql", dict(seg_len=8, mem_len=8, scales=(3, 3), compression_rate=2, output_layers=2), 100),
        ("transformer-ql", dict(seg_len=16, mem_len=16, scales=(3, 3), compression_rate=2, output_layers=2), 200),
    ],
)
def test_paper_tables(model: str, kwargs: dict, average: int) -> None:
    assert context_length(model=model, **kwargs).average == average


def test_table_3_ql_02_30() -> None:
    # Table 3 prints 332 as the *average* for 02/30; the algorithm (and the brute force) give min 332, max 334.
    got = ql(2, 30, (3, 3), 2, output_layers=2)
    assert (got.min, got.max) == (332, 334)
    sim = simulate_transformer_ql(seg_len=2, mem_len=30, scales=(3, 3), compression_rate=2, output_layers=2)
    assert (sim.min, sim.max_inclusive) == (332, 334)


# --- formulas ----------------------------------------------------------------------------------------------------

lengths = st.integers(1, 64)
mems = st.integers(0, 64)
layers = st.integers(1, 12)
rates = st.integers(1, 6)


@FAST
@given(lengths, mems, layers)
def test_transformer_xl_formula(seg_len: int, mem_len: int, n_layers: int) -> None:
    got = xl(seg_len, mem_len, n_layers)
    assert got.min == n_layers * mem_len
    assert got.max == n_layers * mem_len + seg_len
    assert got.average == n_layers * mem_len + seg_len / 2


@FAST
@given(lengths, mems, mems, rates, layers)
def test_compressive_formula(seg_len: int, mem_len: int, cmem_len: int, c: int, n_layers: int) -> None:
    got = comp(seg_len, mem_len, cmem_len, c, n_layers)
    assert got.min == n_layers * (mem_len + c * cmem_len)
    assert got.max == got.min + seg_len
    assert comp(seg_len, mem_len, 0, c, n_layers) == xl(seg_len, mem_len, n_layers)  # n_cm = 0 is Transformer-XL


# --- properties --------------------------------------------------------------------------------------------------


@st.composite
def ql_args(draw: st.DrawFn, max_scales: int = 3) -> dict:
    c = draw(st.integers(1, 4))
    scales = tuple(draw(st.lists(st.integers(1, 3), min_size=1, max_size=max_scales)))
    seg_len = c ** (len(scales) - 1) * draw(st.integers(1, 4))
    mem_len = draw(st.integers(0, 24))
    if len(scales) > 1:
        mem_len += -(seg_len + mem_len) % c
    return dict(seg_len=seg_len, mem_len=mem_len, scales=scales, c=c, output_layers=draw(st.integers(0, 3)))


@FAST
@given(ql_args())
def test_ql_min_le_average_le_max(args: dict) -> None:
    got = ql(**args)
    assert 0 <= got.min <= got.average <= got.max == got.min + args["seg_len"]


@FAST
@given(ql_args())
def test_ql_monotonic_in_memory_and_layers(args: dict) -> None:
    base = ql(**args).min
    assert ql(**{**args, "mem_len": args["mem_len"] + args["c"]}).min >= base  # + c keeps whole pooling groups
    assert ql(**{**args, "output_layers": args["output_layers"] + 1}).min >= base
    for i in range(len(args["scales"])):
        more = tuple(n + (k == i) for k, n in enumerate(args["scales"]))
        assert ql(**{**args, "scales": more}).min >= base


@FAST
@given(lengths, mems, layers, mems.map(lambda n: n % 4))
def test_xl_and_compressive_monotonic(seg_len: int, mem_len: int, n_layers: int, cmem_len: int) -> None:
    assert xl(seg_len, mem_len + 1, n_layers).min >= xl(seg_len, mem_len, n_layers).min
    assert xl(seg_len, mem_len, n_layers + 1).min >= xl(seg_len, mem_len, n_layers).min
    assert comp(seg_len, mem_len, cmem_len + 1, 2, n_layers).min > comp(seg_len, mem_len, cmem_len, 2, n_layers).min


@FAST
@given(lengths, mems, st.integers(1, 6), st.integers(0, 3), rates)
def test_ql_single_scale_is_transformer_xl(seg_len: int, mem_len: int, n: int, out: int, c: int) -> None:
    assert ql(seg_len, mem_len, (n,), c, out) == xl(seg_len, mem_len, n + out)


@FAST
@given(lengths, mems, st.lists(st.integers(1, 3), min_size=1, max_size=4), st.integers(0, 3))
def test_ql_without_compression_is_transformer_xl(seg_len: int, mem_len: int, scales: list, out: int) -> None:
    # c = 1: the "compression" keeps the window's last n_s states unchanged, so scales just stack layers
    assert ql(seg_len, mem_len, tuple(scales), 1, out) == xl(seg_len, mem_len, sum(scales) + out)


@FAST
@given(
    st.integers(1, 3),
    st.integers(1, 3),
    st.lists(st.integers(1, 3), min_size=1, max_size=3),
    st.integers(1, 3),
    st.integers(0, 6),
    st.integers(0, 2),
)
def test_ql_larger_compression_rate_never_shrinks_context(
    c1: int, factor: int, scales: list, k: int, j: int, out: int
) -> None:
    c2 = c1 * factor  # shapes valid for c2 are valid for c1 too
    seg_len = k * c2 ** (len(scales) - 1)
    mem_len = j * c2 + (-seg_len % c2)
    small, large = ql(seg_len, mem_len, tuple(scales), c1, out), ql(seg_len, mem_len, tuple(scales), c2, out)
    assert large.max >= small.max and large.min >= small.min


def test_ql_context_grows_quadratically_with_window() -> None:
    # section 2.4: with c = n_s and n_m = n_s, two scales reach about n_s * (n_s + n_m) tokens
    for n in (4, 8, 16, 32):
        assert ql(n, n, (1, 1), n).min >= n * n


# --- brute force: an independent simulation of which tokens each output can depend on ---------------------------


def exact_ql(seg_len: int, mem_len: int, scales: tuple[int, ...], c: int) -> bool:
    shapes = ql_shapes(seg_len, mem_len, len(scales), c)
    return mem_len >= 1 and all(mem % shift == 0 for _, mem, shift in shapes)


@pytest.mark.parametrize(
    ("seg_len", "mem_len", "scales", "c", "out"),
    [
        (4, 4, (1, 1, 1), 2, 1),  # Figure 5
        (4, 12, (3, 3), 2, 2),  # Table 1
        (8, 8, (1, 2), 2, 1),
        (3, 3, (1, 1), 3, 1),  # window shorter than c segments: the compressed segment shrinks to W / c
        (6, 6, (2, 1), 3, 1),
        (9, 9, (1, 1, 1), 3, 2),
        (8, 8, (1, 1), 4, 0),
        (4, 8, (1, 1, 2), 2, 1),
        (3, 6, (2, 2), 1, 1),
    ],
)
def test_ql_algorithm_matches_brute_force(seg_len: int, mem_len: int, scales: tuple, c: int, out: int) -> None:
    assert exact_ql(seg_len, mem_len, scales, c)
    got = ql(seg_len, mem_len, scales, c, out)
    sim = simulate_transformer_ql(
        seg_len=seg_len, mem_len=mem_len, scales=scales, compression_rate=c, output_layers=out
    )
    assert (got.min, got.max) == (sim.min, sim.max_inclusive)


@settings(max_examples=40, deadline=None)
@given(ql_args(max_scales=3))
def test_ql_algorithm_is_exact_or_a_lower_bound(args: dict) -> None:
    assume(args["seg_len"] + args["mem_len"] <= 16)
    got = ql(**args)
    sim = simulate_transformer_ql(
        seg_len=args["seg_len"],
        mem_len=args["mem_len"],
        scales=args["scales"],
        compression_rate=args["c"],
        output_layers=args["output_layers"],
    )
    if exact_ql(args["seg_len"], args["mem_len"], args["scales"], args["c"]):
        assert (got.min, got.max) == (sim.min, sim.max_inclusive)
    else:
        assert got.min <= sim.min and got.max <= sim.max_inclusive


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 3), st.integers(1, 3), st.integers(0, 8), st.integers(0, 4), st.integers(1, 3))
def test_xl_and_compressive_match_brute_force(c: int, k: int, mem_len: int, cmem_len: int, n_layers: int) -> None:
    seg_len = c * k  # whole groups of c are evicted every segment
    got = comp(seg_len, mem_len, cmem_len, c, n_layers)
    sim = simulate_compressive(
        seg_len=seg_len, mem_len=mem_len, cmem_len=cmem_len, compression_rate=c, n_layers=n_layers
    )
    if n_layers == 1 or (mem_len + c * cmem_len) % seg_len == 0:
        assert (got.min, got.max) == (sim.min, sim.max_inclusive)
    else:  # the oldest memory slot lands mid-segment: the paper's formula undercounts
        assert got.min < sim.min and got.max < sim.max_inclusive


# --- configs -----------------------------------------------------------------------------------------------------


def test_from_model_config() -> None:
    base = dict(seg_len=4, mem_len=6, n_layers=8, compression_rate=2)
    assert context_length_from_config(ModelConfig.from_raw({**base, "cmem_len": 0})) == xl(4, 6, 8)
    assert context_length_from_config(ModelConfig.from_raw({**base, "cmem_len": 6})) == comp(4, 6, 6, 2, 8)


def test_from_duck_typed_ql_config() -> None:
    cfg = SimpleNamespace(
        seg_len=4, mem_len=4, n_layers=4, cmem_len=0, compression_rate=2, scales=(1, 1, 1), output_layers=1
    )
    assert context_length_from_config(cfg).min == 44
    assert context_length_from_config(SimpleNamespace(**{**vars(cfg), "model_type": "transformer_ql"})).min == 44
    as_xl = SimpleNamespace(**{**vars(cfg), "scales": None, "output_layers": 0})
    assert context_length_from_config(as_xl) == xl(4, 4, 4)
    with pytest.raises(ConfigError, match="model_type"):
        context_length_from_config(SimpleNamespace(**{**vars(cfg), "model_type": "lstm"}))
    with pytest.raises(ConfigError, match="seg_len"):
        context_length_from_config(SimpleNamespace(mem_len=4, n_layers=2, cmem_len=0, compression_rate=1))


def test_result_is_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        xl(4, 4, 2).min = 0  # type: ignore[misc]


# --- bad arguments -----------------------------------------------------------------------------------------------

XL = dict(model="transformer-xl", seg_len=4, mem_len=4, n_layers=2)
QL = dict(model="transformer-ql", seg_len=4, mem_len=4, scales=(1, 1), compression_rate=2)


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({**XL, "model": "lstm"}, "model"),
        ({**XL, "seg_len": 0}, "seg_len"),
        ({**XL, "seg_len": -4}, "seg_len"),
        ({**XL, "mem_len": -1}, "mem_len"),
        ({**XL, "n_layers": 0}, "n_layers"),
        ({**XL, "n_layers": None}, "n_layers"),
        ({**XL, "n_layers": 2.0}, "n_layers"),
        ({**XL, "cmem_len": 4}, "cmem_len"),
        ({**XL, "scales": (1, 1)}, "scales"),
        ({**XL, "output_layers": 1}, "output_layers"),
        ({**XL, "model": "compressive", "cmem_len": -1}, "cmem_len"),
        ({**XL, "model": "compressive", "compression_rate": 0}, "compression_rate"),
        ({**QL, "compression_rate": 0}, "compression_rate"),
        ({**QL, "scales": ()}, "scales"),
        ({**QL, "scales": None}, "scales"),
        ({**QL, "scales": (1, 0)}, "scales"),
        ({**QL, "output_layers": -1}, "output_layers"),
        ({**QL, "mem_len": -2}, "mem_len"),
        ({**QL, "cmem_len": 2}, "cmem_len"),
        ({**QL, "n_layers": 3}, "n_layers"),
        ({**QL, "seg_len": 6, "scales": (1, 1, 1)}, "seg_len"),  # 6 is not divisible by 2 ** 2
        ({**QL, "mem_len": 3}, "mem_len"),  # 4 + 3 cannot be pooled in pairs
    ],
)
def test_bad_arguments(kwargs: dict, name: str) -> None:
    with pytest.raises(ConfigError, match=f"^{name}:") as info:
        context_length(**kwargs)
    assert "\n" not in str(info.value)


def test_arguments_are_keyword_only() -> None:
    with pytest.raises(TypeError):
        context_length("transformer-xl", 4, 4, 2)  # type: ignore[misc]


def test_wavenet_has_a_receptive_field_and_no_attention_cost() -> None:
    """temporal_range(wavenet) said "max temporal range 0 positions, attention cost 4096 query-key pairs"."""
    from compressive_transformer.core.context import receptive_field, temporal_range

    cfg = ModelConfig.from_raw(
        dict(vocab_size=256, d_model=8, n_heads=2, d_ff=8, n_layers=4, seg_len=64, mem_len=0, cmem_len=0,
             wavenet_dilations=[1, 2, 4, 8])
    )  # fmt: skip
    r = temporal_range(cfg)
    assert r.receptive_field == receptive_field((1, 2, 4, 8)) == 16 and r.max_range == 15 and r.attention_cost == 0
    assert str(r).startswith("no attention: a receptive field of 16 positions") and "attention cost" not in str(r)
