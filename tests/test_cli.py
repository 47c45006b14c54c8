"""The ``compressive-transformer`` command: every subcommand, and every user mistake as one line with exit code 2
that leaves existing runs and checkpoints intact."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import safetensors.torch
import torch
from cli_helpers import assert_one_line_error, cli_run

from compressive_transformer import cli
from compressive_transformer.core import install
from compressive_transformer.core.config import tomllib
from compressive_transformer.core.install import program
from compressive_transformer.core.models import CompressiveTransformerLM
from compressive_transformer.runs import cputime
from compressive_transformer.runs.checkpoint import list_checkpoints, load_checkpoint
from compressive_transformer.runs.presets import TINY_TOML
from compressive_transformer.runs.rundir import fresh_run_dir, read_run_config

torch.set_num_threads(1)
CONFIGS = Path(__file__).resolve().parents[1] / "configs"
FAST = [
    "--set",
    "train.progress=false",
    "--set",
    "train.val_batches=2",
    "--set",
    "train.steps=4",
    "--set",
    "train.checkpoint_every=2",
]


def snapshot(run_dir: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(run_dir)): p.read_bytes()
        for p in sorted(run_dir.rglob("*"))
        if p.is_file() and ".cache" not in p.parts
    }


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("cli") / "run"
    assert cli.main(["train", "--run-dir", str(run_dir), *FAST]) == 0
    return run_dir


def test_train_writes_a_complete_run_directory(trained: Path) -> None:
    for name in ("config.toml", "tokenizer", "checkpoints", "metrics.jsonl"):
        assert (trained / name).exists(), name
    assert [p.name for p in list_checkpoints(trained)] == ["step-00000002", "step-00000004"]
    assert read_run_config(trained).model.d_model == 32  # the built-in tiny config
    laps = [json.loads(x) for x in (trained / cputime.FILE).read_text().splitlines()]
    assert [(x["from"], x["to"]) for x in laps] == [(0, 2), (2, 4)], "CPU seconds recorded at each checkpoint"
    assert all(x["seconds"] > 0 for x in laps)


def test_evaluate_and_generate(trained: Path, capsys: pytest.CaptureFixture) -> None:
    code, out, _ = cli_run(capsys, "evaluate", str(trained), "--split", "test", "--set", "eval.mem_len=24")
    assert code == 0 and "bits/char" in out and (trained / "eval_test.json").is_file()
    sample = (
        "generate",
        str(trained),
        "--prompt",
        "def ",
        "--max-tokens",
        "30",
        "--seed",
        "3",
        "--top-k",
        "10",
        "--top-p",
        "0.9",
    )
    code, out, _ = cli_run(capsys, *sample)
    again = cli_run(capsys, *sample)[1]
    assert code == 0 and out.startswith("def ") and out == again
    code, out, _ = cli_run(capsys, "generate", str(trained), "--prompt", "x", "--max-tokens", "5", "--temperature", "0")
    assert code == 0 and out.startswith("x")


def test_resuming_a_finished_run_changes_nothing(trained: Path, capsys: pytest.CaptureFixture) -> None:
    before = snapshot(trained)
    code, out, err = cli_run(capsys, "train", "--run-dir", str(trained), "--resume")
    assert code == 0, err
    assert "nothing to do" in out and "step 4" in out
    assert snapshot(trained) == before


def test_range_prints_temporal_range_and_cost(capsys: pytest.CaptureFixture) -> None:
    code, out, _ = cli_run(capsys, "range", "--config", str(CONFIGS / "enwik8.toml"))
    assert code == 0
    assert f"max temporal range: {24 * (768 + 3 * 1152)} positions" in out
    assert f"attention cost: {768 * (768 + 768 + 1152)}" in out
    code, out, _ = cli_run(capsys, "range", "--set", "model.cmem_len=0")
    assert code == 0 and f"max temporal range: {2 * 16} positions" in out


def test_data_download_calls_the_data_package(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    import compressive_transformer.data as data
    from compressive_transformer.data import DownloadError

    calls = []
    monkeypatch.setattr(
        data, "download", lambda name, directory, **kw: calls.append((name, directory, kw)) or Path(directory) / name
    )
    code, out, _ = cli_run(capsys, "data", "download", "pg19", str(tmp_path))
    assert (
        code == 0
        and calls == [("pg19", tmp_path, {"base_url": None, "limit": None, "manifest": None})]
        and str(tmp_path / "pg19") in out
    )
    code, _, _ = cli_run(
        capsys, "data", "download", "pg19", str(tmp_path), "--limit", "3", "--base-url", "http://mirror.example"
    )
    assert code == 0 and calls[-1] == (
        "pg19",
        tmp_path,
        {"base_url": "http://mirror.example", "limit": 3, "manifest": None},
    )
    code, _, _ = cli_run(capsys, "data", "download", "wikitext-2")
    assert code == 0 and calls[-1] == (
        "wikitext-2",
        Path("data"),
        {"base_url": None, "limit": None, "manifest": None},
    )  # data/: where the configs look

    def failing(name, directory, **kw):
        raise DownloadError("enwik8: checksum mismatch; delete the file and try again")

    monkeypatch.setattr(data, "download", failing)
    assert_one_line_error(*cli_run(capsys, "data", "download", "enwik8", str(tmp_path))[::2], "checksum mismatch")


def test_demo_trains_evaluates_samples_and_never_reuses_a_directory(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    import compressive_transformer.training.demo as run_module

    demo_toml = TINY_TOML.replace("[train]", "[train]\nprogress = false").replace("[eval]", "[eval]\nseg_len = 256")
    monkeypatch.setattr(run_module, "DEMO_TOML", demo_toml)
    monkeypatch.chdir(tmp_path)
    code, out, _ = cli_run(capsys, "demo", "--steps", "3")
    assert code == 0, out
    assert (
        "validation: loss " in out
        and "bits/char" in out
        and "word ppl" not in out
        and "sample:" in out
        and "run directory: runs/demo-" in out
    )
    assert out.count("validation: loss ") == 1, out  # printed once, not logged and printed
    # what the score means: the same text under simple references, uniform first (8 bits per ASCII byte)
    meaning = next(line for line in out.splitlines() if "uniform guess" in line)
    uniform, frequencies, packed = (
        float(re.search(rf"{label} (\d+\.\d+)", meaning).group(1))  # type: ignore[union-attr]
        for label in ("scores", "frequencies", "zlib -9")
    )
    assert 7.9 < uniform <= 8.1 and 3.0 < frequencies < uniform and 1.0 < packed < frequencies, meaning
    # a 3-step model is worse than zlib: the line says why zlib can win (it did so silently); and why a uniform
    # guess over 256 byte values scores over 8 bits per character (a few characters take several bytes)
    assert "zlib scores below the model here because" in meaning, meaning
    assert uniform <= 8.0 or "bytes per character" in meaning, meaning
    assert f"next: {program()} generate runs/demo-" in out
    first = next((tmp_path / "runs").iterdir())
    assert (first / "eval_validation.json").is_file()
    code, _, err = cli_run(capsys, "demo", "--steps", "3", "--run-dir", str(first))
    assert_one_line_error(code, err, "already holds a run", "the demo always trains a new run")
    assert "--resume" not in err, err  # demo has no --resume to offer


def test_fresh_run_dirs_never_collide(tmp_path: Path) -> None:
    a = fresh_run_dir("demo", tmp_path)
    a.mkdir()
    b = fresh_run_dir("demo", tmp_path)
    assert a != b and not b.exists()


# ---------------------------------------------------------------------------------------------------------------
# user mistakes


def test_unknown_key_and_impossible_lengths(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert_one_line_error(
        *cli_run(capsys, "train", "--run-dir", str(tmp_path / "a"), "--set", "train.bogus=1")[::2],
        "train.bogus",
        "unknown key",
    )
    assert_one_line_error(
        *cli_run(capsys, "train", "--run-dir", str(tmp_path / "a"), "--set", "model.n_heads=3")[::2], "model.n_heads"
    )
    assert_one_line_error(
        *cli_run(capsys, "train", "--run-dir", str(tmp_path / "a"), "--set", "model.seg_len=0")[::2], "model.seg_len"
    )
    assert_one_line_error(*cli_run(capsys, "train", "--config", str(tmp_path / "missing.toml"))[::2], "missing.toml")
    assert not (tmp_path / "a").exists()


def test_missing_or_empty_corpus(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    text = ["--set", "data.format=text"]
    code, _, err = cli_run(
        capsys, "train", "--run-dir", str(tmp_path / "a"), *text, "--set", f"data.path={tmp_path / 'nowhere'}"
    )
    assert_one_line_error(code, err, "data.path")
    empty = tmp_path / "empty"
    for split in ("train", "validation", "test"):
        (empty / split).mkdir(parents=True)
        (empty / split / "doc.txt").write_text("")
    code, _, err = cli_run(capsys, "train", "--run-dir", str(tmp_path / "b"), *text, "--set", f"data.path={empty}")
    assert_one_line_error(code, err, "data.path")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_bad_arguments_of_evaluate_generate_and_resume(
    trained: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    assert_one_line_error(*cli_run(capsys, "train", "--resume")[::2], "--run-dir")
    assert_one_line_error(
        *cli_run(capsys, "train", "--resume", "--run-dir", str(tmp_path / "none"))[::2], "not a run directory"
    )
    assert_one_line_error(*cli_run(capsys, "generate", str(trained), "--prompt", "")[::2], "prompt")
    assert_one_line_error(*cli_run(capsys, "generate", str(trained), "--prompt", "a", "--top-p", "1.5")[::2], "top_p")
    assert_one_line_error(*cli_run(capsys, "evaluate", str(tmp_path))[::2], "not a run directory")
    assert_one_line_error(*cli_run(capsys, "evaluate", str(trained), "--set", "model.mem_len=3")[::2], "only eval")


def test_training_into_an_existing_run_is_refused(trained: Path, capsys: pytest.CaptureFixture) -> None:
    before = snapshot(trained)
    assert_one_line_error(
        *cli_run(capsys, "train", "--run-dir", str(trained), *FAST)[::2], "already holds a run", "--resume"
    )
    assert snapshot(trained) == before


def test_resume_with_a_different_config_names_the_key(trained: Path, capsys: pytest.CaptureFixture) -> None:
    before = snapshot(trained)
    code, _, err = cli_run(
        capsys,
        "train",
        "--config",
        str(CONFIGS / "tiny.toml"),
        "--set",
        "model.d_model=48",
        "--run-dir",
        str(trained),
        "--resume",
    )
    assert_one_line_error(code, err, "model.d_model")
    assert_one_line_error(
        *cli_run(capsys, "train", "--run-dir", str(trained), "--resume", "--set", "train.seed=5")[::2], "train.seed"
    )
    assert snapshot(trained) == before


def test_checkpoint_from_another_vocabulary_or_config(
    trained: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    other = tmp_path / "words"
    assert (
        cli.main(
            [
                "train",
                "--run-dir",
                str(other),
                *FAST,
                "--set",
                "train.steps=1",
                "--set",
                "data.tokenizer=words",
                "--set",
                "data.min_freq=5",
            ]
        )
        == 0
    )
    capsys.readouterr()
    foreign = list_checkpoints(trained)[-1]
    assert_one_line_error(
        *cli_run(capsys, "evaluate", str(other), "--checkpoint", str(foreign))[::2], "another shape or vocabulary"
    )
    # a checkpoint of another config smuggled into a run: resuming refuses, naming the key
    shutil.copytree(foreign, other / "checkpoints" / "step-00000009")
    before = snapshot(other)
    assert_one_line_error(
        *cli_run(capsys, "train", "--run-dir", str(other), "--resume")[::2], "step-00000009", "another config"
    )
    assert snapshot(other) == before


def test_resume_follows_a_moved_corpus_but_refuses_a_different_one(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    corpus = tmp_path / "corpus"
    for split, text in {
        "train": "the cat sat on the mat. " * 60,
        "validation": "a dog. " * 30,
        "test": "the end. " * 20,
    }.items():
        (corpus / split).mkdir(parents=True)
        (corpus / split / "doc.txt").write_text(text)
    run_dir = tmp_path / "run"
    assert (
        cli.main(
            ["train", "--run-dir", str(run_dir), *FAST, "--set", "data.format=text", "--set", f"data.path={corpus}"]
        )
        == 0
    )
    shutil.rmtree(list_checkpoints(run_dir)[-1])  # back to the step-2 checkpoint
    moved = tmp_path / "moved"
    corpus.rename(moved)
    capsys.readouterr()
    code, out, err = cli_run(capsys, "train", "--run-dir", str(run_dir), "--resume", "--set", f"data.path={moved}")
    assert code == 0, err
    assert "resuming" in out and list_checkpoints(run_dir)[-1].name == "step-00000004"
    shutil.rmtree(list_checkpoints(run_dir)[-1])
    (moved / "train" / "doc.txt").write_text("something else entirely. " * 10)
    assert_one_line_error(
        *cli_run(capsys, "train", "--run-dir", str(run_dir), "--resume", "--set", f"data.path={moved}")[::2], "data"
    )


def test_failed_checkpoint_write_keeps_the_previous_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    run_dir = tmp_path / "run"
    real_save = safetensors.torch.save_file
    saves = {"n": 0}

    def flaky(tensors, filename, metadata=None):  # the second checkpoint dies halfway through its files
        saves["n"] += 1
        real_save(tensors, filename, metadata)
        if saves["n"] == 6:
            Path(filename).write_bytes(b"\0" * 10)
            raise OSError(28, "No space left on device")

    monkeypatch.setattr(safetensors.torch, "save_file", flaky)
    code, _, err = cli_run(capsys, "train", "--run-dir", str(run_dir), *FAST)
    assert_one_line_error(code, err, "No space left on device")
    monkeypatch.undo()
    ckpts = list_checkpoints(run_dir)
    assert [p.name for p in ckpts] == ["step-00000002"]
    assert not [p for p in (run_dir / "checkpoints").iterdir() if p.name.startswith(".")]
    cfg = read_run_config(run_dir)
    assert load_checkpoint(ckpts[0], model=CompressiveTransformerLM(cfg.model)).step == 2
    code, out, err = cli_run(capsys, "train", "--run-dir", str(run_dir), "--resume")
    assert code == 0, err
    assert "step 4" in out and [p.name for p in list_checkpoints(run_dir)] == ["step-00000002", "step-00000004"]


def test_diverging_loss_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    real_forward = CompressiveTransformerLM.forward
    calls = {"n": 0}

    def diverging(self, *args, **kw):
        out = real_forward(self, *args, **kw)
        calls["n"] += 1
        if calls["n"] > 3 and out.loss is not None:
            out.loss = out.loss * float("inf")
        return out

    monkeypatch.setattr(CompressiveTransformerLM, "forward", diverging)
    code, _, err = cli_run(capsys, "train", "--run-dir", str(tmp_path / "run"), *FAST)
    assert_one_line_error(code, err, "inf", "step 4", "step-00000002")  # steps 1-3 were fine
    assert [p.name for p in list_checkpoints(tmp_path / "run")] == ["step-00000002"]


def test_every_option_has_help() -> None:
    parser = cli.build_parser()
    stack = [parser]
    while stack:
        p = stack.pop()
        for action in p._actions:
            if action.dest != "help":
                assert action.help, (p.prog, action.dest)
            if hasattr(action, "choices") and isinstance(action.choices, dict):
                stack.extend(action.choices.values())


INTERRUPT_AT_TORCH = """
import importlib.abc, os, signal, sys

