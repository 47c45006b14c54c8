"""export / from_pretrained: a run written as config.json + model.safetensors + tokenizer.json loads back with one
call and computes exactly the same logits."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from compressive_transformer import cli, from_pretrained, load_run
from compressive_transformer.core.config import ConfigError
from compressive_transformer.runs.export import export_run
from compressive_transformer.runs.presets import TINY_TOML
from compressive_transformer.runs.rundir import config_from_text
from compressive_transformer.training.workflows import train_run

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("export")
    cfg = config_from_text(
        TINY_TOML, ["train.steps=2", "train.progress=false", "train.val_batches=1", "eval.mem_len=24"]
    )
    train_run(cfg, root / "run", log=lambda s: None)
    return root / "run"


def test_round_trip_is_bit_exact(run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "hf"
    assert cli.main(["export", str(run_dir), str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors", "tokenizer.json"]
    config = json.loads((out / "config.json").read_text())
    assert (
        config["model_type"] == "compressive-transformer" and config["d_model"] == 32 and config["checkpoint_step"] == 2
    )
    original, loaded = load_run(run_dir, device="cpu"), from_pretrained(out, device="cpu")
    assert loaded.config == original.config and loaded.mem_len == 24 and loaded.run_dir is None
    ids = original.encode("def f(x):\n    return x\n")
    assert loaded.encode("def f(x):\n    return x\n") == ids
    tokens = torch.tensor([ids])
    a = original.model(tokens, memory=original.model.init_memory(1)).logits
    b = loaded.model(tokens, memory=loaded.model.init_memory(1)).logits
    assert torch.equal(a, b)
    assert torch.equal(
        load_run(out).model(tokens, memory=loaded.model.init_memory(1)).logits, a
    )  # load_run reads exports too


def test_export_never_writes_into_a_directory_that_holds_something(run_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "taken"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="already holds"):
        export_run(run_dir, out)
    assert [p.name for p in out.iterdir()] == ["notes.txt"]
    with pytest.raises(ConfigError, match="no config.json"):
        from_pretrained(tmp_path)
