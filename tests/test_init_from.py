"""`train --init-from` and `train.freeze`: a Transformer-XL run's weights start a Compressive Transformer, the shared
parameters are copied exactly, the new ones listed, frozen ones stay put, and mistakes end in one line."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from compressive_transformer.runs.loading import load_run
from tests.cli_helpers import assert_one_line_error, cli_run

XL = ["--set", "model.cmem_len=0", "--set", "train.steps=3", "--set", "train.checkpoint_every=0"]


@pytest.fixture(scope="module")
def xl_run(tmp_path_factory) -> Path:
    from compressive_transformer import cli

    run = tmp_path_factory.mktemp("xl") / "run"
    assert cli.main(["train", "--run-dir", str(run), *XL]) == 0
    return run


def params(run_dir: Path) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in load_run(run_dir, device="cpu").model.state_dict().items()}


def test_compressor_only_then_everything(tmp_path, capsys, xl_run):
    source = params(xl_run)
    frozen = tmp_path / "ct-frozen"
    code, out, err = cli_run(
        capsys, "train", "--run-dir", str(frozen), "--init-from", str(xl_run),
        "--set", "train.steps=4", "--set", 'train.freeze=["copied"]', "--set", "train.checkpoint_every=2",
    )  # fmt: skip
    assert code == 0, err
    assert "copied" in out and "compressors.0" in out  # the new parameters are listed
    after = params(frozen)
    assert all(torch.equal(after[k], v) for k, v in source.items())  # everything copied stays as it was
    new = [k for k in after if k not in source]
    assert new and all(k.startswith("compressors.") or ".attn.c" in k for k in new)  # compressor, cmem positions
    assert (frozen / "config.toml").read_text().count("init_from") == 1
    # a resumed run freezes the same tensors (recorded in the run) without reading the source again
    shutil.rmtree(frozen / "checkpoints" / "step-00000004")
    code, out, err = cli_run(capsys, "train", "--run-dir", str(frozen), "--resume")
    assert code == 0, err
    resumed = params(frozen)
    assert all(torch.equal(resumed[k], v) for k, v in source.items())

    full = tmp_path / "ct-full"
    code, out, err = cli_run(
        capsys, "train", "--run-dir", str(full), "--init-from", str(frozen), "--set", "train.steps=2",
        "--set", "train.checkpoint_every=0",
    )  # fmt: skip
    assert code == 0, err
    trained = params(full)
    assert not torch.equal(trained["blocks.0.attn.qkv.weight"], source["blocks.0.attn.qkv.weight"])


def test_freezing_reaches_exactly_the_compressor():
    from compressive_transformer.core.config import ModelConfig
    from compressive_transformer.core.models import build_model
    from compressive_transformer.runs.init_from import freeze

    model = build_model(ModelConfig.from_raw(dict(vocab_size=32, d_model=16, n_layers=1, n_heads=2, d_ff=32, seg_len=4, mem_len=4,
                                    cmem_len=4, compression_rate=2, dropout=0.0)))  # fmt: skip
    freeze(model, ("model",))
    memory = None
    for _ in range(3):  # until the memory evicts and the compression loss exists
        out = model(torch.randint(0, 32, (2, 4)), memory, targets=torch.randint(0, 32, (2, 4)))
        memory = out.memory.detach()
    (out.loss + out.aux_loss).backward()
    compressor = {id(p) for p in model.parameters_of("compressor")}
    assert all((p.grad is not None) == (id(p) in compressor) for p in model.parameters())


def test_mistakes_end_in_one_line(tmp_path, capsys, xl_run):
    code, _, err = cli_run(capsys, "train", "--run-dir", str(tmp_path / "a"), "--init-from", str(xl_run),
                           "--set", "model.d_ff=48")  # fmt: skip
    assert_one_line_error(code, err, "blocks.0.ff.0.weight", "(64, 32)", "(48, 32)")
    code, _, err = cli_run(capsys, "train", "--run-dir", str(tmp_path / "b"), "--init-from", str(xl_run),
                           *XL, "--set", 'train.freeze=["model"]')  # fmt: skip
    assert_one_line_error(code, err, "train.freeze", "freezes every parameter")
    code, _, err = cli_run(capsys, "train", "--run-dir", str(tmp_path / "e"), *XL, "--set", 'train.freeze=["copied"]')
    assert_one_line_error(code, err, "train.freeze", "--init-from")
    code, _, err = cli_run(capsys, "train", "--run-dir", str(tmp_path / "c"), "--init-from", str(tmp_path / "none"))
    assert_one_line_error(code, err, "--init-from", "does not exist")
    code, _, err = cli_run(capsys, "train", "--run-dir", str(xl_run), "--resume", "--init-from", str(xl_run))
    assert_one_line_error(code, err, "--init-from")
    code, _, err = cli_run(capsys, "train", "--run-dir", str(tmp_path / "d"), "--set", 'train.freeze=["all"]')
    assert_one_line_error(code, err, "train.freeze")
    assert not any((tmp_path / n).exists() for n in "abcde")