class CtrlC(importlib.abc.MetaPathFinder):  # the user presses Ctrl-C while `import torch` runs
    def find_spec(self, name, path=None, target=None):
        if name == "torch":
            os.kill(os.getpid(), signal.SIGINT)
        return None

sys.meta_path.insert(0, CtrlC())
signal.signal(signal.SIGINT, signal.default_int_handler)  # a terminal's foreground (a background job ignores SIGINT)
module, _, function = sys.argv[1].partition(":")
sys.argv[1:] = sys.argv[2:]
sys.exit(getattr(__import__(module, fromlist=[function]), function)())
"""


def test_ctrl_c_while_the_command_line_starts_is_one_line(tmp_path: Path) -> None:
    """The console script's first seconds are ``import torch``: Ctrl-C there printed a KeyboardInterrupt traceback
    (or, landing inside numpy's import, an ImportError). The entry point is the one pyproject.toml installs."""
    scripts = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())["project"]["scripts"]
    entry = scripts["compressive-transformer"]
    run_dir = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-c", INTERRUPT_AT_TORCH, entry, "train", "--run-dir", str(run_dir)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 130, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "error: interrupted while starting, before the command began; nothing was done"
    ]
    assert not run_dir.exists()


# ---------------------------------------------------------------------------------------------------------------
# advice that works when pasted


