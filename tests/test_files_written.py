"""Every file the program writes: a result never replaces another (two processes writing one name both keep theirs),
a user's file is never replaced, the target is checked before the work, nothing in a run directory follows a link
out of it, and a saved memory continues only in the weights that wrote it."""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from compressive_transformer import load_run
from compressive_transformer.core.config import ConfigError
from compressive_transformer.core.fileio import (
    append_bytes,
    check_links,
    check_new,
    create_text,
    inside,
    remove,
    write_text_atomic,
)
from compressive_transformer.inference.generate import generate
from compressive_transformer.inference.textgen import load_memory, save_memory
from compressive_transformer.runs import cputime
from compressive_transformer.runs.checkpoint import save_checkpoint
from compressive_transformer.runs.jsonl import append_record
from compressive_transformer.runs.runlock import RunLock

ROOT = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "compressive_transformer.cli"]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}


def _create(args: tuple[str, str]) -> str:
    return str(create_text(Path(args[0]), args[1]))


def test_a_taken_name_gets_the_next_free_one_and_nothing_is_replaced(tmp_path: Path) -> None:
    target = tmp_path / "eval_validation.json"
    assert create_text(target, "a") == target
    assert create_text(target, "b") == tmp_path / "eval_validation-2.json"
    (tmp_path / "eval_validation-3.json").symlink_to(tmp_path / "elsewhere")  # a dangling link holds its name too
    assert create_text(target, "c") == tmp_path / "eval_validation-4.json"
    assert [target.read_text(), (tmp_path / "eval_validation-2.json").read_text()] == ["a", "b"]
    assert not (tmp_path / "elsewhere").exists()
    with pytest.raises(ConfigError, match="exists; give a new file name"):
        create_text(target, "d", what="--out", renumber=False)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # no temporary file left


def test_processes_creating_one_name_at_once_each_keep_their_file(tmp_path: Path) -> None:
    target = tmp_path / "result.json"
    with multiprocessing.get_context("spawn").Pool(4) as pool:
        written = pool.map(_create, [(str(target), f"{i}\n" * 10_000) for i in range(8)])
    assert len(set(written)) == 8
    assert sorted(Path(w).read_text() for w in written) == sorted(f"{i}\n" * 10_000 for i in range(8))


def test_a_new_file_is_checked_before_the_work(tmp_path: Path) -> None:
    (tmp_path / "there.json").write_text("mine")
    (tmp_path / "folder").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "nowhere")
    for name, kind in (("there.json", "a file"), ("folder", "a folder"), ("link", "a link")):
        with pytest.raises(ConfigError, match=f"--json: .*{name} is {kind} that exists; give a new file name"):
            check_new(tmp_path / name, "--json")
    assert check_new(tmp_path / "new.json", "--json") == tmp_path / "new.json"
    assert (tmp_path / "there.json").read_text() == "mine"


def test_a_failed_write_names_the_file_not_a_temporary_one(tmp_path: Path) -> None:
    def full(tmp: Path) -> None:
        raise OSError(28, "No space left on device")

    from compressive_transformer.core.fileio import create_file

    with pytest.raises(ConfigError) as e:
        create_file(tmp_path / "out.json", full, what="--json")
    assert (
        str(e.value)
        == f"--json: {tmp_path / 'out.json'} could not be written (No space left on device); nothing was written"
    )
    assert list(tmp_path.iterdir()) == []


