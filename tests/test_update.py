"""The optimizer update (training/update.py), one function for the eager and the captured step: clipping, the Adam
step, and the skip of a step whose gradient is not finite, which leaves the weights and the optimizer's moments as
they were, on the device (fused Adam's flag) and on the host alike."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from test_train import tiny, trainer

from compressive_transformer.training import captured
from compressive_transformer.training import trainer as trainer_module
from compressive_transformer.training.trainer import TrainingError, adam
from compressive_transformer.training.update import apply_update, set_learning_rate


def _params(n: int = 3) -> list[torch.nn.Parameter]:
    torch.manual_seed(0)
    return [torch.nn.Parameter(torch.randn(4)) for _ in range(n)]


def _state(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [t.clone() for s in optimizer.state.values() for t in s.values() if isinstance(t, torch.Tensor)]


@pytest.mark.parametrize("fused", [True, False], ids=["fused (skip on the device)", "foreach (skip on the host)"])
def test_a_non_finite_gradient_leaves_weights_and_moments_unchanged(fused: bool) -> None:
    params = _params()
    optimizer = adam(params, lr=0.1) if fused else torch.optim.Adam(params, lr=0.1, foreach=True)
    assert all(g.get("fused") for g in optimizer.param_groups) == fused
    for p in params:
        p.grad = torch.ones_like(p)
    apply_update(optimizer, params, max_norm=1.0)  # one good step, so there are moments to keep
    weights, moments = [p.detach().clone() for p in params], _state(optimizer)
    for bad in (float("nan"), float("inf")):
        for p in params:
            p.grad = torch.ones_like(p)
        params[1].grad[2] = bad
        norm = apply_update(optimizer, params, max_norm=1.0)
        assert not torch.isfinite(norm)
        for before, p in zip(weights, params):
            assert torch.equal(before, p.detach())
        for before, after in zip(moments, _state(optimizer)):
            assert torch.equal(before, after)  # the step count included: the bias correction is not advanced
    for p in params:
        p.grad = torch.ones_like(p)
    apply_update(optimizer, params, max_norm=1.0)
    assert not torch.equal(weights[0], params[0].detach())  # a finite gradient steps again


def test_clipping_and_the_learning_rate_scale_per_group() -> None:
    a, b = _params(2)
    optimizer = adam([{"params": [a], "lr_scale": 1.0}, {"params": [b], "lr_scale": 0.5}], lr=1.0)
    set_learning_rate(optimizer, 0.2)
    assert [g["lr"] for g in optimizer.param_groups] == [0.2, 0.1]
    a.grad, b.grad = torch.full((4,), 3.0), torch.full((4,), 4.0)
    norm = apply_update(optimizer, [a, b], max_norm=1.0)
    assert float(norm) == pytest.approx(10.0, rel=1e-6)  # sqrt(4 * 3^2 + 4 * 4^2), before clipping
    assert torch.linalg.vector_norm(torch.cat([a.grad, b.grad])) == pytest.approx(1.0, rel=1e-5)


@pytest.mark.parametrize("cuda_graphs", [False, True], ids=["eager", "captured"])
def test_the_eager_and_the_captured_step_take_their_update_from_apply_update(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    recorded,
    cuda_graphs: bool,
) -> None:
    """Each update reaches the optimizer through apply_update once, and only through it: with apply_update made a
    no-op, no weight moves on either path."""
    calls: list[int] = []
    for module in (trainer_module, captured):
        monkeypatch.setattr(module, "apply_update", lambda *a, **k: calls.append(1) or torch.tensor(0.0))
    t = trainer(tiny("train.accumulate=[[0, 1]]", f"train.cuda_graphs={str(cuda_graphs).lower()}"), tmp_path)
    weights = copy.deepcopy(t.model.state_dict())
    for _ in range(4):
        t.train_step()
    assert len(calls) == 4
    for name, value in t.model.state_dict().items():
        assert torch.equal(value, weights[name]), name


@pytest.mark.parametrize("cuda_graphs", [False, True], ids=["eager", "captured"])
def test_a_non_finite_gradient_stops_training_with_the_weights_intact(
    tmp_path: Path,
    recorded,
    cuda_graphs: bool,
) -> None:
    t = trainer(tiny("train.accumulate=[[0, 1]]", f"train.cuda_graphs={str(cuda_graphs).lower()}"), tmp_path)
    assert (t.captured is not None) == cuda_graphs
    for _ in range(3):
        t.train_step()
    weights = copy.deepcopy(t.model.state_dict())
    moments = _state(t.optimizer)
    victim = next(p for p in t.model.parameters() if p.requires_grad)
    handle = victim.register_hook(lambda g: g * float("nan"))
    try:
        with pytest.raises(TrainingError, match="the gradient norm became nan"):
            t.train_step()
    finally:
        handle.remove()
    for name, value in t.model.state_dict().items():
        assert torch.equal(value, weights[name]), name
    for before, after in zip(moments, _state(t.optimizer)):
        assert torch.equal(before, after)
