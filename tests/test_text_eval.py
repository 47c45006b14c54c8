"""Scoring a user's own text: equal to the split evaluation of the same text, honest units from the text's own
counts, results that never replace one another, overrides that would be ignored refused, runs moved between devices."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from compressive_transformer import cli, evaluate_text, load_run
from compressive_transformer.core.config import ConfigError
from compressive_transformer.inference.workflows import evaluate_run
from compressive_transformer.runs.presets import TINY_TOML
from compressive_transformer.runs.rundir import config_from_text
from compressive_transformer.training.workflows import train_run

torch.set_num_threads(1)
DOCS = {
    "train": [
        "the cat sat on the mat. " * 30,
        "a dog ran in the park and sat down. " * 20,
        "héllo wörld, naïve café. " * 10,
    ],
    "validation": ["the cat ran to the dög. " * 8, "short one", "mat and park and cat, " * 9],
    "test": ["the end. " * 10],
}


def _corpus(root: Path) -> Path:
    for split, docs in DOCS.items():
        (root / split).mkdir(parents=True)
        for i, doc in enumerate(docs):
            (root / split / f"{i}.txt").write_text(doc, encoding="utf-8")
    return root


def _train(root: Path, tokenizer: str, extra: tuple[str, ...] = ()) -> Path:
    corpus = _corpus(root / "corpus")
    overrides = [
        "data.format=text",
        f"data.path={corpus}",
        f"data.tokenizer={tokenizer}",
        "train.steps=2",
        "train.progress=false",
        "train.val_batches=1",
        *extra,
    ]
    cfg = config_from_text(TINY_TOML, overrides)
    train_run(cfg, root / "run", log=lambda s: None)
    return root / "run"


@pytest.fixture(scope="module")
def byte_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _train(tmp_path_factory.mktemp("bytes"), "bytes")


@pytest.fixture(scope="module")
def bpe_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _train(tmp_path_factory.mktemp("bpe"), "bpe", ("data.vocab_size=300", "model.vocab_size=300"))


def _validation_files(run_dir: Path) -> list[Path]:
    return sorted((run_dir.parent / "corpus" / "validation").glob("*.txt"))


@pytest.mark.parametrize("which", ["byte_run", "bpe_run"])
def test_evaluate_text_equals_the_split_evaluation_of_the_same_text(which: str, request: pytest.FixtureRequest) -> None:
    run_dir = request.getfixturevalue(which)
    split = evaluate_run(run_dir, split="validation", progress=False)
    own = evaluate_text(load_run(run_dir), _validation_files(run_dir))
    assert own.tokens == split.tokens and own.segments == split.segments
    assert own.loss == pytest.approx(split.loss, rel=1e-6)
    text = "".join(DOCS["validation"])
    assert (own.chars, own.bytes) == (split.chars, split.bytes) == (len(text), len(text.encode("utf-8")))
    assert own.bits_per_char == pytest.approx(split.bits_per_char, rel=1e-6)


def test_units_on_byte_and_bpe_runs_come_from_the_texts_character_count(
    byte_run: Path, bpe_run: Path, tmp_path: Path
) -> None:
    text = "naïve café, the cat sat. " * 40  # 25 characters, 27 bytes per repeat
    path = tmp_path / "mine.txt"
    path.write_text(text, encoding="utf-8")
    for run_dir, kind in ((byte_run, "bytes"), (bpe_run, "bpe")):
        run = load_run(run_dir)
        r = evaluate_text(run, path)
        assert (r.chars, r.bytes, r.words) == (1000, 1080, 200) and r.tokenizer == kind
        total_nll = r.loss * r.tokens
        assert r.bits_per_token == pytest.approx(r.loss / math.log(2))
        assert r.bits_per_char == pytest.approx(total_nll / 1000 / math.log(2))
        assert r.bits_per_byte == pytest.approx(total_nll / 1080 / math.log(2))
        if kind == "bytes":
            assert r.tokens == 1080 - 1 and r.word_ppl is None
        else:
            assert r.tokens < 1000 and r.bits_per_char < r.bits_per_token  # several characters per subword
            assert r.word_ppl == pytest.approx(math.exp(total_nll / 200))
    assert evaluate_text(load_run(byte_run), text).loss == pytest.approx(
        evaluate_text(load_run(byte_run), path).loss
    )  # a str is the text


def run_cli(capsys: pytest.CaptureFixture, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def one_line_error(code: int, err: str, fragment: str) -> None:
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: ") and fragment in lines[0], err


def test_cli_text_results_never_overwrite_and_record_their_source(
    byte_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    split_json = byte_run / "eval_validation.json"
    evaluate_run(byte_run, split="validation", progress=False)
    before = split_json.read_bytes()
    path = tmp_path / "validation.txt"  # a name that must not land on eval_validation.json
    path.write_text("the cat sat. " * 20)
    code, out, _ = run_cli(capsys, "evaluate", str(byte_run), "--text", str(path), "--set", "eval.mem_len=24")
    assert code == 0 and "bits/char" in out
    first = json.loads((byte_run / "eval_text-validation.json").read_text())
    code, _, _ = run_cli(capsys, "evaluate", str(byte_run), "--text", str(path))
    second = json.loads((byte_run / "eval_text-validation-2.json").read_text())
    assert split_json.read_bytes() == before
    assert first["mem_len"] == 24 and second["mem_len"] == 16 and first["cmem_len"] == second["cmem_len"] == 8
    assert first["seg_len"] == 16 and first["step"] == 2 and first["checkpoint"].endswith("step-00000002")
    assert first["source"] == {"kind": "files", "files": [{"path": str(path.resolve()), "bytes": 260}]}
    assert first["bytes"] == 260 and first["device"] == "cpu"

    code, _, _ = run_cli(
        capsys,
        "evaluate",
        str(byte_run),
        "--data",
        str(byte_run.parent / "corpus"),
        "--format",
        "text",
        "--split",
        "test",
    )
    data = json.loads((byte_run / "eval_data-text-corpus-test.json").read_text())
    assert code == 0 and data["source"]["split"] == "test" and data["chars"] == len(DOCS["test"][0])


def test_cli_refuses_what_it_would_ignore_in_one_line(
    byte_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    path = tmp_path / "a.txt"
    path.write_text("some text to score\n")
    one_line_error(*run_cli(capsys, "evaluate", str(byte_run), "--text", str(path), "--split", "test")[::2], "--split")
    one_line_error(
        *run_cli(capsys, "evaluate", str(byte_run), "--text", str(path), "--set", "data.path=x")[::2], "has no effect"
    )
    one_line_error(
        *run_cli(capsys, "evaluate", str(byte_run), "--text", str(path), "--set", "eval.split=test")[::2],
        "has no effect",
    )
    one_line_error(*run_cli(capsys, "evaluate", str(byte_run), "--data", str(tmp_path))[::2], "--format")
    one_line_error(
        *run_cli(capsys, "evaluate", str(byte_run), "--text", str(tmp_path / "missing.txt"))[::2], "missing.txt"
    )
    one_line_error(*run_cli(capsys, "evaluate", str(byte_run), "--format", "text")[::2], "--data")


def test_a_pydoc_run_refuses_a_data_path_it_would_not_read(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    run_dir = tmp_path / "run"
    train_run(
        config_from_text(TINY_TOML, ["train.steps=1", "train.progress=false", "train.val_batches=1"]),
        run_dir,
        log=lambda s: None,
    )
    one_line_error(*run_cli(capsys, "evaluate", str(run_dir), "--set", f"data.path={tmp_path}")[::2], "--text")


def test_a_cuda_trained_run_evaluates_on_cpu(byte_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    import shutil

    moved = tmp_path / "moved"
    shutil.copytree(byte_run, moved, ignore=shutil.ignore_patterns("eval_*"))
    config = moved / "config.toml"
    config.write_text(config.read_text().replace('device = "cpu"', 'device = "cuda"'))  # as a GPU machine wrote it
    reference = evaluate_run(byte_run, split="test", progress=False)
    code, _, _ = run_cli(capsys, "evaluate", str(moved), "--split", "test", "--device", "cpu", "--threads", "1")
    assert code == 0 and json.loads((moved / "eval_test.json").read_text())["loss"] == pytest.approx(
        reference.loss, rel=1e-6
    )
    assert load_run(moved).device.type == ("cuda" if torch.cuda.is_available() else "cpu")  # default auto
    if not torch.cuda.is_available():
        one_line_error(*run_cli(capsys, "evaluate", str(moved), "--device", "cuda")[::2], "--device")
    one_line_error(*run_cli(capsys, "evaluate", str(moved), "--threads", "0")[::2], "--threads")


def test_latin1_text_is_scored_by_a_byte_run_and_a_subword_run_asks_for_utf8(
    byte_run: Path, bpe_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """A BPE run refused Latin-1 text advising `tokenizer = 'bytes'` under a `data.tokenizer:` prefix, which means
    nothing to a trained run; the docs said Latin-1 text is scored."""
    latin = tmp_path / "latin.txt"
    latin.write_bytes("café déjà vu, naïve façade. ".encode("latin-1") * 20)
    code, out, err = run_cli(capsys, "evaluate", str(byte_run), "--text", str(latin))
    assert code == 0 and "bits/char" in out, err
    code, _, err = run_cli(capsys, "evaluate", str(bpe_run), "--text", str(latin))
    for fragment in (str(latin), "not UTF-8 text", "iconv -f latin1 -t utf-8", "byte-level run"):
        one_line_error(code, err, fragment)
    assert "data.tokenizer" not in err and "tokenizer = 'bytes'" not in err
    docs = (Path(__file__).resolve().parents[1] / "docs" / "evaluation.md").read_text()
    assert "a word or subword tokenizer reads UTF-8 only" in docs


def test_text_with_nothing_to_predict_is_refused_not_scored_zero(byte_run: Path, tmp_path: Path, capsys) -> None:
    run = load_run(byte_run)
    with pytest.raises(ConfigError, match="holds no token to predict"):
        evaluate_text(run, "a")
    one = tmp_path / "onechar.txt"
    one.write_text("a")
    code = cli.main(["evaluate", str(byte_run), "--text", str(one)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "holds no token to predict" in err, err
    assert not list(byte_run.glob("eval_text-onechar*.json"))


def test_a_string_naming_a_file_is_scored_as_text_with_a_note(byte_run: Path, tmp_path: Path) -> None:
    path = tmp_path / "story.txt"
    path.write_text("the cat sat on the mat. " * 10)
    run = load_run(byte_run)
    with pytest.warns(UserWarning, match=r"scoring the string .* itself, which names a file; pass Path"):
        as_text = evaluate_text(run, str(path))
    assert as_text.chars == len(str(path))
    assert evaluate_text(run, path).chars == len(path.read_text())
