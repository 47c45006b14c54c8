"""Trainer: exact resume, accumulation, optimizer groups, memory resets, metrics, divergence handling."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import safetensors.torch
import torch

from compressive_transformer.core.config import RunConfig
from compressive_transformer.data import build_tokenizer, load_corpus, read_documents
from compressive_transformer.runs.checkpoint import list_checkpoints, load_checkpoint
from compressive_transformer.runs.metrics import read_metrics
from compressive_transformer.runs.presets import TINY_TOML
from compressive_transformer.runs.rundir import config_from_text
from compressive_transformer.training.trainer import Trainer, TrainingError
from compressive_transformer.training.workflows import train_run

torch.set_num_threads(1)
QUIET = ["train.progress=false", "train.val_batches=2"]


def tiny(*overrides: str) -> RunConfig:
    return config_from_text(TINY_TOML, [*QUIET, *overrides])


def trainer(cfg: RunConfig, run_dir: Path, *, validation: bool = False) -> Trainer:
    tok = build_tokenizer(cfg.data, read_documents(cfg.data, "train"))
    cache = run_dir / ".cache"
    val = load_corpus(cfg.data, "validation", tok, cache) if validation else None
    return Trainer(
        cfg,
        train_corpus=load_corpus(cfg.data, "train", tok, cache),
        val_corpus=val,
        run_dir=run_dir,
        log=lambda s: None,
    )


def _without_timing(records: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "tokens_per_s"} for r in records]


def test_killed_and_resumed_run_reproduces_the_uninterrupted_losses_exactly(tmp_path: Path) -> None:
    cfg = tiny(
        "train.steps=8",
        "train.log_every=1",
        "train.checkpoint_every=3",
        "train.accumulate=[[0, 1], [5, 2]]",
        "model.dropout=0.1",
        "train.val_every=4",
    )
    whole = train_run(cfg, tmp_path / "whole", log=lambda s: None)
    part = train_run(
        cfg, tmp_path / "killed", max_steps=5, log=lambda s: None
    )  # "killed" after step 5, last checkpoint 3
    assert part.step == 5 and list_checkpoints(tmp_path / "killed")[-1].name == "step-00000003"
    resumed = train_run(None, tmp_path / "killed", resume=True, log=lambda s: None)

    assert resumed.step == 8
    assert whole.losses[3:] == resumed.losses  # steps 4..8, bit for bit
    assert whole.losses[:5] == part.losses
    a = _without_timing(read_metrics(tmp_path / "whole"))
    b = _without_timing(read_metrics(tmp_path / "killed"))
    assert a == b  # every logged loss, aux loss, lr, grad norm and validation result
    assert [r["step"] for r in a if "loss" in r] == list(range(1, 9))
    wa = safetensors.torch.load_file(str(list_checkpoints(tmp_path / "whole")[-1] / "model.safetensors"))
    wb = safetensors.torch.load_file(str(list_checkpoints(tmp_path / "killed")[-1] / "model.safetensors"))
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


def test_update_frequency_drops_as_scheduled(tmp_path: Path) -> None:
    t = trainer(tiny("train.accumulate=[[0, 1], [2, 3]]"), tmp_path)
    records = [t.train_step() for _ in range(4)]
    assert [r["accumulate"] for r in records] == [1, 1, 3, 3]
    assert t.batcher.state_dict()["step"] == 1 + 1 + 3 + 3


def test_model_and_compressor_are_separate_param_groups(tmp_path: Path) -> None:
    t = trainer(tiny("train.compressor_lr_scale=0.0", "train.warmup_steps=0"), tmp_path)
    names = [g["name"] for g in t.optimizer.param_groups]
    assert names == ["model", "compressor"]
    compressor = {id(p) for p in t.model.parameters_of("compressor")}
    assert compressor and compressor == {id(p) for p in t.optimizer.param_groups[1]["params"]}
    before = {n: p.detach().clone() for n, p in t.model.named_parameters()}
    t.train_step()
    assert t.optimizer.param_groups[1]["lr"] == 0.0 and t.optimizer.param_groups[0]["lr"] > 0
    moved = {n for n, p in t.model.named_parameters() if not torch.equal(p, before[n])}
    compressor_names = {n for n, p in t.model.named_parameters() if id(p) in compressor}
    assert moved and not moved & compressor_names  # lr scale 0: the compressor stays put, the rest trains


def test_parameter_free_compression_has_one_group(tmp_path: Path) -> None:
    t = trainer(tiny('model.compression="max_pool"', 'model.compression_loss="none"'), tmp_path)
    assert [g["name"] for g in t.optimizer.param_groups] == ["model"]


def test_memory_rows_are_reset_at_document_boundaries(tmp_path: Path) -> None:
    t = trainer(tiny(), tmp_path)
    t.train_step()
    t.train_step()  # memory is now full for every row
    seen = []
    real_forward = t.forward

    def spy(tokens, memory, **kw):
        seen.append(memory)
        return real_forward(tokens, memory=memory, **kw)

    batch = next(t.batches)
    batch.reset = torch.tensor([True, False, False, False])
    t.batches = iter([batch])
    t.forward = spy
    t.train_step()
    layer = seen[0].layers[0]
    assert not layer.mem_mask[0].any() and not layer.cmem_mask[0].any()
    assert layer.mem_mask[1:].any(1).all() and layer.cmem_mask[1:].any(1).all()


def test_metrics_jsonl_has_the_promised_fields(tmp_path: Path) -> None:
    t = trainer(tiny("train.steps=4", "train.log_every=2", "train.val_every=2"), tmp_path, validation=True)
    t.train()
    records = read_metrics(tmp_path)
    train_records = [r for r in records if "loss" in r]
    assert [r["step"] for r in train_records] == [2, 4]
    for r in train_records:
        for key in (
            "step",
            "loss",
            "lr",
            "tokens_per_s",
            "bits_per_token",
            "ppl",
            "aux_loss",
            "aux_losses",
            "grad_norm",
            "mem_fill",
            "cmem_fill",
        ):
            assert key in r, key
        assert len(r["aux_losses"]) == 2 and 0 <= r["mem_fill"] <= 1 and r["tokens_per_s"] > 0
    assert [r["step"] for r in records if "val_bits_per_token" in r] == [2, 4]
    assert all(json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines())


def test_diverging_loss_stops_with_one_line_and_keeps_the_last_checkpoint(tmp_path: Path) -> None:
    t = trainer(tiny("train.checkpoint_every=2"), tmp_path)
    t.train(max_steps=2)
    good = list_checkpoints(tmp_path)
    real_forward = t.forward

    def poisoned(*args, **kw):
        out = real_forward(*args, **kw)
        return dataclasses.replace(out, loss=out.loss * float("nan"))

    t.forward = poisoned
    with pytest.raises(TrainingError) as info:
        t.train()
    message = str(info.value)
    assert "\n" not in message and "nan" in message and "step 3" in message and "step-00000002" in message
    assert list_checkpoints(tmp_path) == good
    fresh = trainer(tiny(), tmp_path / "fresh")
    assert load_checkpoint(good[-1], model=fresh.model).step == 2


def test_same_seed_same_losses_other_seed_other_losses(tmp_path: Path) -> None:
    losses = []
    for i, seed in enumerate((1, 1, 2)):  # one after the other: dropout draws from the global torch RNG
        t = trainer(tiny(f"train.seed={seed}", "model.dropout=0.1"), tmp_path / str(i))
        losses.append([t.train_step()["loss"] for _ in range(3)])
    assert losses[0] == losses[1] and losses[0] != losses[2]


@pytest.mark.parametrize("amp", ["bf16", "fp16"])
def test_mixed_precision_trains_on_cpu(tmp_path: Path, amp: str) -> None:
    t = trainer(tiny(f'train.amp="{amp}"'), tmp_path)
    losses = [t.train_step()["loss"] for _ in range(3)]
    assert all(torch.isfinite(torch.tensor(losses)))


def test_resuming_on_other_data_names_data_path(tmp_path: Path) -> None:
    from compressive_transformer.core.config import ConfigError

    for name, docs in (("a", 3), ("b", 5)):
        for split in ("train", "validation", "test"):
            (tmp_path / name / split).mkdir(parents=True)
            for i in range(docs):
                (tmp_path / name / split / f"{i}.txt").write_text(f"document {i} of {name}. " * 30)
    sets = ["data.format=text", "data.tokenizer=bytes", "train.progress=false", "train.val_batches=1"]
    cfg = config_from_text(TINY_TOML, [*sets, f"data.path={tmp_path / 'a'}", "train.steps=2"])
    train_run(cfg, tmp_path / "run", log=lambda s: None)
    with pytest.raises(ConfigError) as e:
        train_run(None, tmp_path / "run", resume=True, overrides=[f"data.path={tmp_path / 'b'}", "train.steps=4"])
    message = str(e.value)
    assert message.startswith(f"data.path: {tmp_path / 'b'} is not the data this run was trained on (saved with")
    assert "data.path may change on resume only to where the same data moved" in message and "\n" not in message