def test_a_finished_run_trains_further_with_more_steps_and_refuses_fewer(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    run_dir = tmp_path / "run"
    assert cli.main(["train", "--run-dir", str(run_dir), *FAST]) == 0
    capsys.readouterr()
    before = snapshot(run_dir)
    assert_one_line_error(
        *cli_run(capsys, "train", "--run-dir", str(run_dir), "--resume", "--set", "train.steps=3")[::2],
        "train.steps=3",
        "already trained 4 steps",
    )
    assert snapshot(run_dir) == before, "a refused extension changes nothing"
    code, out, err = cli_run(capsys, "train", "--run-dir", str(run_dir), "--resume", "--set", "train.steps=6")
    assert code == 0, err
    assert "train.steps = 6 (was 4)" in out and "at step 4 of 6" in out and "run directory:" in out, out
    assert [p.name for p in list_checkpoints(run_dir)][-1] == "step-00000006"
    assert read_run_config(run_dir).train.steps == 6  # the next plain --resume keeps the new length
    code, out, _ = cli_run(capsys, "train", "--run-dir", str(run_dir), "--resume")
    assert code == 0 and "already finished its 6 steps" in out, out


def test_the_program_is_named_as_the_user_can_run_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    venv_bin = tmp_path / ".venv" / "bin"
    venv_bin.mkdir(parents=True)
    for name in ("python", "compressive-transformer"):
        (venv_bin / name).write_text("#!/bin/sh\n")
        (venv_bin / name).chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(venv_bin / "python"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # not activated
    assert program() == ".venv/bin/compressive-transformer"
    monkeypatch.setenv("PATH", f"{venv_bin}:/usr/bin:/bin")  # activated
    assert program() == "compressive-transformer"
    monkeypatch.chdir("/")
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    assert program() == str(venv_bin / "compressive-transformer")


def test_install_hints_name_extras_that_exist_and_setup_refuses_others(monkeypatch: pytest.MonkeyPatch) -> None:
    import subprocess

    root = Path(__file__).resolve().parents[1]
    extras = subprocess.run([sys.executable, str(root / "scripts" / "extras.py")], capture_output=True, text=True)
    assert {"audio", "rl", "lm-eval", "transfo-xl", "tensorboard"} <= set(extras.stdout.strip().split(","))
    monkeypatch.chdir(root)
    assert install.install_hint("audio") == "bash scripts/setup.sh audio"
    if not (Path(sys.prefix) / "pyvenv.cfg").is_file():
        pytest.skip("setup.sh reuses a virtual environment; these tests do not run in one")
    done = subprocess.run(
        ["bash", "scripts/setup.sh", "audio", "no-such-extra"],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "VENV": sys.prefix, "HOME": str(Path.home())},
    )
    assert done.returncode == 2 and "unknown extra 'no-such-extra'" in done.stderr and "audio" in done.stderr


def test_the_readme_says_what_evaluate_prints(finished_run_copy: Path, capsys: pytest.CaptureFixture) -> None:
    """The README said `evaluate` prints bits per character *and byte*; it prints bits per token and per character
    (per byte only where characters take several bytes; every unit in the JSON)."""
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    code, out, err = cli_run(
        capsys, "evaluate", str(finished_run_copy), "--split", "test", "--set", "eval.max_batches=0"
    )
    assert code == 0, err
    printed = out.splitlines()[0]
    record = json.loads((finished_run_copy / "eval_test.json").read_text())
    assert "nats/token" in printed and "bits/token" in printed and "bits/char" in printed
    assert ("bits/byte" in printed) == (record["bytes"] != record["chars"]) and "bits_per_byte" in record
    assert "bits per character and byte of the text" not in readme
    assert "nats per token, bits per token and bits per character (bits per byte too where characters" in readme
    assert "`eval_test-2.json`" in readme and (finished_run_copy / "eval_test.json").is_file()


def test_setup_reads_the_torch_version_without_a_numpy_warning() -> None:
    """The constraint step imported torch before numpy was installed, printing "UserWarning: Failed to initialize
    NumPy" on a successful install. Its command, run where numpy cannot be imported, prints the pin and nothing else."""
    import subprocess

    script = (Path(__file__).resolve().parents[1] / "scripts" / "setup.sh").read_text()
    (snippet,) = re.findall(r'"\$PY" -c "([^"]+)" > "\$CONSTRAINTS"', script)
    blocked = f"import sys; sys.modules['numpy'] = None; exec({snippet!r})"
    done = subprocess.run([sys.executable, "-c", blocked], capture_output=True, text=True)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert re.fullmatch(r"torch==\d+\.\d+\.\d+\n", done.stdout), done.stdout


def test_under_torchrun_only_the_main_process_says_an_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """Every process reads the same config and fails alike before they join: the error was printed once per rank."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    code, _, err = cli_run(capsys, "train", "--set", "train.steps=0")
    assert code == 2 and err == ""
    monkeypatch.setenv("RANK", "0")
    assert_one_line_error(*cli_run(capsys, "train", "--set", "train.steps=0")[::2], "train.steps")
    monkeypatch.setenv("RANK", "1")  # a RANK left in the environment outside torchrun hides nothing
    monkeypatch.delenv("WORLD_SIZE")
    assert_one_line_error(*cli_run(capsys, "train", "--set", "train.steps=0")[::2], "train.steps")


def test_the_importers_advice_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.test_import_transfo_xl import write_checkpoint

    monkeypatch.chdir(tmp_path)  # the advice writes its result beside the user

    src = write_checkpoint(tmp_path / "txl")
    out_dir = tmp_path / "imported"
    code, out, err = cli_run(capsys, "import", "transfo-xl", str(src), str(out_dir), "--seg-len", "8")
    assert code == 0, err
    advice = re.search(r"`\S+ (evaluate [^`]*)`", out)
    assert advice is not None, out
    text = tmp_path / "words.txt"
    text.write_text("w1 w2 w3 w4 w5 w6 w7 w8 w9 w10 w11 w12\n" * 4)
    argv = [text_arg if text_arg != "FILE" else str(text) for text_arg in advice.group(1).split()]
    code, out, err = cli_run(capsys, *argv, "--set", "eval.batch_size=1")
    assert code == 0 and "bits/" in out, err


def test_only_training_promises_untouched_checkpoints_after_a_system_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    def fail(args: object) -> None:
        raise ConnectionError("Couldn't reach 'some/dataset' on the Hub")

    for name in ("evaluate", "train"):
        monkeypatch.setattr(cli.COMMANDS[name], "main", fail)
    code, _, err = cli_run(capsys, "evaluate", "somewhere")
    assert_one_line_error(code, err, "Couldn't reach")
    assert "checkpoints" not in err, err
    code, _, err = cli_run(capsys, "train")
    assert_one_line_error(code, err, "Couldn't reach", "previous checkpoints are untouched")


def test_a_user_module_imported_from_the_command_line_registers_for_the_command(tmp_path: Path) -> None:
    (tmp_path / "my_formats.py").write_text(
        "from compressive_transformer.core.registry import CorpusFormat, register_format\n"
        "register_format(CorpusFormat('lines', lambda cfg, split: [], lambda cfg, split: None))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
    cmd = [sys.executable, "-m", "compressive_transformer.cli"]
    run = lambda *a: subprocess.run([*cmd, *a], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)  # noqa: E731
    assert "lines" in run("--import", "my_formats", "evaluate", "--help").stdout
    assert "lines" not in run("evaluate", "--help").stdout
    bad = run("--import", "no_such_module", "evaluate", "--help")
    assert (
        bad.returncode == 2
        and bad.stderr.count("\n") == 1
        and "--import no_such_module: cannot be imported" in bad.stderr
    )


def test_a_mistyped_option_is_said_by_its_command_with_the_one_meant(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as e:
        cli.main(["train", "--run_dir", "x"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "usage: compressive-transformer train" in err
    assert err.strip().splitlines()[-1].endswith("unrecognized arguments: --run_dir x; did you mean --run-dir?")
    with pytest.raises(SystemExit):
        cli.main(["generate", "RUN", "--max_tokens", "5"])
    assert "did you mean --max-tokens?" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["evaluate", "RUN", "--threads", "0"], "--threads: 0 is out of range; give a whole number from 1 up"),
        (["generate", "RUN", "--seed", str(2**64)], f"--seed: {2**64} is out of range; give a whole number from 0 to"),
        (["generate", "RUN", "--seconds", "0"], "--seconds: 0 is out of range; give a number above 0"),
        (["rl", "evaluate", "RUN", "--episodes", "0"], "--episodes: 0 is out of range; give a whole number from 1 up"),
        (["rl", "evaluate", "RUN", "--seed", "x"], "--seed: 'x' is not a whole number; give one from 0 to 4294967295"),
        (["task", "long-range", "--parallel", "0"], "--parallel: 0 is out of range"),
        (["study", "SPEC", "--threads", "-2"], "--threads: -2 is out of range"),
        (["report", "RUN", "--max-segments", "0"], "--max-segments: 0 is out of range"),
    ],
)
def test_every_number_on_the_command_line_is_checked_with_its_range(
    argv: list[str], message: str, capsys: pytest.CaptureFixture
) -> None:
    code, _, err = cli_run(capsys, *argv)
    assert_one_line_error(code, err, message)
