"""The fused Triton relative attention against a plain-torch reference of the same math: the output and all seven
gradients, exact in fp32 and within bf16 rounding in bf16; on CPU tensors through Triton's interpreter at small
shapes (every tile configuration the GPU may tune to included), on CUDA also at the benchmark's shapes and captured
in a CUDA graph; the custom op traced by torch.compile with no graph break; the timing scripts end to end.
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from conftest import clamped_table
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

pytest.importorskip("triton")

from triton.runtime import interpreter  # noqa: E402

from compressive_transformer.core.kernels import fused_triton  # noqa: E402
from compressive_transformer.core.kernels.fused_triton import (  # noqa: E402
    BAND_PAD,
    BLOCKS,
    FORWARD,
    FORWARD_TILES,
    INTERPRETER_TILES,
    KEY_GRADS,
    KEY_TILES,
    QUERY_GRAD_TILES,
    QUERY_GRADS,
    TUNED_WORK,
    Tiles,
    _band_table,
    _configs_worth_timing,
    band_reach,
    fused_relative_attention,
)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
NAMES = ("qu", "k", "v", "qv", "r", "qc", "rc")


def reference(qu, k, v, qv, r, qc, rc, key_valid, n_cmem: int, window: int):
    """The attention with explicit (B, H, T, K) scores: every table row looked up by its index m, masked keys -inf."""
    B, H, T, _ = qu.shape
    K, C = k.shape[2], n_cmem
    M = K - C - T
    i = torch.arange(T, device=qu.device)[:, None]
    j = torch.arange(K, device=qu.device)[None, :]

    def lookup(q, table, m):  # q_i . table[m(i, j)], with out-of-range rows (only at blocked keys) clamped
        rows = torch.einsum("bhtd,hld->bhtl", q, table)
        return rows.gather(-1, m.clamp(0, table.shape[1] - 1).expand(B, H, T, K))

    pos = lookup(qv, r, j - C - i + T - 1)
    if C > 0:
        pos = torch.where(j < C, lookup(qc, rc, j - i + T - 1), pos)
    dist = M + i - (j - C)
    near = (dist >= 0) & (dist <= window) if window > 0 else dist >= 0
    valid = key_valid[:, None, None, :]
    ok = torch.where(j < C, valid, (valid & near) | (dist == 0))
    scores = (qu @ k.transpose(-1, -2) + pos).masked_fill(~ok, float("-inf"))
    return torch.softmax(scores, -1) @ v


def inputs(B, H, T, C, M, dh, *, dtype=torch.float32, seed=0, p_invalid=0.3, extra_rows=1, clamp=0, reset=False):
    """qu, k, v, qv, r, qc, rc (qc, rc None when C = 0), key_valid with about p_invalid of the slots empty. clamp > 0:
    the tables as ``clamp_len`` makes them (every distance beyond clamp reads the row of distance clamp); reset: batch
    row 0 has just been reset (no memory or compressed slot valid)."""
    g = torch.Generator().manual_seed(seed)
    K = C + M + T

    def rand(*shape):
        return torch.randn(*shape, generator=g).to(DEVICE, dtype)

    def table(n_rows, nearest):  # row m encodes distance nearest + n_rows - 1 - m
        return clamped_table(rand(H, n_rows, dh), nearest, clamp)

    qu, k, v, qv = rand(B, H, T, dh), rand(B, H, K, dh), rand(B, H, K, dh), rand(B, H, T, dh)
    r = table(M + T + extra_rows, -extra_rows)
    qc, rc = (rand(B, H, T, dh), table(C + T - 1 + extra_rows, 1 - extra_rows)) if C > 0 else (None, None)
    key_valid = torch.rand(B, K, generator=g) >= p_invalid
    if reset:
        key_valid[0, : C + M] = False
    return [qu, k, v, qv, r, qc, rc], key_valid.to(DEVICE)


def reference_run(tensors, key_valid, C: int, window: int, grad, dtype=torch.float64) -> list:
    """The reference's output and gradients, computed in ``dtype`` from the given (rounded) values."""
    leaves = [t.detach().to(dtype).requires_grad_() if t is not None else None for t in tensors]
    out = reference(*leaves, key_valid, C, window)
    out.backward(grad.to(dtype))
    return [out.detach()] + [t.grad for t in leaves if t is not None]


