"""TrainConfig / EvalConfig / RunConfig loading, the learning-rate schedule, and the ready configs in configs/."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from compressive_transformer.core.config import ConfigError, RunConfig, TrainConfig, from_dict, load_run_config
from compressive_transformer.runs.presets import DEMO_TOML, TINY_TOML
from compressive_transformer.runs.rundir import build_config, config_difference, config_from_text
from compressive_transformer.runs.toml_writer import config_text
from compressive_transformer.training.schedule import learning_rate

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def test_accumulation_schedule_grows_at_configured_steps() -> None:
    t = from_dict(TrainConfig, {"accumulate": [[0, 1], [8000, 4]]}, "train")
    assert t.accumulate == ((0, 1), (8000, 4))
    assert [t.accumulation_at(s) for s in (0, 7999, 8000, 10**6)] == [1, 1, 4, 4]


@pytest.mark.parametrize(
    "accumulate, key",
    [
        ([[1, 1]], "train.accumulate"),
        ([[0, 1], [0, 2]], "train.accumulate"),
        ([[0, 0]], "train.accumulate"),
        ([[0]], "train.accumulate"),
    ],
)
def test_bad_accumulation_schedules_name_the_key(accumulate: list, key: str) -> None:
    with pytest.raises(ConfigError, match=key):
        from_dict(TrainConfig, {"accumulate": accumulate}, "train")


def test_warmup_then_cosine_to_the_floor() -> None:
    t = TrainConfig(steps=110, lr=3e-4, lr_start=1e-6, lr_final=1e-6, warmup_steps=10)
    assert learning_rate(t, 0) == pytest.approx(1e-6)
    assert learning_rate(t, 5) == pytest.approx(1e-6 + (3e-4 - 1e-6) / 2)
    assert learning_rate(t, 10) == pytest.approx(3e-4)
    assert learning_rate(t, 60) == pytest.approx(1e-6 + (3e-4 - 1e-6) * 0.5)  # half way down the cosine
    assert learning_rate(t, 110) == pytest.approx(1e-6)
    assert learning_rate(t, 10_000) == pytest.approx(1e-6)  # stays at the floor
    rates = [learning_rate(t, s) for s in range(10, 111)]
    assert all(a >= b for a, b in zip(rates, rates[1:]))


def test_explicit_decay_steps() -> None:
    t = TrainConfig(steps=1000, lr=1.0, lr_start=0.0, lr_final=0.0, warmup_steps=0, decay_steps=100)
    assert learning_rate(t, 50) == pytest.approx(0.5)
    assert learning_rate(t, 100) == pytest.approx(0.0)
    assert learning_rate(t, 500) == pytest.approx(0.0)


def test_unknown_sections_and_keys_are_errors() -> None:
    with pytest.raises(ConfigError, match="^trian: unknown section"):
        load_run_config(None, ["trian.steps=3"])
    with pytest.raises(ConfigError, match="^train.stepz: unknown key"):
        load_run_config(None, ["train.stepz=3"])
    with pytest.raises(ConfigError, match="^eval.mem_len"):
        load_run_config(None, ["eval.mem_len=-1"])
    with pytest.raises(ConfigError, match="^model.seg_len"):
        load_run_config(None, ["model.seg_len=0"])
    with pytest.raises(ConfigError, match="^train.amp"):
        load_run_config(None, ["train.amp=fp8"])


def test_each_section_reaches_its_component_only() -> None:
    cfg = load_run_config(None, ["train.lr=0.01", "eval.mem_len=512", "model.d_model=64", "data.format=pydoc"])
    assert cfg.train.lr == 0.01 and cfg.eval.mem_len == 512 and cfg.model.d_model == 64
    assert not hasattr(cfg.train, "d_model") and not hasattr(cfg.model, "lr")


def test_resolved_config_round_trips_through_toml() -> None:
    cfg = config_from_text(TINY_TOML, ["eval.mem_len=40", "train.betas=[0.8, 0.9]"])
    again = config_from_text(config_text(cfg))
    assert again == cfg
    assert config_difference(cfg, again) is None


def test_config_difference_names_the_key() -> None:
    a = config_from_text(TINY_TOML)
    b = config_from_text(TINY_TOML, ["model.d_model=48"])
    assert config_difference(a, b).startswith("model.d_model: 32")
    assert config_difference(a, config_from_text(TINY_TOML, ["train.log_every=1"]), ignore=("train.log_every",)) is None


def test_builtin_presets_match_the_files_in_configs() -> None:
    assert TINY_TOML == (CONFIGS / "tiny.toml").read_text() and DEMO_TOML == (CONFIGS / "pydoc-cpu.toml").read_text()
    assert build_config(CONFIGS / "tiny.toml") == config_from_text(TINY_TOML)
    assert build_config(CONFIGS / "pydoc-cpu.toml") == config_from_text(DEMO_TOML)
    assert build_config(None) == config_from_text(TINY_TOML)


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("*.toml")), ids=lambda p: p.name)
def test_every_ready_config_validates(path: Path) -> None:
    cfg = build_config(path)
    assert isinstance(cfg, RunConfig)
    assert cfg.train.steps > 0 and cfg.model.seg_len > 0


def test_paper_shapes() -> None:
    enwik8 = build_config(CONFIGS / "enwik8.toml").model
    assert (
        enwik8.n_layers,
        enwik8.d_model,
        enwik8.seg_len,
        enwik8.memory.mem_len,
        enwik8.memory.cmem_len,
        enwik8.compression.rate,
    ) == (24, 1024, 768, 768, 1152, 3)
    wt = build_config(CONFIGS / "wikitext103.toml").model
    assert (wt.n_layers, wt.d_model, wt.memory.mem_len, wt.memory.cmem_len, wt.compression.rate) == (
        18,
        1024,
        500,
        1500,
        4,
    )
    pg = build_config(CONFIGS / "pg19.toml")
    assert (
        pg.model.n_layers,
        pg.model.d_model,
        pg.model.seg_len,
        pg.model.memory.mem_len,
        pg.model.memory.cmem_len,
        pg.model.compression.rate,
    ) == (36, 1024, 512, 512, 512, 2)
    assert pg.data.vocab_size == 32000
    for name in ("enwik8", "wikitext103", "pg19"):
        t = build_config(CONFIGS / f"{name}.toml").train
        assert t.grad_clip == 0.1 and t.lr == 3e-4 and t.lr_start == 1e-6 and t.accumulate[-1][1] == 4
        assert math.isclose(t.lr_final, 1e-6)


def test_a_train_split_that_is_not_text_is_noted_before_training(tmp_path: Path) -> None:
    from compressive_transformer.runs.setup import plan_new_run

    binary = tmp_path / "binary.bin"
    binary.write_bytes(b"\n".join(bytes(range(256)) for _ in range(400)))
    text = tmp_path / "story.txt"
    text.write_text("the cat sat on the mat.\n" * 2000)
    for path, noted in ((binary, True), (text, False)):
        lines: list[str] = []
        cfg = config_from_text(TINY_TOML, ["data.format=text", f"data.path={path}", "data.tokenizer=bytes"])
        plan_new_run(cfg, tmp_path / f"run-{path.stem}", world_size=1, log=lines.append)
        notes = [line for line in lines if "is not text" in line]
        assert len(notes) == int(noted), lines
        if noted:
            assert notes[0].startswith(f"note: data.path {binary}: the train split is not text ({binary}: a NUL at")


def test_a_batch_too_large_for_memory_is_blamed_on_the_batch_size(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from compressive_transformer.runs import budget

    cfg = config_from_text(TINY_TOML, []).model
    lengths = dict(seg_len=cfg.seg_len, mem_len=cfg.memory.mem_len, cmem_len=cfg.memory.cmem_len)
    row = budget.forward_bytes(cfg, batch_size=1, **lengths)
    monkeypatch.setattr(budget, "device_memory_bytes", lambda device: 10 * row)
    with pytest.raises(
        ConfigError, match=r"^train.batch_size: a batch of 100000 .* lower train.batch_size \(about 10 rows"
    ):
        budget.check_fits(cfg, batch_size=100000, device=torch.device("cpu"), **lengths)
    with pytest.raises(ConfigError, match=r"^eval.batch_size: "):
        budget.check_fits(cfg, batch_size=100000, device=torch.device("cpu"), key="eval.seg_len", **lengths)
    monkeypatch.setattr(budget, "device_memory_bytes", lambda device: row // 2)
    with pytest.raises(ConfigError, match=r"^model.seg_len: "):
        budget.check_fits(cfg, batch_size=4, device=torch.device("cpu"), **lengths)
