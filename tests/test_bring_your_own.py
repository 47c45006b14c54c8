"""What a user brings from outside: a pretrained tokenizer.json, a data root elsewhere, a machine of its own size."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from compressive_transformer import load_run
from compressive_transformer.core.config import ConfigError, DataConfig
from compressive_transformer.data.readers import data_root_path, read_split
from compressive_transformer.runs.presets import TINY_TOML
from compressive_transformer.runs.rundir import RESUME_FREE_KEYS, build_config, config_from_text
from compressive_transformer.training.trainer import ThroughputWatch
from compressive_transformer.training.workflows import train_run

torch.set_num_threads(1)
CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def _tokenizer_json(path: Path) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=["[UNK]", "[BOS]"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(["the cat sat on the mat and the dog ran in the park. " * 50], trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="[BOS] $A", special_tokens=[("[BOS]", 1)]
    )  # never added to text
    tok.save(str(path))
    return path


def test_a_pretrained_tokenizer_json_is_used_as_is(tmp_path: Path) -> None:
    from tokenizers import Tokenizer

    file = _tokenizer_json(tmp_path / "tokenizer.json")
    cfg = config_from_text(
        TINY_TOML,
        [
            "data.tokenizer=pretrained",
            f"data.tokenizer_file={file}",
            "train.steps=1",
            "train.progress=false",
            "train.val_batches=1",
        ],
    )
    train_run(cfg, tmp_path / "run", log=lambda s: None)
    run = load_run(tmp_path / "run")
    text = "the cat ran to the park"
    assert run.encode(text) == Tokenizer.from_file(str(file)).encode(text, add_special_tokens=False).ids
    assert (
        run.decode(run.encode(text)) == text
        and run.config.model.vocab_size == Tokenizer.from_file(str(file)).get_vocab_size()
    )
    assert "data.tokenizer_file" in RESUME_FREE_KEYS  # the run keeps its own copy of the tokenizer
    with pytest.raises(ConfigError, match="data.tokenizer_file"):
        DataConfig(tokenizer="pretrained")
    with pytest.raises(ConfigError, match="data.tokenizer_file"):
        DataConfig(tokenizer="bytes", tokenizer_file=str(file))
    with pytest.raises(ConfigError, match="does not exist"):
        config = config_from_text(
            TINY_TOML, ["data.tokenizer=pretrained", f"data.tokenizer_file={tmp_path / 'none.json'}"]
        )
        train_run(config, tmp_path / "run2", log=lambda s: None)


def test_data_paths_under_data_follow_ct_data_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "book.txt").write_text("line one\n" * 200)
    monkeypatch.delenv("CT_DATA_ROOT", raising=False)
    assert data_root_path("data/corpus") == "data/corpus"
    monkeypatch.setenv("CT_DATA_ROOT", str(tmp_path))
    assert data_root_path("data/corpus") == str(tmp_path / "corpus") and data_root_path("/abs/data/x") == "/abs/data/x"
    assert read_split(DataConfig(format="text", path="data/corpus/book.txt"), "test").documents
    with pytest.raises(ConfigError, match="CT_DATA_ROOT"):
        read_split(DataConfig(format="text", path="data/missing"), "test")


def test_ready_configs_read_their_data_from_the_data_root_with_one_thread() -> None:
    for name in ("enwik8-cpu", "pg19-cpu", "wikitext103-cpu", "enwik8", "pg19", "wikitext103"):
        cfg = build_config(CONFIGS / f"{name}.toml")
        assert cfg.data.path.startswith("data/"), name
        if name.endswith("-cpu"):
            assert cfg.train.num_threads == 1, name


def test_thread_counts_that_collapse_throughput_are_named(monkeypatch: pytest.MonkeyPatch) -> None:
    from compressive_transformer.runs import machine

    monkeypatch.setattr(machine, "available_cores", lambda: 2)
    assert "3 CPU threads on 2" in machine.thread_warning(3)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    assert "num_threads is unset" in machine.thread_warning(0)
    assert machine.thread_warning(1) is None and machine.thread_warning(2) is None


def test_training_far_below_its_own_rate_is_reported_once() -> None:
    watch = ThroughputWatch()
    assert [watch.check(x, now=t) for t, x in enumerate((500, 2600, 2500, 2700))] == [None] * 4  # start-up first
    slow = watch.check(200, now=10)
    assert slow is not None and "200 tokens/s, down from 2,700" in slow
    assert watch.check(150, now=20) is None and watch.check(2600, now=30) is None  # one line per slow spell
    assert watch.check(100, now=80) is not None  # a new spell, a minute after the last line


def test_a_rate_that_flickers_is_reported_at_most_once_a_minute_with_the_latest_figure() -> None:
    """A busy machine: the rate drops and recovers every second for 100 s. Two lines at most, each with the rate
    of its moment."""
    watch = ThroughputWatch()
    watch.check(3000, now=0.0)
    watch.check(3000, now=0.5)
    lines = [(t, watch.check(300 + t if t % 2 else 3000, now=float(t))) for t in range(1, 101)]
    said = [(t, line) for t, line in lines if line is not None]
    assert len(said) == 2, said
    (t1, first), (t2, second) = said
    assert t2 - t1 >= 60 and f"{300 + t1:,} tokens/s" in first and f"{300 + t2:,} tokens/s" in second
