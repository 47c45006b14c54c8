"""Nothing silently ignored: a setting some mode would not read is either followed (a data.path names the files to
train on, whatever the default config's format) or refused in one line, a second result never replaces the first,
and the advice names what the command at hand can do. Each test here passed silently, or advised the wrong thing,
before (the docstrings say what happened)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_helpers import FAST, assert_one_line_error, cli_run

from compressive_transformer.core.config import ConfigError, DataConfig
from compressive_transformer.runs.rundir import build_config
from compressive_transformer.training.schedule import learning_rate, schedule_too_short


def _texts(root: Path, n: int = 4, *, words: str = "the quick brown fox jumps over the lazy dog. ") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        (root / f"doc{i}.txt").write_text(f"{i} " + words * 40, encoding="utf-8")
    return root


def _tokens(stdout: str) -> int:
    line = next(x for x in stdout.splitlines() if "training tokens" in x)
    return int(line.split(" training tokens")[0].rsplit(" ", 1)[1].replace(",", ""))


def test_a_data_path_without_a_config_trains_on_that_path(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """`train --set data.path=my-texts` without --config trained on the built-in pydoc topics (428,092 tokens) and
    recorded format = "pydoc" beside path = "my-texts"."""
    texts = _texts(tmp_path / "my-texts")
    run = tmp_path / "run"
    code, out, err = cli_run(capsys, "train", "--set", f"data.path={texts}", "--run-dir", str(run), *FAST)
    assert code == 0, err
    assert "data.format is not set" in err and "'text'" in err, err  # said, in one line
    saved = (run / "config.toml").read_text()
    assert 'format = "text"' in saved and str(texts) in saved
    size = sum(len(p.read_bytes()) for p in texts.iterdir())
    assert 0 < _tokens(out) < size  # the train split of these files (bytes), not the pydoc topics


def test_a_format_that_reads_no_path_refuses_one(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """A config naming format = "pydoc" and an override naming a path trained on pydoc, ignoring the path."""
    texts = _texts(tmp_path / "my-texts")
    code, _, err = cli_run(
        capsys,
        "train",
        "--config",
        "configs/tiny.toml",
        "--set",
        f"data.path={texts}",
        "--run-dir",
        str(tmp_path / "r"),
    )
    assert_one_line_error(code, err, "data.path", "data.format = 'text'")
    assert not (tmp_path / "r").exists()
    with pytest.raises(ConfigError, match="^data.path: the 'pydoc' format is built in and reads no path"):
        DataConfig(format="pydoc", path=str(texts))
    # the format follows the path in a table that names no format, as the config file says
    assert build_config(None, [f"data.path={texts}", "data.format=text"], log=None).data.format == "text"


@pytest.mark.parametrize(
    "override,fragment",
    [
        ("data.vocab_size=4096", "data.vocab_size"),  # the byte tokenizer has 256 ids whatever it says
        ("data.min_freq=5", "data.min_freq"),  # only the words tokenizer drops rare words
        ("data.sample_rate=8000", "data.sample_rate"),  # text is not resampled
    ],
)
def test_data_settings_the_tokenizer_or_format_would_ignore_are_refused(
    override: str, fragment: str, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """Each trained a byte-level pydoc model exactly as without it."""
    code, _, err = cli_run(capsys, "train", "--set", override, "--run-dir", str(tmp_path / "r"), *FAST)
    assert_one_line_error(code, err, fragment, "remove it")
    assert not (tmp_path / "r").exists()


def test_range_refuses_overrides_it_does_not_read(capsys: pytest.CaptureFixture) -> None:
    """`range --set train.steps=5` printed the range as if nothing was given."""
    assert_one_line_error(*cli_run(capsys, "range", "--set", "train.steps=5")[::2], "train.steps", "[model]")
    code, out, _ = cli_run(capsys, "range", "--set", "model.memory.mem_len=32")
    assert code == 0 and "max temporal range" in out


def test_set_without_an_equals_sign_says_key_equals_value(capsys: pytest.CaptureFixture) -> None:
    """`--set data.path my-texts` printed the top-level usage and "unrecognized arguments: my-texts"."""
    with pytest.raises(SystemExit) as e:
        cli_run(capsys, "train", "--set", "data.path", "my-texts")
    err = capsys.readouterr().err
    assert e.value.code == 2 and "unrecognized arguments" not in err, err
    assert err.strip().splitlines()[-1].endswith("write --set data.path=VALUE as one word (no spaces around '=')")


def test_a_missing_path_of_your_own_text_advises_no_download(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """A wrong data.path for one's own text advised `data download`, which has nothing to download for it."""
    missing = tmp_path / "my-textz"
    argv = ["--config", "configs/text-cpu.toml", "--set", f"data.path={missing}", "--run-dir", str(tmp_path / "r")]
    code, _, err = cli_run(capsys, "train", *argv, *FAST)
    assert_one_line_error(code, err, str(missing), "does not exist", "your text files")
    assert "download" not in err