def run_both(tensors, key_valid, C: int, window: int, blocks: tuple[int, int] = (0, 0), seed: int = 1):
    """(kernel, fp64 reference) pairs of the output and each gradient, for one random output gradient; and that
    gradient. blocks: the query and key block (0, 0: the default or tuned ones)."""
    leaves = [t.clone().requires_grad_() if t is not None else None for t in tensors]
    out = fused_relative_attention(*leaves, key_valid, n_cmem=C, window=window, block_m=blocks[0], block_n=blocks[1])
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed)).to(out)
    out.backward(grad)
    assert out.dtype == tensors[0].dtype and all(a.grad.dtype == a.dtype for a in leaves if a is not None)
    got = [out.detach()] + [t.grad for t in leaves if t is not None]
    return list(zip(got, reference_run(tensors, key_valid, C, window, grad))), grad


def assert_close_fp32(pairs) -> None:
    """fp32 rounding only: relative 1e-5, absolute 1e-5 of the largest entry (or of 1: a gradient that is exactly 0,
    as a query's with a single key, is rounding noise around 0 in fp32)."""
    for name, (got, want) in zip(("out",) + NAMES, pairs):
        scale = max(want.abs().max().item(), 1.0)
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5 * scale, msg=lambda m, n=name: f"{n}: {m}")


def relative(got, want) -> float:
    return ((got.double() - want).norm() / want.norm()).item()


def assert_close_bf16(tensors, key_valid, C: int, window: int, blocks: tuple[int, int] = (0, 0)) -> None:
    """The kernel in bf16 is off the exact result (fp64 from the same bf16 values) by at most 3e-2 relative (norm)
    or 1.5 times what the reference computed in bf16 is off, whichever is larger (1-2e-2 at the small shapes)."""
    pairs, grad = run_both(tensors, key_valid, C, window, blocks)
    in_bf16 = reference_run(tensors, key_valid, C, window, grad, torch.bfloat16)
    for name, (got, want), own in zip(("out",) + NAMES, pairs, in_bf16):
        rel, tol = relative(got, want), max(3e-2, 1.5 * relative(own, want))
        assert rel < tol, f"{name}: relative difference {rel:.3g} >= {tol:.3g}"


# (B, H, T, C, M, dh, window, blocks): empty compressed memory and/or memory, a window, T and K off the block size,
# several query blocks and diagonals (16 x 16), query blocks twice the key blocks (a band of three chunks) and half
# of them, the interpreter's default (32 x 32), a block larger than the shape
FP32_CASES = [
    (2, 2, 5, 0, 0, 16, 0, (0, 0)),
    (2, 1, 33, 16, 32, 16, 0, (0, 0)),
    (2, 2, 16, 3, 7, 32, 9, (0, 0)),
    (1, 2, 33, 16, 0, 32, 0, (0, 0)),
    (2, 1, 33, 3, 32, 16, 9, (16, 16)),
    (2, 1, 45, 7, 40, 16, 20, (32, 16)),
    (1, 1, 40, 5, 50, 16, 0, (16, 32)),
    (1, 1, 20, 5, 50, 16, 0, (64, 64)),
]
# interior tiles (no row masks) beside edge ones in every walk: keys, queries and both tables' rows ending inside a
# block, in the compressed stream, the memory + segment stream with and without a window, three-chunk bands
INTERIOR_CASES = [
    (1, 1, 70, 40, 90, 16, 0, (16, 16)),
    (1, 1, 75, 37, 83, 16, 50, (32, 16)),
    (1, 1, 70, 45, 90, 16, 30, (16, 32)),
]


@pytest.mark.parametrize(("B", "H", "T", "C", "M", "dh", "window", "blocks"), FP32_CASES + INTERIOR_CASES)
def test_fp32_output_and_gradients_equal_the_reference(B, H, T, C, M, dh, window, blocks) -> None:
    tensors, key_valid = inputs(B, H, T, C, M, dh)
    assert_close_fp32(run_both(tensors, key_valid, C, window, blocks)[0])


