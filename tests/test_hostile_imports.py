"""Nothing imported or loaded unchecked: weights, memories and optimizer states that are not finite, configs whose
sizes cannot fit (checked from their arithmetic before anything is allocated), files a run appends to whose last
line was cut, and a decoder step given tokens that cannot be right. Each ends in one line naming the file or the
key (or, for a cut line, a one-line notice and the other records), never a traceback, a hang or a silent NaN."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import safetensors.torch
import torch
from cli_helpers import FAST, assert_one_line_error, cli_capped, cli_run
from conftest import tiny_config
from test_import_transfo_xl import CONFIG, write_checkpoint

from compressive_transformer.core.models import build_model
from compressive_transformer.core.models.decode import Decoder
from compressive_transformer.runs import cputime
from compressive_transformer.runs.budget import check_model_size, parameters_lower_bound
from compressive_transformer.runs.checkpoint import list_checkpoints
from compressive_transformer.runs.integrity import write_manifest
from compressive_transformer.runs.jsonl import append_record, read_records
from compressive_transformer.runs.metrics import METRICS_FILE, MetricsLogger, read_metrics

# ---------------------------------------------------------------------------------------------------------------
# imported weights and sizes


@pytest.mark.parametrize("poison", ["nan", "inf"])
def test_import_refuses_non_finite_weights(poison: str, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """A source whose weights were all NaN, or held one +inf, imported with exit 0; generating printed <unk>s."""
    src = write_checkpoint(tmp_path / "src")
    tensors = safetensors.torch.load_file(str(src / "model.safetensors"))
    name = "transformer.layers.0.pos_ff.CoreNet.0.weight"
    if poison == "nan":
        tensors = {k: torch.full_like(v, float("nan")) for k, v in tensors.items()}
    else:
        tensors[name].view(-1)[3] = float("inf")
    safetensors.torch.save_file(tensors, str(src / "model.safetensors"))
    code, _, err = cli_run(capsys, "import", "transfo-xl", str(src), str(tmp_path / "out"))
    assert_one_line_error(code, err, "transfo-xl weights", "NaN or infinite", "import a good one")
    assert (f"{name} (1 of" in err) if poison == "inf" else "values)" in err, err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "change", [dict(d_model=10**6, d_inner=4 * 10**6, d_embed=10**6), dict(n_layer=10**9)], ids=["wide", "deep"]
)
def test_import_refuses_a_config_too_large_for_memory_before_allocating(change: dict, tmp_path: Path) -> None:
    """d_model 1e6 / d_inner 4e6 ended in a 41-line traceback ("you tried to allocate 4000000000000 bytes");
    n_layer = 10**9 built layers silently until killed. Run in a fresh process under a timeout, as a user would."""
    src = write_checkpoint(tmp_path / "src", CONFIG | change)
    done = cli_capped("import", "transfo-xl", str(src), str(tmp_path / "out"))
    assert_one_line_error(done.returncode, done.stderr, "transfo-xl: ", "parameters", "lower the sizes")
    assert not (tmp_path / "out").exists()


def test_train_refuses_sizes_that_cannot_fit_before_anything_is_written(tmp_path: Path) -> None:
    """`--set model.n_layers=1000000000` built layers until the machine ran out of memory."""
    run = tmp_path / "r"
    done = cli_capped("train", "--set", "model.n_layers=1000000000", "--run-dir", str(run), *FAST)
    assert_one_line_error(done.returncode, done.stderr, "model:", "1000000000 layers", "lower the sizes")
    assert not run.exists()


def test_a_run_whose_config_asks_for_an_absurd_model_is_refused_on_loading(
    finished_run_copy: Path, capsys: pytest.CaptureFixture
) -> None:
    """A config.toml edited (or damaged) to d_model = 10**7 asked torch for terabytes inside build_model."""
    path = finished_run_copy / "config.toml"
    path.write_text(path.read_text().replace("d_model = 32", "d_model = 1000000000"))
    code, _, err = cli_run(capsys, "evaluate", str(finished_run_copy), "--split", "test")
    assert_one_line_error(code, err, "config.toml: model", "lower the sizes")


@pytest.mark.parametrize(
    "keys",
    [
        {},
        dict(cmem_len=0, d_head=4, n_heads=3),
        dict(input_dim=5, vocab_size=0),
        dict(vocab_size=300, cmem_len=0, adaptive={"cutoffs": [20, 100], "div_val": 2}),
        dict(vocab_size=256, mem_len=0, cmem_len=0, n_layers=3, wavenet_dilations=(1, 2, 4)),
        dict(scales=(1, 1), output_layers=1, n_layers=3, cmem_len=0, compression="max_pool", compression_loss="none"),
    ],
    ids=["ct", "txl-d_head", "continuous", "adaptive", "wavenet", "ql"],
)
def test_the_size_check_counts_no_more_parameters_than_the_model_has(keys: dict) -> None:
    """A lower bound: it may only refuse what cannot fit, never a model that would."""
    cfg = tiny_config(**keys)
    assert 0 < parameters_lower_bound(cfg) <= sum(p.numel() for p in build_model(cfg).parameters())
    check_model_size(cfg, device=torch.device("cpu"))  # a small model passes


def test_an_export_with_non_finite_weights_is_refused(finished_run: Path, tmp_path: Path) -> None:
    """from_pretrained loaded NaN weights without a word (a checkpoint's were refused)."""
    from compressive_transformer import export_run, load_run
    from compressive_transformer.core.config import ConfigError

    out = export_run(finished_run, tmp_path / "export")
    weights = out / "model.safetensors"
    tensors = safetensors.torch.load_file(str(weights))
    next(iter(tensors.values())).view(-1)[0] = float("nan")
    safetensors.torch.save_file(tensors, str(weights))
    with pytest.raises(ConfigError, match="non-finite weights") as e:
        load_run(out)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("file", ["memory.safetensors", "optimizer.safetensors"])
def test_a_checkpoint_with_non_finite_memory_or_optimizer_state_is_passed_over(
    file: str, finished_run_copy: Path, capsys: pytest.CaptureFixture
) -> None:
    """A NaN memory or Adam moment (in a checkpoint that verifies) was resumed, and the run went on computing NaNs.
    Now the resume says so in one line and continues from the checkpoint before it, as from a damaged one."""
    newest, before = list_checkpoints(finished_run_copy)[-1], list_checkpoints(finished_run_copy)[-2]
    tensors = safetensors.torch.load_file(str(newest / file))
    name = next(k for k, v in tensors.items() if v.is_floating_point() and v.numel())
    tensors[name].view(-1)[0] = float("inf")
    safetensors.torch.save_file(tensors, str(newest / file))
    write_manifest(newest)  # it verifies: only its numbers are wrong
    code, out, err = cli_run(capsys, "train", "--run-dir", str(finished_run_copy), "--resume", "--set", "train.steps=8")
    assert code == 0, err
    (warning,) = [line for line in out.splitlines() if line.startswith("warning:")]
    assert f"{file} holds non-finite values in {name}" in warning and "falling back" in warning, out
    assert f"resuming {finished_run_copy} at step {int(before.name.split('-')[1])}" in out, out


def test_a_saved_memory_with_non_finite_values_is_refused(
    finished_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    saved = tmp_path / "memory.safetensors"
    code, _, err = cli_run(
        capsys, "generate", str(finished_run), "--prompt", "def ", "--max-tokens", "3", "--save-memory", str(saved)
    )
    assert code == 0, err
    with safetensors.safe_open(str(saved), framework="pt") as f:
        meta, tensors = f.metadata(), {k: f.get_tensor(k) for k in f.keys()}
    tensors["next_logits"][..., 0] = float("nan")
    safetensors.torch.save_file(tensors, str(saved), metadata=meta)
    code, _, err = cli_run(capsys, "generate", str(finished_run), "--load-memory", str(saved), "--max-tokens", "3")
    assert_one_line_error(code, err, "--load-memory", "non-finite", "next_logits")


# ---------------------------------------------------------------------------------------------------------------
# files a run appends to


def test_a_cut_cpu_seconds_line_is_skipped_and_the_next_lap_starts_a_fresh_line(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """Resume appended the next lap onto the cut line, and the file no longer parsed; a study over the run then failed
    every rerun with "'utf-8' codec can't decode ..." without naming the file."""
    path = tmp_path / cputime.FILE
    cputime.record(tmp_path, start=0, end=10, seconds=1.5)
    whole = json.dumps({"from": 10, "to": 20, "seconds": 2.0}).encode()
    path.write_bytes(path.read_bytes() + whole[:-7] + "é".encode()[:1])  # cut mid-record, mid-character
    cputime.record(tmp_path, start=10, end=20, seconds=2.5)  # the resumed call records the lap again
    total = cputime.total(tmp_path)
    assert total == {"seconds": 4.0, "steps": 20, "laps": 2}
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(path) in err and "1 line(s) are not whole records (the first: line 2)" in err, (
        err
    )
    assert path.read_bytes().count(b"\n") == 3  # the cut line kept, the new lap on its own line


def test_laps_that_are_not_numbers_are_skipped(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = tmp_path / cputime.FILE
    lines = [{"from": 0, "to": 5, "seconds": 1.0}, {"from": 5, "to": 9, "seconds": float("nan")}, {"from": "x"}, [1]]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    assert cputime.total(tmp_path) == {"seconds": 1.0, "steps": 5, "laps": 1}
    assert "3 line(s) are not whole records (the first: line 2)" in capsys.readouterr().err


def test_metrics_with_a_cut_last_line_are_read_and_appended_to(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    logger = MetricsLogger(tmp_path, tensorboard=False)
    logger.log({"step": 1, "loss": 2.0})
    path = tmp_path / METRICS_FILE
    path.write_bytes(path.read_bytes() + b'{"step": 2, "lo')
    assert read_metrics(tmp_path) == [{"step": 1, "loss": 2.0}]
    assert "its last line is cut short" in capsys.readouterr().err
    MetricsLogger(tmp_path, tensorboard=False).log({"step": 2, "loss": 1.0})
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2]


def test_appending_to_a_file_whose_last_record_lost_only_its_newline_keeps_it(tmp_path: Path) -> None:
    path = tmp_path / "x.jsonl"
    path.write_text('{"a": 1}\n{"a": 2}')
    append_record(path, {"a": 3})
    assert read_records(path, log=None) == [{"a": 1}, {"a": 2}, {"a": 3}]


# ---------------------------------------------------------------------------------------------------------------
# a decoder step's input


@pytest.fixture(scope="module")
def decoder_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model(tiny_config()).eval()


@pytest.mark.parametrize(
    "tokens,fragment",
    [
        (torch.tensor([1, 2, 3]), "one token id per memory row, shape (2,)"),
        (torch.tensor([[1, 2], [3, 4]]), "one token id per memory row"),
        (torch.tensor([1, 10**6]), "token ids must be in [0, "),
        (torch.tensor([-1, 2]), "token ids must be in [0, "),
        (torch.tensor([1.0, 2.0]), "integer tensor"),
    ],
    ids=["batch", "two-per-row", "too-large", "negative", "float"],
)
def test_a_decoder_step_with_bad_tokens_is_a_one_line_value_error(
    decoder_model: torch.nn.Module, tokens: torch.Tensor, fragment: str
) -> None:
    """A batch that did not match the memory raised "Sizes of tensors must match"; an id >= vocab or < 0 a raw
    IndexError; model(...) gives a one-line ValueError for each."""
    decoder = Decoder(decoder_model, decoder_model.init_memory(2))
    with pytest.raises(ValueError) as e:
        decoder.step(tokens)
    assert fragment in str(e.value) and "\n" not in str(e.value) and str(e.value).startswith("tokens: ")
    assert decoder.step(torch.tensor([1, 2])).shape == (2, decoder_model.cfg.vocab_size)  # nothing was consumed


def test_a_decoder_refuses_a_memory_of_another_model(decoder_model: torch.nn.Module) -> None:
    other = build_model(tiny_config(d_model=8, d_ff=16)).eval()
    with pytest.raises(ValueError, match="^memory: layer 0 mem has width 8"):
        Decoder(decoder_model, other.init_memory(2))


@pytest.mark.parametrize(
    "prompt,fragment",
    [
        ([1.5, 2.0], "whole numbers, got 1.5"),
        (torch.tensor([[1, 2], [3, 4]]), "one prompt of shape (P,) or (1, P)"),
        ("some text", "got text; encode it first"),
        (torch.tensor([0.5]), "integers"),
    ],
    ids=["floats", "a-batch", "text", "float-tensor"],
)
def test_generate_refuses_a_prompt_that_is_not_token_ids(
    decoder_model: torch.nn.Module, prompt: object, fragment: str
) -> None:
    """Floats were truncated to ids without a word; a batch of prompts raised "Boolean value of Tensor with more than
    one value is ambiguous"; text raised torch's "too many dimensions 'str'"."""
    from compressive_transformer import generate

    with pytest.raises(ValueError) as e:
        generate(decoder_model, prompt, max_new_tokens=1)  # type: ignore[arg-type]
    assert fragment in str(e.value) and str(e.value).startswith("prompt: ") and "\n" not in str(e.value)
    assert len(generate(decoder_model, torch.tensor([[1, 2]]), max_new_tokens=2, seed=0).tokens) == 2
