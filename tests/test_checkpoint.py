"""Checkpoints: exact round trips, keep-last-N, atomic writes that survive a failure midway, mismatch errors."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import safetensors.torch
import torch

from compressive_transformer.core.config import ModelConfig
from compressive_transformer.core.memory import MemoryState
from compressive_transformer.core.models import CompressiveTransformerLM
from compressive_transformer.runs.checkpoint import (
    CheckpointError,
    CheckpointWriteError,
    decode,
    encode,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    save_checkpoint,
)

torch.set_num_threads(1)
CFG = ModelConfig.from_raw(
    dict(
        vocab_size=50,
        d_model=16,
        n_layers=2,
        n_heads=2,
        d_ff=32,
        seg_len=4,
        mem_len=4,
        cmem_len=2,
        compression_rate=2,
        dropout=0.0,
    )
)


def _trained(seed: int = 0) -> tuple[CompressiveTransformerLM, torch.optim.Adam, MemoryState]:
    torch.manual_seed(seed)
    model = CompressiveTransformerLM(CFG)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    memory = model.init_memory(2)
    for _ in range(3):
        x = torch.randint(0, 50, (2, 4))
        out = model(x, memory=memory, targets=x)
        (out.loss + out.aux_loss).backward()
        opt.step()
        opt.zero_grad()
        memory = out.memory
    return model, opt, memory


def _save(run: Path, step: int, model, opt, memory, keep: int = 3) -> Path:
    return save_checkpoint(
        run,
        step,
        model=model,
        optimizer=opt,
        memory=memory.to_tensors(),
        data_state={"epoch": 1, "pos": (3, 4)},
        config_toml="[model]\n",
        keep=keep,
    )


def test_round_trip_restores_weights_optimizer_memory_rng_and_data(tmp_path: Path) -> None:
    model, opt, memory = _trained()
    random.seed(7)
    np.random.seed(7)
    torch.manual_seed(7)
    path = _save(tmp_path, 3, model, opt, memory)
    expected = (random.random(), float(np.random.rand()), torch.rand(3))

    model2, opt2, _ = _trained(seed=1)
    ckpt = load_checkpoint(path, model=model2, optimizer=opt2)
    assert (random.random(), float(np.random.rand())) == expected[:2] and torch.equal(torch.rand(3), expected[2])
    assert ckpt.step == 3 and ckpt.data_state == {"epoch": 1, "pos": (3, 4)} and ckpt.optimizer_loaded
    for (k, a), (_, b) in zip(model.state_dict().items(), model2.state_dict().items()):
        assert torch.equal(a, b), k
    saved, loaded = opt.state_dict()["state"], opt2.state_dict()["state"]
    assert sorted(saved) == sorted(loaded)
    for pid in saved:
        assert all(torch.equal(saved[pid][k], loaded[pid][k]) for k in saved[pid]), pid
    assert opt2.state_dict()["param_groups"] == opt.state_dict()["param_groups"]
    restored = MemoryState.from_tensors(ckpt.memory)
    for la, lb in zip(memory.layers, restored.layers):
        assert torch.equal(la.mem, lb.mem) and torch.equal(la.cmem_mask, lb.cmem_mask) and la.fill == lb.fill


def test_keeps_only_the_newest_checkpoints(tmp_path: Path) -> None:
    model, opt, memory = _trained()
    for step in (1, 2, 3, 4):
        _save(tmp_path, step, model, opt, memory, keep=2)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step-00000003", "step-00000004"]
    assert latest_checkpoint(tmp_path).name == "step-00000004"


def test_interrupted_write_leaves_the_previous_checkpoint_loadable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, opt, memory = _trained()
    good = _save(tmp_path, 2, model, opt, memory)
    real_save = safetensors.torch.save_file

    def failing_save(tensors, filename, metadata=None):  # writes half a file, then the disk "fills up"
        real_save(tensors, filename, metadata)
        Path(filename).write_bytes(Path(filename).read_bytes()[:100])
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(safetensors.torch, "save_file", failing_save)
    with pytest.raises(CheckpointWriteError, match=f"No space left on device.*{good}, which is intact"):
        _save(tmp_path, 4, model, opt, memory)
    monkeypatch.undo()
    assert list_checkpoints(tmp_path) == [good]
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == [good.name]  # no temp debris either
    fresh, fresh_opt, _ = _trained(seed=3)
    assert load_checkpoint(good, model=fresh, optimizer=fresh_opt).step == 2
    assert all(torch.equal(a, b) for a, b in zip(fresh.state_dict().values(), model.state_dict().values()))


def test_resaving_a_step_replaces_it(tmp_path: Path) -> None:
    model, opt, memory = _trained()
    _save(tmp_path, 5, model, opt, memory)
    with torch.no_grad():
        next(model.parameters()).add_(1.0)
    path = _save(tmp_path, 5, model, opt, memory)
    fresh, _, _ = _trained(seed=2)
    load_checkpoint(path, model=fresh)
    assert all(torch.equal(a, b) for a, b in zip(fresh.state_dict().values(), model.state_dict().values()))
    assert len(list((tmp_path / "checkpoints").iterdir())) == 1


def test_checkpoint_of_another_shape_is_a_one_line_error(tmp_path: Path) -> None:
    model, opt, memory = _trained()
    path = _save(tmp_path, 1, model, opt, memory)
    other = CompressiveTransformerLM(ModelConfig(**{**CFG.__dict__, "vocab_size": 60}))
    with pytest.raises(CheckpointError, match="another shape or vocabulary") as info:
        load_checkpoint(path, model=other)
    assert "\n" not in str(info.value)


def test_incomplete_checkpoint_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "step-00000001").mkdir()
    model, _, _ = _trained()
    with pytest.raises(CheckpointError, match="incomplete"):
        load_checkpoint(tmp_path / "step-00000001", model=model)


def test_state_encoding_is_reversible() -> None:
    state = {"a": (1, 2), "b": [np.arange(3, dtype=np.int32), torch.tensor([1.5])], 3: None, "c": np.int64(4)}
    back = decode(encode(state))
    assert back["a"] == (1, 2) and back[3] is None and back["c"] == 4
    assert back["b"][0].dtype == np.int32 and np.array_equal(back["b"][0], np.arange(3))
    assert torch.equal(back["b"][1], torch.tensor([1.5]))
