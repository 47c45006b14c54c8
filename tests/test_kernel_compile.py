"""benchmarks/kernel_compile.py: the fused kernels compiled for sm_90 without a GPU, and the tile-product counts of
the designs it compares."""

from __future__ import annotations

import pytest

pytest.importorskip("triton.backends.nvidia.compiler")
kernel_compile = pytest.importorskip("benchmarks.kernel_compile")

from compressive_transformer.core.kernels.fused_triton import (  # noqa: E402
    KEY_TIMED_DESPITE_SPILLS,
    TIMED_DESPITE_SPILLS,
)

SHAPE = dict(B=16, H=8, T=512, dh=64, C=512, M=515)


def _forward(launches):
    return next(launch for launch in launches if "forward" in launch.fn.__name__)


def test_the_current_forward_is_software_pipelined_with_fewer_barriers_per_tile_than_the_first():
    """Compiled as a CUDA call at the `gpu` shape would run it: the first kernel's shift through a global scratch
    buffer between barriers (num_stages=1: no asynchronous copies); the current one's in registers, its loads
    pipelined, with fewer block-wide barriers per tile."""
    first = _forward(kernel_compile.record_first(SHAPE))
    current = _forward(kernel_compile.record_current(SHAPE))
    old = kernel_compile.compile_one(first, first.configs[0])
    new = kernel_compile.compile_one(current, current.configs[0])
    assert old["num_stages"] == 1 and old["cp_async"] == 0
    assert new["num_stages"] >= 2 and new["cp_async"] > 0
    assert new["tile_barriers"][1] < old["tile_barriers"][0]
    assert "SCR" in first.fn.arg_names and "SCR" not in current.fn.arg_names  # no scratch buffer to pass
    assert 0 < new["shared_bytes"] <= 228 * 1024 and new["registers"] <= 255


def test_tile_products_per_head_fall_and_the_table_pass_is_gone():
    first = kernel_compile.first_design_products(SHAPE)
    current = kernel_compile.current_design_products(SHAPE, 64, 64)
    total = lambda p: p["forward"] + p["key pass"] + p["query pass"] + p["table pass"]  # noqa: E731
    assert current["table pass"] == 0 < first["table pass"]
    assert total(current) < 0.7 * total(first)
    useful = kernel_compile.useful_flops(SHAPE)
    assert useful < total(current)  # recomputation and whole-tile products cost more than the useful work
    # the first kernel's forward: 4 products per tile, 24 tiles per query block at the last (causal) one
    assert first["tiles"]["query"] == sum(8 + -(-min(515 + 512, 515 + i0 + 64) // 64) for i0 in range(0, 512, 64))


def test_the_key_pass_work_counts_its_whole_power_of_two_band():
    """A key-pass tile of bm queries by bn keys multiplies the queries by next_power_of_2(bm + bn) table rows: 64 x 32
    tiles take a 128-row band (four 32-key units, against two for 64 x 64), 32 x 64 tiles a 128-row one (two)."""
    flops, tiles = kernel_compile.key_pass_products(SHAPE, 64, 32)
    assert flops == tiles * (4 + 4) * 2 * 64 * 32 * SHAPE["dh"]
    flops, tiles = kernel_compile.key_pass_products(SHAPE, 32, 64)
    assert flops == tiles * (4 + 2) * 2 * 32 * 64 * SHAPE["dh"]
    assert kernel_compile.pass_work(SHAPE, "key_value_grad_kernel", 64, 32) > kernel_compile.MAX_WORK
    assert kernel_compile.pass_work(SHAPE, "query_grad_kernel", 64, 64) == 1.0


@pytest.mark.slow
def test_every_tuned_configuration_keeps_spills_out_of_its_tile_loops_with_work_near_64_by_64_tiles():
    """Every configuration the CUDA tuning may pick, compiled for sm_90 at the `gpu` shape in each variant of its
    kernel, passes the rule the tuned sets are chosen by (``kernel_compile.admitted``)."""
    rows = kernel_compile.candidates(SHAPE, tiles=())
    assert {r["kernel"] for r in rows} == {"forward_kernel", "key_value_grad_kernel", "query_grad_kernel"}
    assert sum(r["first"] for r in rows) == 3
    failing = [(r["kernel"], r["BLOCK_M"], r["BLOCK_N"], r["num_warps"], r["num_stages"]) for r in rows]
    failing = [name for name, r in zip(failing, rows) if not r["admitted"]]
    kept = [("key_value_grad_kernel", t.block_m, t.block_n, t.warps, t.stages) for t in KEY_TIMED_DESPITE_SPILLS]
    kept += [("query_grad_kernel", t.block_m, t.block_n, t.warps, t.stages) for t in TIMED_DESPITE_SPILLS]
    assert failing == kept, "only the backward passes' wgmma tiles are tuned against the rule, and they are named so"
    assert all(r["variants"][0]["wgmma"] > 0 for r in rows if r["tuned"] and not r["admitted"])


def test_the_before_after_table_says_which_configurations_met_the_target():
    def row(other, **changes):
        base = dict(design="current", kernel="forward_kernel", HAS_C=True, BLOCK_M=64, BLOCK_N=32, num_warps=4)
        spills = dict(tile_spill_reloads=[0, 0], tile_spill_stores=[0, 0])
        return {**base, "num_stages": 2, "tile_other_instructions": other, **spills, **changes}

    old = [row([1000, 2000]), row([1000, 2000], num_stages=3), row([1000, 1000], num_stages=4)]
    before = dict(commit="abc1234", triton="3.9.0", ptxas="13.4", kernels=old)
    after = dict(kernels=[row([700, 1400]), row([700, 1800], num_stages=3), row([500, 600], num_warps=8)])
    rows = [line for line in kernel_compile.comparison(before, after) if line.startswith("| forward_kernel")]
    assert len(rows) == 4
    assert "| -30.0% / -30.0% | met |" in rows[0]
    assert "| -30.0% / -10.0% | cheapest only |" in rows[1]
    assert "| dropped |" in rows[2] and "| - | - |" in rows[2]
    assert "| not tuned | 500-600 | - | - |" in rows[3]
