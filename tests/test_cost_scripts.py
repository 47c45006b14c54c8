"""The studies' cost scripts: FLOPs counted by torch's flop counter, per update (speech) and per step (agents)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from conftest import tiny_config

from benchmarks.flops import count, matching
from benchmarks.speech.cost import flops_per_update
from compressive_transformer.core.config import MemoryConfig, RunConfig, TrainConfig


def test_count_is_twice_the_multiply_adds_and_matching_sums_the_named_modules() -> None:
    net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    x = torch.randn(5, 8)
    total, per_module = count(lambda: net(x))
    assert total == 2 * 5 * (8 * 16 + 16 * 4)
    assert matching(per_module, r"\d+") == total and matching(per_module, r"0") == 2 * 5 * 8 * 16


def _run(**memory: int) -> RunConfig:
    return RunConfig(model=tiny_config(**memory), train=TrainConfig(batch_size=2))


def test_speech_flops_per_update() -> None:
    txl, ct = flops_per_update(_run(mem_len=16, cmem_len=0)), flops_per_update(_run(mem_len=8, cmem_len=4))
    for f in (txl, ct):
        assert 2 * f["forward"] < f["total"] < 4 * f["forward"], "backward costs about twice the forward"
        assert 0 < f["attention_forward"] < f["forward"]
    assert txl["compressors_forward"] == 0 < ct["compressors_forward"]
    wider = _run(mem_len=32, cmem_len=0)
    assert flops_per_update(wider)["attention_forward"] > txl["attention_forward"], "more keys, more attention"
    no_mem = dataclasses.replace(wider, model=dataclasses.replace(wider.model, memory=MemoryConfig(0, 0)))
    assert flops_per_update(no_mem)["total"] < txl["total"]


def test_agent_cost_per_step(tmp_path: Path) -> None:
    pytest.importorskip("torchrl")
    from benchmarks.agents.cost import measure_one
    from compressive_transformer.agents.config import load_rl_config

    config = Path(__file__).resolve().parents[1] / "configs" / "agents" / "nonmatching.toml"
    small = ["train.n_envs=2", "train.unroll=4", "train.log_every=1", "train.checkpoint_every=1"]
    ct4 = measure_one(load_rl_config(config, small), (1, 2), tmp_path / "ct4")
    txl48 = measure_one(
        load_rl_config(config, [*small, "model.mem_len=48", "model.cmem_len=0"]), (1, 2), tmp_path / "t"
    )
    lstm = measure_one(load_rl_config(config, [*small, 'core.kind="lstm"']), (1, 2), tmp_path / "lstm")
    assert (ct4["keys_per_query"], txl48["keys_per_query"], lstm["keys_per_query"]) == (19, 49, None)
    assert ct4["acting_attention_flops_per_step"] < txl48["acting_attention_flops_per_step"]
    assert lstm["acting_attention_flops_per_step"] == 0 and lstm["acting_flops_per_step"] > 0
    for c in (ct4, txl48, lstm):
        assert c["learning_flops_per_step"] > 0 and c["cpu_seconds_per_update"] > 0 and c["steps_per_update"] == 8
