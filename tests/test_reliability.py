"""What a run survives: interruptions before the first checkpoint, damaged checkpoints of every kind, divergence,
two processes on one run, a read-only run, bad sampling settings, bad API inputs and hostile download listings.
Each case ends cleanly: the run continues (exactly), falls back with a one-line message, or stops in one line with
nothing lost."""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import safetensors.torch
import torch
from cli_helpers import FAST, assert_one_line_error, cli_run

from compressive_transformer import cli
from compressive_transformer.core.config import ConfigError, ModelConfig, TrainConfig
from compressive_transformer.core.models import CompressiveTransformerLM, build_model
from compressive_transformer.data import DownloadError
from compressive_transformer.data.download import safe_pg19_name
from compressive_transformer.inference import workflows as run_module
from compressive_transformer.inference.generate import check_sampling, clean_prompt
from compressive_transformer.runs.checkpoint import (
    CheckpointError,
    NonFiniteWeights,
    list_checkpoints,
    load_weights,
    save_checkpoint,
)
from compressive_transformer.runs.integrity import MANIFEST, write_manifest
from compressive_transformer.runs.metrics import METRICS_FILE, read_metrics
from compressive_transformer.runs.rundir import read_run_config
from compressive_transformer.runs.runlock import RunLock
from compressive_transformer.training.trainer import Trainer

torch.set_num_threads(1)
download_module = importlib.import_module(
    "compressive_transformer.data.download"
)  # the package re-exports a function of that name


def weights(ckpt: Path) -> dict[str, torch.Tensor]:
    return safetensors.torch.load_file(str(ckpt / "model.safetensors"))


def same_weights(a: Path, b: Path) -> bool:
    wa, wb = weights(a), weights(b)
    return wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


@pytest.fixture
def reference(finished_run: Path) -> Path:
    """An uninterrupted run of 6 steps with checkpoints at 2, 4, 6."""
    return finished_run


@pytest.fixture
def trained(finished_run_copy: Path) -> Path:
    """A private copy of the reference run to damage."""
    return finished_run_copy


def interrupt_at(monkeypatch: pytest.MonkeyPatch, step: int, error: BaseException) -> None:
    original = Trainer.train_step

    def failing(self: Trainer):
        if self.step == step:
            raise error
        return original(self)

    monkeypatch.setattr(Trainer, "train_step", failing)


# ---------------------------------------------------------------------------------------------------------------
# a run can always be continued


ctrl_c = KeyboardInterrupt()


@pytest.mark.parametrize(
    "error", [ctrl_c, MemoryError("out of memory"), RuntimeError("boom")], ids=["ctrl-c", "oom", "exception"]
)
def test_failure_before_the_first_checkpoint_resumes_exactly(
    error: BaseException,
    reference: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
) -> None:
    run_dir = tmp_path / "run"
    with monkeypatch.context() as m:
        interrupt_at(m, 1, error)
        try:  # Ctrl-C: the CLI's exit code; out of memory: a one-line error naming the sizes
            assert cli.main(["train", "--run-dir", str(run_dir), *FAST]) == (130 if error is ctrl_c else 2)
        except RuntimeError:
            pass
    assert list_checkpoints(run_dir) == [] and (run_dir / "config.toml").is_file()
    code, out, err = cli_run(capsys, "train", "--run-dir", str(run_dir), "--resume")
    assert code == 0, err
    assert "at step 0" in out
    assert same_weights(list_checkpoints(run_dir)[-1], list_checkpoints(reference)[-1]), "resume from step 0 is exact"


