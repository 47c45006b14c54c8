"""benchmarks/op_count.py: which operators count as launching a kernel, and the script at a tiny size (a training
step and generated tokens), each counted step issuing the same operators."""

from __future__ import annotations

import json

import pytest
import torch

op_count = pytest.importorskip("benchmarks.op_count")
aten = torch.ops.aten


@pytest.mark.parametrize(
    ("op", "counted"),
    [
        (aten.mm.default, True),
        (aten.cat.default, True),
        (aten._to_copy.default, True),
        (aten.copy_.default, True),
        (aten._local_scalar_dense.default, True),  # a read of a device value: a copy and a synchronisation
        (aten.view.default, False),
        (aten.transpose.int, False),
        (aten.split.Tensor, False),
        (aten.detach.default, False),
        (aten.empty.memory_format, False),
        (aten._unsafe_view.default, False),
    ],
)
def test_views_and_allocations_launch_no_kernel(op, counted):
    assert op_count.launches_kernel(op) is counted


def test_the_counter_sees_forward_backward_and_not_views():
    x = torch.randn(4, 4, requires_grad=True)
    counts, _ = op_count.count(lambda: (x.t() @ x).view(-1).sum().backward())
    assert counts.kernels["mm"] == 3 and "view" not in counts.kernels and counts.other["t"] >= 1


@pytest.mark.parametrize("phase", ["train", "decode"])
def test_the_script_counts_a_tiny_step(tmp_path, phase):
    name = f"tiny-{phase}"
    argv = ["--phase", phase, "--workload", "tiny", "--attn-impl", "explicit", "--repeats", "2"]
    assert op_count.main([*argv, "--name", name, "--out", str(tmp_path), "--threads", "1"]) == 0
    result = json.loads((tmp_path / f"{name}.json").read_text())
    each = result["kernels_each_step"]
    assert len(set(each)) <= (1 if phase == "train" else 2)  # a generated token compresses or does not
    assert sum(result["by_operator"].values()) == pytest.approx(result["kernels_per_step"])
    assert "mm" in result["by_operator"] or "addmm" in result["by_operator"]
    assert not set(result["by_operator"]) & {"view", "transpose", "empty", "detach"}
    if phase == "train":
        assert "_fused_adam_" in result["by_operator"] and result["amp"] == "bf16"
    assert (tmp_path / f"{name}.md").read_text().startswith("# Kernel-launching operators")
