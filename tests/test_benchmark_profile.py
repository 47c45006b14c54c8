"""benchmarks/profile_step.py: each operator's self time lands in one kind of work, and the speed-up budget is
peer step / r minus our matmul time."""

from __future__ import annotations

import pytest

profile_step = pytest.importorskip("benchmarks.profile_step")


@pytest.mark.parametrize(
    ("op", "kind"),
    [
        ("aten::mm", "matmul & convolution"),
        ("aten::baddbmm_", "matmul & convolution"),
        ("aten::convolution_backward", "matmul & convolution"),
        ("aten::linear", "views, allocation & op wrappers"),  # a wrapper: its matmul is counted as aten::addmm
        ("aten::matmul", "views, allocation & op wrappers"),
        ("aten::_scaled_dot_product_flash_attention_for_cpu_backward", "fused attention"),
        ("aten::_softmax_backward_data", "softmax & loss"),
        ("aten::cat", "copies & layout"),
        ("aten::_fused_adam_", "optimizer"),
        ("Optimizer.step#Adam.step", "optimizer"),
        ("aten::add_", "elementwise & reductions"),
        ("MmBackward0", "autograd & framework"),
    ],
)
def test_each_operator_lands_in_its_kind_of_work(op, kind):
    assert profile_step.category(op) == kind


def fake(mm: float, other: float, wall: float, plain: float) -> dict:
    return {
        "self_ms_per_step": {"aten::mm": mm, "aten::add": other},
        "wall_ms_per_step": wall,
        "unprofiled_ms_per_step": plain,
    }


def test_grouping_keeps_the_whole_step_and_the_budget_is_what_is_left_after_the_matmuls():
    r = fake(mm=60.0, other=25.0, wall=100.0, plain=90.0)
    g = profile_step.grouped(r)
    assert g["matmul & convolution"] == 60.0 and g["elementwise & reductions"] == 25.0
    assert g["not in any op"] == pytest.approx(15.0) and sum(g.values()) == pytest.approx(100.0)
    w = type("W", (), {"name": "t"})()
    lines = profile_step.report(
        {"ours": r, "peer": fake(50.0, 50.0, 130.0, 140.0), "broken": {"error": "boom"}}, "train", w, (1.0, 2.0)
    )
    budget_row = next(line for line in lines if line.startswith("| peer | 1"))
    assert budget_row == "| peer | 140.0 | 80.0 | 10.0 | 30.0 |"  # 140/1 - 60, 140/2 - 60; ours now: 90 - 60
    assert any("`broken`: boom" in line for line in lines)