def test_an_empty_test_split_is_said_when_training_starts(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """A folder whose test split is one empty file trained without a word; only `evaluate --split test` said so."""
    root = tmp_path / "corpus"
    _texts(root / "train", 3)
    _texts(root / "validation", 1)
    (root / "test").mkdir()
    (root / "test" / "empty.txt").write_text("")
    code, out, err = cli_run(capsys, "train", "--set", f"data.path={root}", "--run-dir", str(tmp_path / "r"), *FAST)
    assert code == 0, err
    (line,) = [x for x in out.splitlines() if "test split" in x]
    assert line.startswith("note: the test split has no text") and "empty.txt" in line, out


def test_evaluating_a_split_again_keeps_the_first_result(
    finished_run_copy: Path, capsys: pytest.CaptureFixture
) -> None:
    """A second `evaluate --split test` replaced eval_test.json without a word (--text and --data got -2)."""
    run = finished_run_copy
    code, out, err = cli_run(capsys, "evaluate", str(run), "--split", "test", "--set", "eval.max_batches=1")
    assert code == 0, err
    first = (run / "eval_test.json").read_text()
    code, out, err = cli_run(capsys, "evaluate", str(run), "--split", "test", "--set", "eval.max_batches=2")
    assert code == 0, err
    assert f"wrote {run / 'eval_test-2.json'}" in out
    assert (run / "eval_test.json").read_text() == first  # untouched
    assert json.loads((run / "eval_test-2.json").read_text())["segments"] == 2
    # an --out that exists is refused, in every mode, before anything is computed
    for extra in (["--split", "test"], ["--text", str(run / "config.toml")]):
        code, _, err = cli_run(capsys, "evaluate", str(run), *extra, "--out", str(run / "eval_test.json"))
        assert_one_line_error(code, err, "--out", "exists")
    assert (run / "eval_test.json").read_text() == first


def test_the_demo_never_advises_a_resume_it_does_not_have(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """`demo --run-dir runs/mine` on an existing run advised "pass --resume", which demo does not have."""
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("mine")
    code, _, err = cli_run(capsys, "demo", "--steps", "2", "--run-dir", str(tmp_path / "mine"))
    assert_one_line_error(code, err, "already holds", "choose another --run-dir")
    assert "--resume" not in err and (tmp_path / "mine" / "notes.txt").read_text() == "mine"


def test_generate_refuses_audio_options_on_a_text_run(finished_run: Path, capsys: pytest.CaptureFixture) -> None:
    """--seconds and --prime-seconds were ignored by a text run (only --out and --prime were refused)."""
    code, _, err = cli_run(capsys, "generate", str(finished_run), "--prompt", "a", "--seconds", "5")
    assert_one_line_error(code, err, "--seconds", "this run models text", "--max-tokens")


def test_a_warmup_as_long_as_the_run_is_said_when_training_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """`--set train.steps=6` on a config with a 50-step warmup trained at a rate rising to an eighth of train.lr,
    never reaching it, without a word."""
    texts = _texts(tmp_path / "texts")
    base = ["--config", "configs/text-cpu.toml", "--set", f"data.path={texts}", *FAST]
    code, out, err = cli_run(capsys, "train", *base, "--run-dir", str(tmp_path / "short"))
    assert code == 0, err
    (line,) = [x for x in out.splitlines() if "warmup_steps" in x]
    cfg = build_config("configs/text-cpu.toml", [f"data.path={texts}", "train.steps=6"]).train
    last = learning_rate(cfg, 5)
    assert last < cfg.lr / 8
    assert line.startswith("note: train.warmup_steps = 50 is not below train.steps = 6") and f"{last:.2e}" in line
    assert "--set train.warmup_steps=0" in line
    code, out, err = cli_run(
        capsys, "train", *base, "--set", "train.warmup_steps=2", "--run-dir", str(tmp_path / "peaks")
    )
    assert code == 0, err
    assert "warmup_steps" not in out + err


@pytest.mark.parametrize("warmup, steps", [(0, 1), (5, 6), (6, 6), (7, 6), (100, 3)])
def test_the_note_appears_exactly_when_the_rate_never_reaches_lr(warmup: int, steps: int) -> None:
    cfg = build_config(None, [f"train.warmup_steps={warmup}", f"train.steps={steps}"]).train
    peak = max(learning_rate(cfg, s) for s in range(steps))
    assert (schedule_too_short(cfg) is None) == (peak == cfg.lr)