@pytest.mark.parametrize(
    ("B", "H", "T", "C", "M", "dh", "window", "blocks"),
    [(2, 1, 33, 16, 32, 16, 0, (0, 0)), (2, 1, 20, 3, 7, 32, 9, (0, 0)), (2, 1, 40, 9, 30, 16, 0, (32, 16))],
)
def test_bf16_output_and_gradients_are_within_bf16_rounding(B, H, T, C, M, dh, window, blocks) -> None:
    tensors, key_valid = inputs(B, H, T, C, M, dh, dtype=torch.bfloat16)
    assert_close_bf16(tensors, key_valid, C, window, blocks)


SHAPES = dict(
    T=st.integers(1, 40),
    C=st.integers(0, 20),
    M=st.integers(0, 40),
    dh=st.sampled_from([16, 32]),
    window=st.one_of(st.just(0), st.just(-1), st.integers(1, 50)),  # -1: same_length's window, the memory's length
    clamp=st.one_of(st.just(0), st.integers(1, 60)),
    blocks=st.sampled_from([(16, 16), (32, 16), (16, 32), (32, 32)]),
    reset=st.booleans(),
    seed=st.integers(0, 2**16),
)


def check_any_shape(T, C, M, dh, window, clamp, blocks, reset, seed) -> None:
    """Longer tables than needed (their extra rows are never read), tables clamped as ``clamp_len`` makes them, any
    emptiness of the slots, a batch row just reset, a window (``same_length``) or none."""
    tensors, key_valid = inputs(
        2, 1, T, C, M, dh, seed=seed, p_invalid=seed % 5 / 5, extra_rows=1 + seed % 7, clamp=clamp, reset=reset
    )
    assert_close_fp32(run_both(tensors, key_valid, C, M if window < 0 else window, blocks)[0])


# no shrinking: each example costs seconds in the interpreter (a failure prints its example all the same)
@settings(max_examples=5, deadline=None, phases=[Phase.explicit, Phase.reuse, Phase.generate])
@given(**SHAPES)
def test_any_shape_matches_the_reference(**shape) -> None:
    check_any_shape(**shape)


@pytest.mark.slow
@settings(max_examples=40, deadline=None, phases=[Phase.explicit, Phase.reuse, Phase.generate])
@given(**SHAPES)
def test_any_shape_matches_the_reference_many_examples(**shape) -> None:
    check_any_shape(**shape)


GPU_BLOCKS = {(t.block_m, t.block_n) for t in FORWARD_TILES + QUERY_GRAD_TILES} | {
    (t.block_n, t.block_m) for t in KEY_TILES
}


@pytest.mark.slow
@pytest.mark.parametrize("tiles", sorted(GPU_BLOCKS))
def test_each_gpu_tile_configuration_matches_the_reference_in_the_interpreter(tiles) -> None:
    """The blocks each kernel may be tuned to on the GPU (a call's given blocks are the key pass's transposed), in
    the interpreter: several query blocks, a window, every kind of key block."""
    tensors, key_valid = inputs(2, 1, 150, 40, 140, 32, p_invalid=0.2)
    assert_close_fp32(run_both(tensors, key_valid, 40, 100, tiles)[0])


def test_the_key_pass_tables_padding_is_zero_and_enough_for_every_tile() -> None:
    """The key pass reads each table followed by BAND_PAD zero rows, enough for the band of every tile a call may
    run with (the tuned ones, the interpreter's, the largest blocks a call may give); a band reaching farther is
    refused on the host."""
    table = torch.randn(2, 37, 16)
    band = _band_table(table, KEY_TILES)
    assert band.shape == (2, 37 + BAND_PAD, 16) and band.is_contiguous()
    assert torch.equal(band[:, :37], table) and not band[:, 37:].any()
    largest = Tiles(max(BLOCKS), max(BLOCKS))
    assert all(band_reach(t) <= BAND_PAD for t in (*KEY_TILES, INTERPRETER_TILES.transposed(), largest))
    with pytest.raises(AssertionError, match="band reaches 511 rows past its table, padded by 256"):
        _band_table(table, (Tiles(2 * max(BLOCKS), 2 * max(BLOCKS)),))


