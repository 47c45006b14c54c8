"""The agent learner's optimizer and schedule (agents.optim): IMPALA's RMSProp as configured, the linear anneal,
exact resume with both, and runs written before the keys existed keep meaning Adam at a constant rate."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import pytest
import torch
from conftest import AGENT_TINY
from safetensors.torch import load_file

pytest.importorskip("gymnasium")
pytest.importorskip("torchrl")

from compressive_transformer.agents.config import (  # noqa: E402
    LEGACY_LEARNER,
    RLTrainConfig,
    load_rl_config,
    load_saved_config,
)
from compressive_transformer.agents.optim import build_optimizer, learning_rate  # noqa: E402
from compressive_transformer.agents.train import train_agent  # noqa: E402
from compressive_transformer.core.config import load_toml  # noqa: E402
from compressive_transformer.runs.checkpoint import list_checkpoints  # noqa: E402
from compressive_transformer.runs.metrics import read_metrics  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "agents" / "nonmatching.toml"
TINY = [*AGENT_TINY, "train.log_every=1"]  # a record at every one of its 8 updates
IMPALA = ['train.optimizer="rmsprop"', 'train.lr_schedule="linear"', "train.lr=0.004"]


def test_rmsprop_is_built_with_impalas_settings() -> None:
    param = torch.nn.Parameter(torch.zeros(3))
    opt = build_optimizer([param], RLTrainConfig(optimizer="rmsprop", lr=4e-3))
    assert type(opt) is torch.optim.RMSprop
    group = opt.param_groups[0]
    assert (group["lr"], group["alpha"], group["eps"], group["momentum"], group["centered"]) == (
        4e-3,
        0.99,
        0.01,
        0.0,
        False,
    )
    assert type(build_optimizer([param], RLTrainConfig())) is torch.optim.Adam
    # the large epsilon: a gradient far below it moves the weight by about lr * grad / eps, not by lr (Adam's)
    param.grad = torch.full((3,), 1e-5)
    opt.step()
    step = -float(param.detach()[0])
    assert step == pytest.approx(4e-3 * 1e-5 / (math.sqrt(0.01 * 1e-10) + 0.01), rel=1e-4)


def test_adam_is_built_with_its_epsilon() -> None:
    """train.adam_eps reaches Adam: a gradient far below epsilon moves the weight by about lr * grad / eps, one far
    above it by about lr (eps 1e-8, the old learner, normalises both to lr)."""
    for eps, grad, expected in ((1e-8, 1e-5, 1e-3), (1e-3, 1e-5, 1e-3 * 1e-5 / (1e-5 + 1e-3)), (1e-3, 1.0, 1e-3)):
        param = torch.nn.Parameter(torch.zeros(1))
        opt = build_optimizer([param], RLTrainConfig(lr=1e-3, adam_eps=eps))
        assert opt.param_groups[0]["eps"] == eps
        param.grad = torch.full((1,), grad)
        opt.step()  # Adam's first step, bias-corrected: lr * g / (|g| + eps)
        assert -float(param.detach()[0]) == pytest.approx(expected, rel=1e-3)
    assert RLTrainConfig().adam_eps == 1e-8


def test_the_linear_schedule_anneals_to_zero_at_the_last_step() -> None:
    tc = RLTrainConfig(lr=2e-3, lr_schedule="linear")
    rates = [learning_rate(tc, u, 8) for u in range(9)]
    assert rates[0] == 2e-3 and rates[8] == 0.0
    assert rates == pytest.approx([2e-3 * (1 - u / 8) for u in range(9)])
    assert {learning_rate(RLTrainConfig(lr=2e-3), u, 8) for u in range(9)} == {2e-3}


def test_a_run_logs_the_annealed_rate_and_resumes_exactly(tmp_path: Path) -> None:
    torch.set_num_threads(1)
    cfg = load_rl_config(CONFIG, [*TINY, *IMPALA])
    full = tmp_path / "full"
    train_agent(cfg, full, progress=False)
    records = read_metrics(full)
    assert [r["lr"] for r in records] == pytest.approx([0.004 * (1 - (s - 1) / 8) for s in range(1, 9)])
    ckpt = list_checkpoints(full)[-1]
    assert any("square_avg" in key for key in load_file(ckpt / "optimizer.safetensors"))  # RMSProp's state

    cut = tmp_path / "cut"  # killed after its checkpoint at update 4: the schedule goes on from update 4, not 0
    shutil.copytree(full, cut)
    shutil.rmtree(list_checkpoints(cut)[-1])
    train_agent(None, cut, resume=True, progress=False)
    assert read_metrics(cut) == records
    for name in ("model.safetensors", "optimizer.safetensors", "optimizer.json"):
        assert (list_checkpoints(cut)[-1] / name).read_bytes() == (ckpt / name).read_bytes(), name


def test_a_run_config_from_before_the_learner_keys_means_adam_at_a_constant_rate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert LEGACY_LEARNER == {
        "optimizer": "adam",
        "adam_eps": 1e-8,
        "lr_schedule": "constant",
        "loss_reduction": "mean",
    }
    saved = ROOT / "benchmarks" / "agents" / "control" / "runs" / "txl-seed0" / "config.toml"
    assert "optimizer" not in load_toml(saved)["train"]
    old = tmp_path / "old.toml"  # such a config, but the defaults' learner stated otherwise: the file's own keys win
    text = saved.read_text(encoding="utf-8").replace("[train]\n", '[train]\nlr_schedule = "linear"\n')
    old.write_text(text, encoding="utf-8")
    assert load_saved_config(old).train.lr_schedule == "linear"
    assert load_saved_config(old).train.optimizer == "adam"
    new = tmp_path / "new.toml"
    new.write_text(text.replace("[train]\n", '[train]\noptimizer = "rmsprop"\n'), encoding="utf-8")
    assert load_saved_config(new).train.optimizer == "rmsprop"
    # the learner comparison's runs name their optimizer but were written before train.adam_eps: the legacy value
    # fills the one key they lack (not the default, nor nothing because they name the optimizer)
    learner = ROOT / "benchmarks" / "agents" / "learner" / "runs" / "txl-adam-seed0" / "config.toml"
    assert "adam_eps" not in load_toml(learner)["train"]
    assert load_saved_config(learner).train.adam_eps == 1e-8
    monkeypatch.setitem(LEGACY_LEARNER, "adam_eps", 3e-8)
    assert load_saved_config(learner).train.adam_eps == 3e-8
    assert load_saved_config(learner).train.optimizer == "adam"


@pytest.mark.parametrize("spec", ["pilot", "pilot-long", "full", "reach", "control"])
def test_the_earlier_studies_pin_the_learner_they_ran_with(spec: str) -> None:
    """A committed study spec keeps meaning Adam at a constant 5e-4 whatever the defaults become."""
    from benchmarks.agents.run import arm_overrides

    raw = load_toml(ROOT / "benchmarks" / "agents" / f"{spec}.toml")
    for arm in raw["models"]:
        overrides = arm_overrides(raw, arm)
        pins = ('train.optimizer="adam"', 'train.lr_schedule="constant"', 'train.loss_reduction="mean"')
        assert all(pin in overrides for pin in pins), arm
        train = load_rl_config(ROOT / raw["config"], overrides).train
        assert (train.optimizer, train.lr_schedule, train.lr) == ("adam", "constant", 5e-4)


def test_the_summed_loss_is_the_mean_times_the_steps() -> None:
    from compressive_transformer.agents.actor_critic import AgentOutput, Rollout, vtrace_losses

    g = torch.Generator().manual_seed(0)
    T, B, A = 5, 3, 2
    logits = torch.randn(T + 1, B, A, generator=g, requires_grad=True)
    out = AgentOutput(logits, torch.randn(T + 1, B, generator=g), None, torch.tensor(0.25))  # type: ignore[arg-type]
    actions = torch.randint(0, A, (T, B), generator=g)
    roll = Rollout(
        obs=torch.zeros(T + 1, B, 1),
        first=torch.zeros(T + 1, B, dtype=torch.bool),
        actions=actions,
        behaviour_logp=torch.log_softmax(logits[:-1].detach(), -1).gather(-1, actions[..., None])[..., 0],
        rewards=torch.rand(T, B, generator=g),
        done=torch.zeros(T, B, dtype=torch.bool),
    )
    kw = {"gamma": 0.9, "entropy_cost": 0.01, "value_cost": 0.5}
    mean, summed = vtrace_losses(out, roll, **kw), vtrace_losses(out, roll, **kw, reduction="sum")
    assert float(summed.total.detach()) == pytest.approx(T * B * float(mean.total.detach()), rel=1e-6)
    assert (summed.policy, summed.value, summed.entropy) == (mean.policy, mean.value, mean.entropy)
    (grad_mean,) = torch.autograd.grad(mean.total, logits)
    (grad_sum,) = torch.autograd.grad(summed.total, logits)
    torch.testing.assert_close(grad_sum, T * B * grad_mean)


def test_the_arms_parameter_counts() -> None:
    """The control's arms as built; the observation embedding is 11 inputs x 32 + 32 biases = 384 of them (without
    its 352 weights: ct4 55,139, txl and txl48 44,835, ct1 48,995, LSTM 25,315)."""
    from benchmarks.agents.run import arm_parameters

    spec = load_toml(ROOT / "benchmarks" / "agents" / "control.toml")
    spec["config"] = str(ROOT / spec["config"])
    counts = {arm: arm_parameters(spec, arm) for arm in spec["models"]}
    assert {c["observation_embedding"] for c in counts.values()} == {384}
    total = {arm: c["total"] for arm, c in counts.items()}
    assert total == {"lstm": 25_667, "lstm40": 25_667, "txl": 45_187, "txl48": 45_187, "ct1": 49_347, "ct4": 55_491}