def test_nothing_in_a_run_follows_a_link_out_of_it(tmp_path: Path) -> None:
    run, outside = tmp_path / "run", tmp_path / "theirs"
    run.mkdir()
    outside.mkdir()
    (outside / "notes.jsonl").write_text("keep\n")
    (run / "cpu_seconds.jsonl").symlink_to(outside / "notes.jsonl")
    with pytest.raises(ConfigError, match="leads out of .* replace it with a real file or folder"):
        append_record(run / "cpu_seconds.jsonl", {"from": 0, "to": 1, "seconds": 1.0})
    with pytest.raises(ConfigError, match="cpu_seconds.jsonl: is a link that leads out of"):
        cputime.Clock(run, 0)  # before any training
    with pytest.raises(ConfigError, match="leads out of"):
        cputime.total(run)
    with pytest.raises(ConfigError, match="cpu_seconds.jsonl: is a link that leads out of"):
        check_links(run)
    with pytest.raises(ConfigError, match="leads out of"):
        RunLock(run).acquire()
    assert (outside / "notes.jsonl").read_text() == "keep\n"
    (run / "inner.jsonl").write_text("")
    (run / "cpu_seconds.jsonl").unlink()
    (run / "cpu_seconds.jsonl").symlink_to(run / "inner.jsonl")  # a link that stays inside is fine
    append_bytes(run / "cpu_seconds.jsonl", b"{}\n")
    assert (run / "inner.jsonl").read_text() == "{}\n" and inside(run, run / "cpu_seconds.jsonl") == (
        run / "inner.jsonl"
    ).resolve()
    with RunLock(run):
        pass


def test_pruning_checkpoints_never_deletes_through_a_link(tmp_path: Path) -> None:
    run, outside = tmp_path / "run", tmp_path / "theirs"
    (outside / "step-00000001").mkdir(parents=True)
    (outside / "step-00000001" / "mine.txt").write_text("keep")
    run.mkdir()
    (run / "checkpoints").symlink_to(outside)
    model = torch.nn.Linear(2, 2)
    with pytest.raises(ConfigError, match="checkpoints: is a link that leads out of"):
        save_checkpoint(run, 5, model=model, optimizer=None, memory=None, data_state=None, config_toml="", keep=1)
    assert (outside / "step-00000001" / "mine.txt").read_text() == "keep"
    remove(run / "checkpoints", base=run)  # a link is deleted itself, never what it points to
    assert not (run / "checkpoints").exists() and (outside / "step-00000001" / "mine.txt").is_file()


def test_replacing_a_file_replaces_a_link_not_its_target(tmp_path: Path) -> None:
    (tmp_path / "theirs.toml").write_text("theirs")
    (tmp_path / "config.toml").symlink_to(tmp_path / "theirs.toml")
    write_text_atomic(tmp_path / "config.toml", "ours")
    assert (tmp_path / "theirs.toml").read_text() == "theirs"
    assert (tmp_path / "config.toml").read_text() == "ours" and not (tmp_path / "config.toml").is_symlink()


