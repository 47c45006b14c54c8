"""Long-range tasks streamed through the model: memory carried and reset, loss only at answers, exact distances."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import tiny_model

from compressive_transformer.core.config import ConfigError
from compressive_transformer.experiments.long_range import PRESETS, run_long_range
from compressive_transformer.experiments.tasks import (
    IGNORE_INDEX,
    AssociativeRecallConfig,
    PasskeyConfig,
    SelectiveCopyConfig,
    TaskTrainConfig,
    bin_counts,
    evaluate_task,
    load_task_run_config,
    make_batch,
    one_segment_version,
    stream_task_batch,
    train_task,
)

CONFIGS = Path(__file__).resolve().parents[1] / "configs" / "long_range"


def test_streaming_with_enough_memory_equals_one_window():
    """Segments with memory carried see exactly what one window over the whole sequence sees (no compression and
    n_m >= L), so streaming loses nothing and the answer positions get the same predictions."""
    model = tiny_model(cmem_len=0, mem_len=40)
    task = PasskeyConfig(seq_len=40, distances=(3, 20, 37), n_filler=4, n_keys=4, n_values=4)
    tokens, targets, _ = (torch.from_numpy(a) for a in make_batch(task, 3, 0))
    res = stream_task_batch(model, tokens, targets, seg_len=8)
    with torch.no_grad():
        whole = model(tokens, memory=model.init_memory(3))
    assert torch.equal(res.predictions, whole.logits.argmax(-1))
    nll = torch.nn.functional.cross_entropy(
        whole.logits.flatten(0, 1), targets.flatten(), ignore_index=IGNORE_INDEX, reduction="sum"
    )
    assert res.nll == pytest.approx(float(nll), rel=1e-9) and res.answers == 3


def test_memory_carries_the_answer_across_segments_and_is_reset_between_examples():
    model = tiny_model(cmem_len=0, mem_len=16)
    task = PasskeyConfig(seq_len=24, distances=(12,), n_filler=4, n_keys=4, n_values=4)
    tokens, targets, _ = (torch.from_numpy(a) for a in make_batch(task, 2, 1))
    value_pos = 24 - 1 - 12  # in the second of three segments of 8; the answer is in the third
    changed = tokens.clone()
    changed[0, value_pos] = task.vocab.values[(task.vocab.values.index(int(tokens[0, value_pos])) + 1) % 4]
    a = stream_task_batch(model, tokens, targets, seg_len=8)
    b = stream_task_batch(model, changed, targets, seg_len=8)
    assert a.nll != b.nll  # the answer segment read the value through memory
    # each row streams from its own empty memory: a row alone gives what it gives in a batch
    alone = stream_task_batch(model, tokens[1:], targets[1:], seg_len=8)
    assert torch.equal(alone.predictions[0], a.predictions[1])


def test_loss_and_gradient_come_only_from_answer_positions():
    model = tiny_model(cmem_len=0, mem_len=8)
    model.train()
    task = SelectiveCopyConfig(seq_len=24, n_tokens=3, gap=2, n_filler=4, n_keys=1, n_values=4)
    tokens, targets, _ = (torch.from_numpy(a) for a in make_batch(task, 2, 2))
    res = stream_task_batch(model, tokens, targets, seg_len=8, backward=True)
    grad = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    assert res.answers == 6 and grad
    model.zero_grad()
    other = targets.clone()
    other[:, :-3] = IGNORE_INDEX  # already ignored: nothing changes
    res2 = stream_task_batch(model, tokens, other, seg_len=8, backward=True)
    assert res2.nll == res.nll
    for g, p in zip(grad, (p for p in model.parameters() if p.grad is not None)):
        assert torch.equal(g, p.grad)


@pytest.mark.parametrize(
    "task",
    [
        PasskeyConfig(seq_len=40, distances=(4, 17, 38), n_filler=4, n_keys=4, n_values=4),
        AssociativeRecallConfig(seq_len=40, n_pairs=3, gaps=(0, 20), n_filler=4, n_keys=4, n_values=4),
        SelectiveCopyConfig(seq_len=40, n_tokens=3, gap=10, n_filler=4, n_keys=1, n_values=4),
    ],
    ids=lambda t: t.name,
)
def test_evaluation_counts_every_distance_exactly(task):
    model = tiny_model(vocab_size=task.vocab_size)
    counts = evaluate_task(model, task, per_value=5, seed=3, batch_size=4)
    if isinstance(task, PasskeyConfig):
        assert counts.keys() == {4, 17, 38} and all(n == 5 for _, n in counts.values())
    elif isinstance(task, AssociativeRecallConfig):  # gap + 2 (N - i) + j for i, j in 0..N-1
        want = {g + 2 * (3 - i) + j for g in (0, 20) for i in range(3) for j in range(3)}
        assert set(counts) <= want and sum(n for _, n in counts.values()) == 2 * 5 * 3
    else:
        assert min(counts) > 10 and max(counts) <= 39 and sum(n for _, n in counts.values()) == 4 * 5 * 3
    assert counts == evaluate_task(model, task, per_value=5, seed=3, batch_size=2)  # seeded, batch-independent


def test_bin_counts_pools_answers_per_bin():
    assert bin_counts({3: (1, 2), 5: (1, 1), 9: (0, 4)}, 8) == {4: 2 / 3, 12: 0.0}


@pytest.mark.parametrize("name", ["passkey", "associative_recall", "selective_copy"])
def test_one_segment_version_fits_a_segment(name):
    task = PRESETS["full"].tasks()[name]
    short = one_segment_version(task, 32)
    tokens, targets, distances = make_batch(short, 8, 0)
    assert tokens.shape == (8, 32) and (targets != IGNORE_INDEX).any()
    assert short.vocab_size == task.vocab_size


def test_training_reduces_the_loss_on_an_easy_task():
    torch.manual_seed(0)
    model = tiny_model(vocab_size=12, cmem_len=0).float().train()
    task = PasskeyConfig(seq_len=16, distances=(2,), n_filler=2, n_keys=2, n_values=4)
    history = train_task(model, task, TaskTrainConfig(steps=60, batch_size=16, lr=1e-2, warmup_steps=5))
    first, last = np.mean([h["loss"] for h in history[:5]]), np.mean([h["loss"] for h in history[-5:]])
    assert last < first - 0.3
    assert [h["step"] for h in history] == list(range(1, 61)) and history[-1]["lr"] < history[10]["lr"]


@pytest.mark.slow
def test_quick_preset_writes_results_and_plots(tmp_path):
    torch.set_num_threads(1)
    out = tmp_path / "lr"
    results = run_long_range(
        "quick", out, tasks=("passkey", "selective_copy"), models=("txl", "ct", "ct-mean_pool-none"), log=lambda _: None
    )
    saved = json.loads((out / "results.json").read_text())
    assert saved["preset"] == "quick" and len(saved["runs"]) == 6 == len(results["runs"])
    by = {(e["task"], e["name"]): e for e in saved["runs"]}
    txl, ct = by[("passkey", "txl")], by[("passkey", "ct")]
    assert txl["model"]["attention_cost"] == ct["model"]["attention_cost"]  # equal attention cost
    assert (txl["model"]["max_range"], ct["model"]["max_range"]) == (2 * 16, 2 * (8 + 4 * 8))
    assert set(txl["accuracy"]) == {str(d) for d in PRESETS["quick"].tasks()["passkey"].distances}
    assert all(0.0 <= a <= 1.0 for a in ct["accuracy"].values())
    assert txl["command"].startswith("compressive-transformer task long-range --preset quick")
    generator = txl["provenance"]["data"]["generator"]  # generated data: the generator and its settings
    assert generator["settings"]["task"] == "passkey" and "commit" in txl["provenance"]["code"]
    for png in ("passkey.png", "selective_copy.png", "passkey_ablation.png"):
        assert (out / png).stat().st_size > 0
    assert "ablation" in (out / "results.md").read_text()
    # a later run merges into the same file, replacing only its own (task, model) pairs
    run_long_range("quick", out, tasks=("passkey",), models=("txl",), budget=1, log=lambda _: None)
    again = json.loads((out / "results.json").read_text())
    assert (
        len(again["runs"]) == 6
        and {(e["task"], e["name"]): e for e in again["runs"]}[("passkey", "txl")]["train"]["steps"] == 1
    )


def test_presets_put_distances_on_both_sides_of_the_txl_range():
    p = PRESETS["full"]
    txl, ct = p.model("txl", 52), p.model("ct", 52)
    assert txl.seg_len * (txl.seg_len + txl.memory.mem_len) == ct.seg_len * (
        ct.seg_len + ct.memory.mem_len + ct.memory.cmem_len
    )
    reach_txl = 2 * txl.memory.mem_len + txl.seg_len - 1
    reach_ct = 2 * (ct.memory.mem_len + 4 * ct.memory.cmem_len) + ct.seg_len - 1
    ds = p.tasks()["passkey"].distances
    assert any(d < 2 * txl.memory.mem_len for d in ds) and any(reach_txl < d <= reach_ct for d in ds)


def test_unknown_names_are_one_line_errors(tmp_path):
    with pytest.raises(ConfigError, match="models: unknown 'gru'"):
        run_long_range("quick", tmp_path, models=("gru",))
    with pytest.raises(ConfigError, match="--tasks: unknown"):
        run_long_range("quick", tmp_path, tasks=("sorting",))
    with pytest.raises(ConfigError, match="models: unknown 'ct-conv-none'"):
        run_long_range("quick", tmp_path, models=("ablation", "ct-conv-none"))
    with pytest.raises(ConfigError, match="--preset: unknown"):
        run_long_range("huge", tmp_path)


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("*.toml")), ids=lambda p: p.stem)
def test_shipped_task_configs_load(path):
    run = load_task_run_config(path)
    assert run.model.vocab_size >= run.task.vocab_size
    assert run.model.seg_len * 10 == run.task.seq_len


def test_task_config_overrides_and_errors(tmp_path):
    run = load_task_run_config(
        CONFIGS / "passkey-ct.toml", ["train.steps=300", "model.compression=mean_pool", "model.compression_loss=none"]
    )
    assert run.train.steps == 300 and run.model.compression.function == "mean_pool"
    bad = tmp_path / "bad.toml"
    bad.write_text('[task]\nname = "passkey"\n[training]\nsteps = 3\n')
    with pytest.raises(ConfigError, match="training: unknown section"):
        load_task_run_config(bad)
    with pytest.raises(ConfigError, match="curriculum_steps"):
        load_task_run_config(CONFIGS / "passkey-ct.toml", ["train.steps=5"])
    small = dataclasses.replace(run.model, vocab_size=8)
    with pytest.raises(ConfigError, match="vocab_size"):
        type(run)(small, run.task, run.train)


def test_run_task_from_a_config_file(tmp_path):
    from compressive_transformer.experiments import run_task

    small = [
        "model.d_model=16",
        "model.n_heads=2",
        "model.d_ff=32",
        "model.seg_len=8",
        "model.mem_len=8",
        "model.cmem_len=4",
        "task.seq_len=32",
        "task.distances=[4, 20]",
        "train.steps=2",
        "train.curriculum_steps=1",
        "train.eval_per_value=3",
        "train.batch_size=2",
    ]
    record = run_task(CONFIGS / "passkey-ct.toml", tmp_path, overrides=small, log=lambda _: None)
    saved = json.loads((tmp_path / "result.json").read_text())
    assert saved["accuracy"] == record["accuracy"] and set(saved["accuracy"]) == {"4", "20"}
    assert saved["counts"]["4"][1] == 3 and saved["model"]["max_range"] == 2 * (8 + 4 * 4)
    assert "--set train.steps=2" in saved["command"] and (tmp_path / "accuracy_by_distance.png").is_file()