def test_ctrl_c_mid_run_resumes_from_the_last_checkpoint_exactly(
    reference: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    run_dir = tmp_path / "run"
    with monkeypatch.context() as m:
        interrupt_at(m, 3, KeyboardInterrupt())
        code, _, err = cli_run(capsys, "train", "--run-dir", str(run_dir), *FAST)
    assert code == 130 and "--resume" in err
    assert cli.main(["train", "--run-dir", str(run_dir), "--resume"]) == 0
    assert same_weights(list_checkpoints(run_dir)[-1], list_checkpoints(reference)[-1])
    assert [r["step"] for r in read_metrics(run_dir) if "loss" in r] == [
        r["step"] for r in read_metrics(reference) if "loss" in r
    ]


KILL_RUN = [
    "--set",
    "train.progress=false",
    "--set",
    "train.val_batches=1",
    "--set",
    "train.steps=30",
    "--set",
    "train.checkpoint_every=10",
    "--set",
    "train.log_every=2",
    "--set",
    "train.amp=none",  # the killed subprocess does not see the test session's fp32 default for "auto"
]


@pytest.mark.slow
@pytest.mark.parametrize("when", ["before-first-checkpoint", "random"])
def test_kill_9_at_any_point_then_resume_is_exact(when: str, tmp_path: Path) -> None:
    reference = tmp_path / "reference"
    assert cli.main(["train", "--run-dir", str(reference), *KILL_RUN]) == 0
    run_dir = tmp_path / "killed"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    cmd = [sys.executable, "-m", "compressive_transformer.cli", "train", "--run-dir", str(run_dir), *KILL_RUN]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while not (run_dir / "config.toml").exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.005)
        if when == "random":
            time.sleep(random.Random(os.getpid()).uniform(0.0, 1.0))
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert (run_dir / "config.toml").is_file()
    assert cli.main(["train", "--run-dir", str(run_dir), "--resume"]) == 0
    assert same_weights(list_checkpoints(run_dir)[-1], list_checkpoints(reference)[-1])
    assert [r["loss"] for r in read_metrics(run_dir) if "loss" in r] == [
        r["loss"] for r in read_metrics(reference) if "loss" in r
    ]


# ---------------------------------------------------------------------------------------------------------------
# damaged checkpoints: verified on load, one line naming the file, fallback to the newest that verifies


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def flip_bit(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-17] ^= 0x04  # inside the tensor data, past the header
    path.write_bytes(bytes(data))