@pytest.mark.slow
def test_evaluations_started_together_each_keep_their_result(finished_run_copy: Path) -> None:
    run = finished_run_copy
    readme = run.parent / "README.md"
    readme.write_text("the cat sat on the mat. " * 40)
    argvs = [["evaluate", str(run), "--text", str(readme)]] * 2 + [["evaluate", str(run)]] * 3
    procs = [
        subprocess.Popen([*CLI, *a], env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for a in argvs
    ]
    outs = [p.communicate(timeout=600) for p in procs]
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err
    written = [next(line for line in out.splitlines() if line.startswith("wrote "))[6:] for out, _ in outs]
    assert len(set(written)) == 5 and all(Path(w).is_file() for w in written)
    assert sorted(p.name for p in run.glob("eval_text-README*.json")) == [
        "eval_text-README-2.json",
        "eval_text-README.json",
    ]
    assert len(list(run.glob("eval_validation*.json"))) == 3
    for w in written:
        json.loads(Path(w).read_text())


def test_a_saved_memory_continues_only_in_the_weights_that_wrote_it(finished_run: Path, tmp_path: Path) -> None:
    run = load_run(finished_run, device="cpu")
    g = generate(run.model, run.encode("the cat sat"), max_new_tokens=4, return_memory=True)
    path = save_memory(tmp_path / "story.safetensors", run, g.memory, g.next_logits)
    load_memory(path, run)  # the weights that wrote it
    again = save_memory(tmp_path / "story.safetensors", run, g.memory, g.next_logits)
    assert again == tmp_path / "story-2.safetensors"  # a new memory file never replaces one
    other = load_run(finished_run, device="cpu")  # the same config, other weights
    with torch.no_grad():
        next(other.model.parameters()).add_(1e-3)
    with pytest.raises(ConfigError, match="was written by other weights"):
        load_memory(path, other)
    assert save_memory(path, run, g.memory, g.next_logits, replace=True) == path  # continuing one document


@pytest.mark.slow
def test_evaluating_a_run_while_it_trains_loses_nothing(tmp_path: Path) -> None:
    run = tmp_path / "run"
    sets = ["train.progress=false", "train.steps=40", "train.checkpoint_every=2", "train.keep_checkpoints=2"]
    sets += ["train.val_batches=1", "eval.max_batches=2", "train.amp=none"]
    train = [*CLI, "train", "--run-dir", str(run), *[a for s in sets for a in ("--set", s)]]
    trainer = subprocess.Popen(train, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        while not list((run / "checkpoints").glob("step-*")) and time.monotonic() < deadline:
            time.sleep(0.5)
        evaluate = [*CLI, "evaluate", str(run)]
        procs = [
            subprocess.Popen(evaluate, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for _ in range(2)
        ]
        outs = [p.communicate(timeout=600) for p in procs]
    finally:
        train_out, train_err = trainer.communicate(timeout=900)
    assert trainer.returncode == 0, train_err
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err
    written = {next(line for line in out.splitlines() if line.startswith("wrote "))[6:] for out, _ in outs}
    assert len(written) == 2 and {Path(w).name for w in written} == {"eval_validation.json", "eval_validation-2.json"}
    for w in written:
        assert json.loads(Path(w).read_text())["tokens"] > 0


@pytest.mark.slow
def test_two_agent_evaluations_with_one_json_file_keep_both(agent_run: Path, tmp_path: Path) -> None:
    pytest.importorskip("gymnasium")
    out = tmp_path / "eval.json"
    cmd = [*CLI, "rl", "evaluate", str(agent_run), "--episodes", "4", "--no-progress", "--json", str(out)]
    procs = [
        subprocess.Popen(cmd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)
    ]
    outs = [p.communicate(timeout=600) for p in procs]
    # both checked the name before either wrote: each keeps its result under its own name; one that started after
    # the other had written is refused before it plays (the name is taken): either way nothing is lost or replaced
    written = []
    for p, (stdout, err) in zip(procs, outs):
        if p.returncode == 0:
            written.append(stdout.strip().splitlines()[-1].removeprefix("wrote "))
        else:
            assert p.returncode == 2 and "exists; give a new file name" in err and len(err.strip().splitlines()) == 1, (
                err
            )
    assert written and len(set(written)) == len(written) <= 2
    assert set(written) <= {str(out), str(tmp_path / "eval-2.json")} and str(out) in written
    for w in written:
        assert json.loads(Path(w).read_text())["episodes"] == 4


def test_a_run_whose_checkpoint_links_out_of_it_is_refused_when_read(finished_run_copy: Path, tmp_path: Path) -> None:
    import shutil

    step = sorted((finished_run_copy / "checkpoints").glob("step-*"))[-1]
    outside = tmp_path / "elsewhere" / step.name
    shutil.move(step, outside)
    step.symlink_to(outside)
    with pytest.raises(ConfigError, match=f"{step.name}: is a link that leads out of"):
        load_run(finished_run_copy, device="cpu")


def test_a_lock_file_planted_as_a_link_is_never_written_through(tmp_path: Path) -> None:
    run, theirs = tmp_path / "run", tmp_path / "theirs.txt"
    run.mkdir()
    theirs.write_text("keep")
    (run / ".lock").symlink_to(theirs)
    with pytest.raises(ConfigError, match=r"\.lock: is a link"):
        RunLock(run).acquire()
    assert theirs.read_text() == "keep"
    (run / "config.toml").symlink_to(theirs)
    from compressive_transformer.runs.rundir import read_run_tables

    with pytest.raises(ConfigError, match="config.toml: is a link that leads out of"):
        read_run_tables(run)