def poisoned_band_table(reads: list):
    """A stand-in for ``_band_table`` whose padding is NaN, each head's followed by BAND_PAD guard rows in the same
    allocation (a band read past the padding lands there); it records, per table, (first address, head stride,
    real rows, rows with padding, row bytes), for :func:`recording_loads`."""

    def band_table(table, tiles):
        H, rows, dh = table.shape
        zeros = _band_table(table, tiles)
        buffer = torch.full((H, rows + 2 * BAND_PAD, dh), float("nan"), dtype=table.dtype)
        band = buffer[:, : rows + BAND_PAD]
        band[:, :rows] = zeros[:, :rows]
        head = buffer.stride(0) * buffer.element_size()
        reads.append(dict(start=band.data_ptr(), head=head, end=band.data_ptr() + H * head, rows=rows,
                          padded=rows + BAND_PAD, row=dh * buffer.element_size(), read=set()))  # fmt: skip
        return band

    return band_table


def recording_loads(tables: list):
    """The interpreter's masked load, recording which rows of the poisoned tables each load reads."""
    load = interpreter.interpreter_builder.create_masked_load

    def create_masked_load(ptrs, mask, other, cache_policy, is_volatile):
        addresses = ptrs.data[mask.data].astype("int64")
        for t in tables:
            off = addresses[(addresses >= t["start"]) & (addresses < t["end"])] - t["start"]
            t["read"].update(((off % t["head"]) // t["row"]).tolist())
        return load(ptrs, mask, other, cache_policy, is_volatile)

    return create_masked_load


# (T, C, M, window, blocks): bands past both tables' ends (the tables as short as allowed), T off the key pass's
# query block (a block straddles T), a window
PADDED_CASES = [(45, 20, 37, 0, (32, 32)), (48, 13, 30, 20, (16, 32)), (40, 24, 40, 0, (32, 16))]


@pytest.mark.parametrize(("T", "C", "M", "window", "blocks"), PADDED_CASES)
def test_the_key_pass_reads_its_tables_padding_but_no_gradient_depends_on_it(T, C, M, window, blocks, monkeypatch):
    """With the padding NaN: the key pass's bands read into it and never past it, and the output and every gradient
    still equal the reference (a padded row only meets keys the tile's mask or the keys' bias removes, whose
    gradient rows are not stored); a padded row that reached a kept score would make a gradient NaN."""
    tables: list = []
    monkeypatch.setattr(fused_triton, "_band_table", poisoned_band_table(tables))
    monkeypatch.setattr(interpreter.interpreter_builder, "create_masked_load", recording_loads(tables))
    tensors, key_valid = inputs(1, 2, T, C, M, 16, extra_rows=0)
    assert_close_fp32(run_both(tensors, key_valid, C, window, blocks)[0])
    assert len(tables) == 2  # the compressed stream's table, then the memory + segment stream's
    for t in tables:
        assert max(t["read"]) >= t["rows"] and max(t["read"]) < t["padded"], (t["rows"], max(t["read"]))


ENVIRONMENT_PROBE = textwrap.dedent(
    """
    import json, os, sys
    start = dict(os.environ)
    import compressive_transformer
    from compressive_transformer.core import kernels
    from compressive_transformer.core.kernels import (
        fused_triton, fused_triton_bwd, fused_triton_fwd, fused_triton_tiles, triton_interpreter,
    )
    imported = dict(os.environ)
    import torch, torch._dynamo  # torch's custom ops import dynamo on their first call, which sets its cache dir
    import triton.language as tl
    before, core = dict(os.environ), dict(vars(tl.core))
    x = torch.randn(1, 1, 4, 16, requires_grad=True)
    fused_triton.fused_relative_attention(x, x, x, x, x[0, :, :4], None, None, torch.ones(1, 4, dtype=torch.bool),
                                          n_cmem=0).sum().backward()
    ran = dict(os.environ)
    changed = lambda a, b: sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
    kind = type(fused_triton_fwd.forward_kernel).__name__
    swapped = sorted(k for k, v in vars(tl.core).items() if core.get(k) is not v)
    print(json.dumps({"import": changed(start, imported), "run": changed(before, ran), "jit": kind, "swapped": swapped}))
    """
)


def test_importing_and_running_the_kernels_leaves_the_environment_alone() -> None:
    """In a fresh interpreter without TRITON_INTERPRET: importing the package and every kernel module, and running
    the kernel on CPU tensors, writes nothing to os.environ (the kernels stay compiled kernels for CUDA; the CPU's
    interpreted copies are made on the call), and leaves no builtin of ``triton.language.core`` swapped for the
    interpreter's (a kernel compiled for a GPU afterwards, in the same process, would be built through it)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    p = subprocess.run([sys.executable, "-c", ENVIRONMENT_PROBE], capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    result = json.loads(p.stdout.strip().splitlines()[-1])
    assert result == {"import": [], "run": [], "jit": "JITFunction", "swapped": []}


def test_cuda_times_the_tile_configurations_only_for_shapes_large_enough() -> None:
    """Each kernel has several configurations to time on CUDA (their constexprs its own); a shape of fewer than
    TUNED_WORK (query, key) pairs per head takes the first untimed, so small models compile one config."""
    for kernel in (FORWARD, KEY_GRADS, QUERY_GRADS):
        assert len(kernel.configs) >= 4 and {t.warps for t in kernel.configs} == {4, 8}
        assert {t.stages for t in kernel.configs} >= {2, 3}
        assert all(set(kernel.constexprs(t)) <= set(kernel.fn.arg_names) for t in kernel.configs)
    configs = list(range(4))
    assert _configs_worth_timing(configs, dict(T=512, C=512, M=512)) == configs
    assert _configs_worth_timing(configs, dict(T=8, C=4, M=8)) == [0]
    assert _configs_worth_timing(configs, dict(T=512, n_keys=512)) == configs
    assert _configs_worth_timing(configs, dict(T=64, n_keys=TUNED_WORK // 64 - 1)) == [0]


def test_strided_views_as_the_model_makes_them() -> None:
    """Queries time-major transposed, keys and values the two halves of one (B, H, K, 2 dh) cache, tables a
    permuted (L, H, dh) projection: read through their strides, with the same results as contiguous copies."""
    B, H, T, C, M, dh = 2, 2, 9, 4, 6, 16
    tensors, key_valid = inputs(B, H, T, C, M, dh)
    qu, k, v, qv, r, qc, rc = tensors
    kv = torch.cat([k, v], -1)  # (B, H, K, 2 dh)
    views = [
        qu.transpose(1, 2).contiguous().transpose(1, 2),
        kv[..., :dh],
        kv[..., dh:],
        qv.transpose(1, 2).contiguous().transpose(1, 2),
        r.transpose(0, 1).contiguous().transpose(0, 1),
        qc.transpose(1, 2).contiguous().transpose(1, 2),
        rc.transpose(0, 1).contiguous().transpose(0, 1),
    ]
    assert not any(t.is_contiguous() for t in views)
    assert_close_fp32(run_both(views, key_valid, C, 3)[0])


def test_the_tables_gradient_is_deterministic_on_the_cpu_and_blocks_are_checked() -> None:
    """The tables' gradients are added atomically across programs; the interpreter runs programs in order, so two
    runs agree exactly. Blocks the kernels cannot tile are refused in one line."""
    tensors, key_valid = inputs(2, 2, 30, 6, 20, 16)
    first = run_both(tensors, key_valid, 6, 0, (16, 16))[0]
    second = run_both(tensors, key_valid, 6, 0, (16, 16))[0]
    for (a, _), (b, _) in zip(first, second):
        assert torch.equal(a, b)
    with pytest.raises(ValueError, match="blocks must be in .* within a factor 2") as err:
        run_both(tensors, key_valid, 6, 0, (64, 16))
    assert "\n" not in str(err.value)


def test_a_query_whose_keys_are_all_empty_reads_itself() -> None:
    """No valid slot at all: every query attends to its own position only, so the output is its value row."""
    T, C, M = 6, 2, 3
    tensors, key_valid = inputs(1, 1, T, C, M, 16)
    out = fused_relative_attention(*tensors, key_valid.zero_(), n_cmem=C, window=0)
    torch.testing.assert_close(out, tensors[2][:, :, C + M :])


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (dict(qc=None), "qc and rc must be given exactly when n_cmem > 0"),
        (dict(r=lambda r: r[:, :5]), "r must be (H=1, >= M + T = 9"),
        (dict(rc=lambda rc: rc[:, :4]), "rc needs >= C + T - 1 = 7 rows"),
        (dict(key_valid=lambda kv: kv.float()), "key_valid must be a bool (B, K)"),
        (dict(k=lambda k: k.double()), "must share one dtype"),
    ],
)
def test_a_bad_argument_is_one_line_saying_what_to_change(change: dict, message: str) -> None:
    tensors, key_valid = inputs(1, 1, 6, 2, 3, 16)
    args = dict(zip(NAMES, tensors), key_valid=key_valid)
    for name, fix in change.items():
        args[name] = fix(args[name]) if callable(fix) else fix
    with pytest.raises(ValueError, match="fused_relative_attention: ") as err:
        fused_relative_attention(**args, n_cmem=2)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_torch_compile_traces_it_whole_and_keeps_its_gradients() -> None:
    T, C, M = 8, 3, 5
    tensors, key_valid = inputs(2, 1, T, C, M, 16)

    def loss(qu, k, v, qv, r, qc, rc):
        return fused_relative_attention(qu * 1.0, k, v, qv, r, qc, rc, key_valid, n_cmem=C, window=4).square().sum()

    assert torch._dynamo.explain(loss)(*tensors).graph_break_count == 0
    grads = []
    for fn in (loss, torch.compile(loss, backend="aot_eager", fullgraph=True)):
        leaves = [t.clone().requires_grad_() for t in tensors]
        fn(*leaves).backward()
        grads.append([t.grad for t in leaves])
    for eager, compiled in zip(*grads):
        torch.testing.assert_close(compiled, eager)


def test_the_timing_script_runs_end_to_end(tmp_path) -> None:
    from benchmarks import fused_attention

    out = tmp_path / "fused.json"
    fused_attention.main(["--device", DEVICE, "--iters", "1", "--out", str(out)])
    rows = json.loads(out.read_text())["rows"]
    assert [r["impl"] for r in rows] == list(fused_attention.IMPLS)
    assert all(r["forward_ms"] > 0 and r["forward_backward_ms"] > 0 for r in rows)
    assert all(r["forward_tflops"] > 0 and r["forward_backward_tflops"] > 0 for r in rows)
    tol = 1e-5 if DEVICE == "cpu" else 3e-2  # all agree: fp32 on CPU, bf16 on a GPU
    assert max(r["max_rel_difference"] for r in rows) < tol


BENCH = (2, 8, 512, 512, 515, 64)  # B, H, T, C, M, dh: the `gpu` workload's attention at batch 2


@cuda
@pytest.mark.parametrize("window", [0, 300])
def test_cuda_bf16_at_the_benchmark_shape(window: int) -> None:
    tensors, key_valid = inputs(*BENCH, dtype=torch.bfloat16, p_invalid=0.1)
    assert_close_bf16(tensors, key_valid, BENCH[3], window)


@cuda
def test_cuda_fp32_at_the_benchmark_shape() -> None:
    """Fixed 64 x 64 tiles: fp32's exact products are for checking, not for speed, so its configs are not timed."""
    tensors, key_valid = inputs(*BENCH, p_invalid=0.1)
    assert_close_fp32(run_both(tensors, key_valid, BENCH[3], 0, (64, 64))[0])


@cuda
def test_cuda_graph_captures_forward_and_backward() -> None:
    """No host synchronisation on the path: the step replays from a CUDA graph with the eager results."""
    tensors, key_valid = inputs(*BENCH, dtype=torch.bfloat16, p_invalid=0.1)
    leaves = [t.clone().requires_grad_() for t in tensors]
    C = BENCH[3]

    def step():
        for t in leaves:
            t.grad = None
        out = fused_relative_attention(*leaves, key_valid, n_cmem=C, window=0)
        out.float().square().sum().backward()
        return out

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        eager = step().detach().clone()  # warm-up: compiles the kernels outside the capture
        eager_grads = [t.grad.clone() for t in leaves]
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(captured, eager)
    for t, g in zip(leaves, eager_grads):
        torch.testing.assert_close(t.grad, g)