DAMAGES = {
    "truncated model": ("model.safetensors", truncate),
    "flipped bit in model": ("model.safetensors", flip_bit),
    "deleted memory": ("memory.safetensors", Path.unlink),
    "garbage state": ("state.json", lambda p: p.write_text("{not json")),
    "truncated optimizer": ("optimizer.json", truncate),
    "garbage rng": ("rng.safetensors", lambda p: p.write_bytes(b"\x00" * 40)),
    "flipped bit in memory": ("memory.safetensors", flip_bit),
}


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_resume_falls_back_past_a_damaged_checkpoint(
    damage: str, trained: Path, reference: Path, capsys: pytest.CaptureFixture
) -> None:
    name, hurt = DAMAGES[damage]
    newest = list_checkpoints(trained)[-1]
    hurt(newest / name)
    code, out, err = cli_run(capsys, "train", "--run-dir", str(trained), "--resume")
    assert code == 0, err
    warnings = [line for line in out.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and name in warnings[0] and "falling back" in warnings[0], out
    assert "at step 4" in out
    assert same_weights(list_checkpoints(trained)[-1], list_checkpoints(reference)[-1]), "the redone steps are exact"


@pytest.mark.parametrize("damage", ["truncated model", "flipped bit in model"])
def test_evaluate_and_generate_fall_back_with_a_message(
    damage: str, trained: Path, capsys: pytest.CaptureFixture
) -> None:
    name, hurt = DAMAGES[damage]
    newest = list_checkpoints(trained)[-1]
    hurt(newest / name)
    code, _, err = cli_run(capsys, "evaluate", str(trained))
    assert code == 0, err
    assert err.count("warning:") == 1 and str(newest / name) in err and "falling back" in err
    record = json.loads((trained / "eval_validation.json").read_text())
    assert record["checkpoint"] == str(list_checkpoints(trained)[-2]) and record["bits_per_token"] < 9
    code, out, err = cli_run(capsys, "generate", str(trained), "--prompt", "The ", "--max-tokens", "5", "--seed", "0")
    assert code == 0 and out.startswith("The ") and "falling back" in err
    # a checkpoint asked for by name is not replaced by another
    assert_one_line_error(*cli_run(capsys, "evaluate", str(trained), "--checkpoint", str(newest))[::2], name)


def test_every_checkpoint_damaged_is_one_line(trained: Path, capsys: pytest.CaptureFixture) -> None:
    for ckpt in list_checkpoints(trained):
        truncate(ckpt / "model.safetensors")
    assert_one_line_error(*cli_run(capsys, "evaluate", str(trained))[::2], "model.safetensors", "no older checkpoint")
    code, _, err = cli_run(capsys, "train", "--run-dir", str(trained), "--resume")
    assert_one_line_error(code, err, "model.safetensors", "aside")
    assert len(list_checkpoints(trained)) == 3, "nothing deleted"


def test_checkpoints_carry_a_verified_manifest(reference: Path) -> None:
    ckpt = list_checkpoints(reference)[-1]
    manifest = json.loads((ckpt / MANIFEST).read_text())
    assert set(manifest["files"]) == {
        "model.safetensors",
        "optimizer.safetensors",
        "optimizer.json",
        "memory.safetensors",
        "rng.safetensors",
        "state.json",
        "config.toml",
    }


def test_nan_weights_are_never_a_good_checkpoint(trained: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    model = CompressiveTransformerLM(
        ModelConfig.from_raw(
            dict(vocab_size=16, d_model=8, n_layers=1, n_heads=2, d_ff=8, seg_len=4, mem_len=4, cmem_len=0)
        )
    )
    with torch.no_grad():
        next(model.parameters())[0, 0] = float("nan")
    with pytest.raises(NonFiniteWeights):
        save_checkpoint(tmp_path / "x", 1, model=model, optimizer=None, memory=None, data_state=None, config_toml="")
    assert list_checkpoints(tmp_path / "x") == []
    # a checkpoint that holds a NaN weight (with a manifest that matches it) is refused on load and passed over
    newest = list_checkpoints(trained)[-1]
    tensors = weights(newest)
    first = sorted(tensors)[0]
    tensors[first] = tensors[first].clone().fill_(float("nan"))
    safetensors.torch.save_file(tensors, str(newest / "model.safetensors"))
    write_manifest(newest, {"step": 6})
    with pytest.raises(CheckpointError, match="non-finite"):
        load_weights(newest, build_model(read_run_config(trained).model))
    code, _, err = cli_run(capsys, "evaluate", str(trained))
    assert code == 0 and "non-finite" in err and "falling back" in err


def test_torn_metrics_line_is_tolerated_and_repaired(trained: Path) -> None:
    shutil.rmtree(list_checkpoints(trained)[-1])  # killed between its last log and its last checkpoint
    with (trained / METRICS_FILE).open("a") as f:
        f.write('{"step": 7, "loss": 1.2')  # a writer killed mid-line
    records = read_metrics(trained)
    assert records and all("step" in r for r in records)
    assert cli.main(["train", "--run-dir", str(trained), "--resume"]) == 0
    lines = (trained / METRICS_FILE).read_text().splitlines()
    assert all(json.loads(line) for line in lines), "every line parses after the resumed run appended"
    assert json.loads(lines[-1])["step"] == 6


# ---------------------------------------------------------------------------------------------------------------
# divergence


def test_divergence_without_nan_stops_and_a_lower_lr_resumes(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    run_dir = tmp_path / "run"
    code, _, err = cli_run(
        capsys, "train", "--run-dir", str(run_dir), *FAST, "--set", "train.lr=10", "--set", "train.warmup_steps=0"
    )
    assert_one_line_error(code, err, "the loss became", "ln(vocab)", "train.lr")
    code, out, err = cli_run(capsys, "train", "--run-dir", str(run_dir), "--resume", "--set", "train.lr=1e-3")
    assert code == 0, err
    assert "train.lr = 0.001" in out
    assert read_run_config(run_dir).train.lr == 1e-3, "the run records the new lr for the next resume"
    assert len(list_checkpoints(run_dir)) == 3


def test_divergence_bound_is_configurable() -> None:
    with pytest.raises(ConfigError, match="train.divergence_factor"):
        TrainConfig(divergence_factor=0.5)


# ---------------------------------------------------------------------------------------------------------------
# one process per run


def test_a_second_trainer_on_one_run_is_refused(trained: Path, capsys: pytest.CaptureFixture) -> None:
    before = (trained / METRICS_FILE).read_bytes()
    with RunLock(trained):
        code, _, err = cli_run(capsys, "train", "--run-dir", str(trained), "--resume")
    assert_one_line_error(code, err, "in use by process", str(os.getpid()))
    assert (trained / METRICS_FILE).read_bytes() == before
    assert cli.main(["train", "--run-dir", str(trained), "--resume"]) == 0, "released on exit"


# ---------------------------------------------------------------------------------------------------------------
# read-only runs


def test_evaluating_a_read_only_run_stops_before_computing(
    trained: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    def no_eval(*args, **kwargs):
        raise AssertionError("evaluated although the result could not be written")

    real = tempfile.NamedTemporaryFile

    def read_only(*args, dir=None, **kwargs):  # root ignores file modes, so the refusal is simulated for it
        if dir is not None and Path(dir).is_relative_to(trained):
            raise PermissionError(13, "Read-only file system", str(dir))
        return real(*args, dir=dir, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(run_module, "evaluate", no_eval)
        m.setattr(run_module.tempfile, "NamedTemporaryFile", read_only)
        assert_one_line_error(*cli_run(capsys, "evaluate", str(trained))[::2], "cannot be written", "--out")
    out_file = tmp_path / "elsewhere" / "eval.json"
    with monkeypatch.context() as m:
        m.setattr(run_module.tempfile, "NamedTemporaryFile", read_only)
        code, out, err = cli_run(capsys, "evaluate", str(trained), "--out", str(out_file))
    assert code == 0, err
    assert json.loads(out_file.read_text())["bits_per_token"] > 0 and str(out_file) in out


# ---------------------------------------------------------------------------------------------------------------
# generation settings and sizes


@pytest.mark.parametrize(
    "args,fragment",
    [
        (["--temperature", "nan"], "temperature"),
        (["--temperature", "inf"], "temperature"),
        (["--temperature", "-1"], "temperature"),
        (["--top-p", "1.5"], "top_p"),
        (["--top-p", "0"], "top_p"),
        (["--top-p", "nan"], "top_p"),
        (["--top-k", "-1"], "top_k"),
        (["--temperature", "0", "--top-p", "0.5"], "greedy"),
        (["--max-tokens", "-3"], "max_tokens"),
    ],
)
def test_bad_sampling_settings_are_one_line(
    args: list[str], fragment: str, trained: Path, capsys: pytest.CaptureFixture
) -> None:
    assert_one_line_error(*cli_run(capsys, "generate", str(trained), "--prompt", "x", *args)[::2], fragment)


def test_non_utf8_prompt_bytes_are_replaced(trained: Path, capsys: pytest.CaptureFixture) -> None:
    prompt = b"caf\xe9 ".decode("utf-8", "surrogateescape")  # what a command line gives for Latin-1 bytes
    code, out, err = cli_run(capsys, "generate", str(trained), "--prompt", prompt, "--max-tokens", "3", "--seed", "0")
    assert code == 0, err
    assert out.startswith("caf\ufffd ")
    assert clean_prompt(b"\xff\xfeab") == "\ufffd\ufffdab"
    check_sampling(temperature=0, top_k=0, top_p=1.0, max_tokens=1)


def test_impossible_lengths_are_refused_before_allocation(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    run_dir = tmp_path / "huge"
    code, _, err = cli_run(capsys, "train", "--run-dir", str(run_dir), *FAST, "--set", "model.seg_len=1000000")
    assert_one_line_error(code, err, "model.seg_len", "GiB")
    assert not run_dir.exists(), "no dead run left behind"


def test_impossible_eval_lengths_are_refused(trained: Path, capsys: pytest.CaptureFixture) -> None:
    assert_one_line_error(
        *cli_run(capsys, "evaluate", str(trained), "--set", "eval.seg_len=10000000")[::2], "eval.seg_len", "GiB"
    )


# ---------------------------------------------------------------------------------------------------------------
# Python API inputs


def small(**kw) -> CompressiveTransformerLM:
    cfg = (
        dict(
            vocab_size=16,
            d_model=8,
            n_layers=2,
            n_heads=2,
            d_ff=16,
            seg_len=4,
            mem_len=4,
            cmem_len=2,
            compression_rate=2,
            compression_loss="attention",
            dropout=0.0,
        )
        | kw
    )
    torch.manual_seed(0)
    return CompressiveTransformerLM(ModelConfig.from_raw(cfg))


@pytest.mark.parametrize(
    "inputs,fragment",
    [
        (torch.tensor([[1, 2, 16]]), "in [0, 16)"),
        (torch.tensor([[1, -1, 2]]), "in [0, 16)"),
        (torch.tensor([1, 2, 3]), "inputs[None]"),
        (torch.zeros(1, 2, 3, dtype=torch.long), "shape (B, T)"),
        (torch.zeros(1, 0, dtype=torch.long), "T = 0"),
        (torch.zeros(0, 3, dtype=torch.long), "B = 0"),
        (torch.zeros(1, 3), "integer"),
    ],
)
def test_bad_token_inputs_are_clear_errors(inputs: torch.Tensor, fragment: str) -> None:
    with pytest.raises(ValueError) as e:
        small()(inputs)
    assert fragment in str(e.value)


def test_transposed_or_out_of_range_targets_are_errors() -> None:
    model, x = small(), torch.randint(0, 16, (2, 3))
    with pytest.raises(ValueError, match="transposed"):
        model(x, targets=x.T.contiguous())
    with pytest.raises(ValueError, match="targets"):
        model(x, targets=torch.full((2, 3), 16))
    out = model(x, targets=torch.full((2, 3), -100))  # ignored targets are fine
    assert out.loss is not None


@pytest.mark.parametrize(
    "other,fragment",
    [
        (dict(d_model=16, d_ff=16), "width"),
        (dict(compression_rate=3), "compression_rate"),
        (dict(n_layers=3), "layers"),
    ],
)
def test_a_memory_from_another_model_is_refused(other: dict, fragment: str) -> None:
    foreign = small(**other).init_memory(1)
    with pytest.raises(ValueError, match=fragment):
        small()(torch.zeros(1, 4, dtype=torch.long), memory=foreign)
    with pytest.raises(ValueError, match="compressed memory"):  # Transformer-XL given a compressive model's memory
        small(cmem_len=0)(torch.zeros(1, 4, dtype=torch.long), memory=small().init_memory(1))


def test_a_memory_of_another_dtype_is_refused() -> None:
    model = small()
    memory = model.init_memory(1).to(dtype=torch.float64)
    with pytest.raises(ValueError, match="float64"):
        model(torch.zeros(1, 4, dtype=torch.long), memory=memory)


@pytest.mark.parametrize(
    "field,value", [("d_model", "32"), ("n_layers", 2.0), ("dropout", "0.1"), ("tie_embeddings", 1), ("seg_len", True)]
)
def test_config_field_types_are_checked(field: str, value: object) -> None:
    with pytest.raises(ConfigError, match=f"model.{field}: expected"):
        ModelConfig(**{field: value})
    with pytest.raises(ConfigError, match="train.lr"):
        TrainConfig(lr=float("inf"))


# ---------------------------------------------------------------------------------------------------------------
# downloads


@pytest.mark.parametrize(
    "name", ["../evil.txt", "train/../../x.txt", "/etc/passwd", "train/1.txt/..", "train\\1.txt", "test/ab.txt", ""]
)
def test_download_refuses_file_names_outside_pg19s_layout(name: str) -> None:
    with pytest.raises(DownloadError, match="unexpected file"):
        safe_pg19_name(name)


def test_pg19_listing_with_a_traversal_name_writes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    served = tmp_path / "served" / "deepmind-gutenberg"
    (served / "train").mkdir(parents=True)
    (served / "train" / "1.txt").write_text("a book")
    (served / "metadata.csv").write_text("1,A,1900,x\n")
    listing = {
        "metadata.csv": [("metadata.csv", 11, None)],
        "train/": [("train/1.txt", 6, None), ("../../escaped.txt", 6, None)],
        "validation/": [("validation/2.txt", 6, None)],
        "test/": [("test/3.txt", 6, None)],
    }
    monkeypatch.setattr(download_module, "_list_objects", lambda base, bucket, prefix, limit: listing[prefix])
    with pytest.raises(DownloadError, match="escaped.txt"):
        download_module.download("pg19", tmp_path / "out", base_url=(tmp_path / "served").as_uri(), progress=False)
    assert not (tmp_path / "escaped.txt").exists() and not (tmp_path / "out" / "pg19" / "train").exists()


def test_pg19_pinned_manifest_decides_not_the_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    served = tmp_path / "served" / "deepmind-gutenberg"
    files = {
        "metadata.csv": "1,A,1900,x\n2,B,1900,x\n3,C,1900,x\n",
        "train/1.txt": "one",
        "validation/2.txt": "two",
        "test/3.txt": "three",
    }
    for name, text in files.items():
        (served / name).parent.mkdir(parents=True, exist_ok=True)
        (served / name).write_text(text)
    listing = {"metadata.csv": [("metadata.csv", len(files["metadata.csv"]), None)]}
    for split, name in (("train/", "train/1.txt"), ("validation/", "validation/2.txt"), ("test/", "test/3.txt")):
        listing[split] = [(name, len(files[name]), "0" * 32)]  # the server's md5s are wrong: they are not used
    monkeypatch.setattr(download_module, "_list_objects", lambda base, bucket, prefix, limit: listing[prefix])
    base = (tmp_path / "served").as_uri()
    with pytest.raises(DownloadError, match="md5"):
        download_module.download("pg19", tmp_path / "a", base_url=base, progress=False)
    pinned = tmp_path / "pinned.json"

    pinned.write_text(
        json.dumps(
            {"files": {n: {"size": len(t), "sha256": hashlib.sha256(t.encode()).hexdigest()} for n, t in files.items()}}
        )
    )
    out = download_module.download("pg19", tmp_path / "b", base_url=base, progress=False, manifest=pinned)
    assert (out / "test" / "3.txt").read_text() == "three"
    assert json.loads((out / "manifest.json").read_text())["files"] == json.loads(pinned.read_text())["files"]
    (served / "test" / "3.txt").write_text("THREE")  # the mirror changed a book: the pinned manifest catches it
    with pytest.raises(DownloadError, match="sha256"):
        download_module.download("pg19", tmp_path / "c", base_url=base, progress=False, manifest=pinned)
