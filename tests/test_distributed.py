"""Data-parallel training over 2 CPU processes (gloo) matches 1 process with the same global batch (a compressor
unused in the first steps included, without DDP's find_unused_parameters), and its checkpoint resumes on a different
number of processes."""

from __future__ import annotations

import faulthandler
import json
import os
import socket
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from compressive_transformer.core.config import ConfigError
from compressive_transformer.runs.presets import TINY_TOML
from compressive_transformer.runs.rundir import build_config, config_from_text
from compressive_transformer.training.workflows import train_run

OVERRIDES = [
    "train.steps=8",
    "train.batch_size=4",
    "train.log_every=1",
    "train.checkpoint_every=3",
    "train.val_every=0",
    "train.val_batches=2",
    "train.progress=false",
    "model.dropout=0.0",
    # a trainable compressor: its parameters get no gradient before the first compression, so DDP (built without
    # find_unused_parameters) only works because every parameter takes part in every step
    "model.compression=conv",
    "model.compression_loss=attention",
    "train.accumulate=[[0, 1], [4, 2]]",
    "train.amp=none",  # the spawned workers do not see the test session's fp32 default for "auto"
]


def losses(run_dir: Path) -> list[float]:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in records if "loss" in r]


def _worker(rank: int, world: int, port: int, run_dir: str, overrides: list[str]) -> None:
    faulthandler.enable()  # a native abort in a worker prints its Python stack
    os.environ.update(
        WORLD_SIZE=str(world), RANK=str(rank), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    torch.set_num_threads(1)
    from compressive_transformer.training.distributed import DistInfo, shutdown

    train_run(build_config(None, overrides), run_dir, max_steps=6, log=lambda s: None)  # stopped after 6 of 8
    shutdown(DistInfo(rank=rank, world_size=world))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_processes_match_one_with_the_same_global_batch(tmp_path):
    two = tmp_path / "two"
    mp.spawn(_worker, args=(2, free_port(), str(two), OVERRIDES), nprocs=2, join=True)
    one = tmp_path / "one"
    train_run(build_config(None, OVERRIDES), one, log=lambda s: None)
    assert len(losses(two)) == 6
    assert losses(two) == pytest.approx(losses(one)[:6], rel=1e-5)
    # the checkpoint holds every stream's memory: one process resumes the two-process run where it stopped
    train_run(None, two, resume=True, log=lambda s: None)
    assert losses(two) == pytest.approx(losses(one), rel=1e-5)


def test_batch_rows_must_split_evenly():
    from compressive_transformer import ConfigError
    from compressive_transformer.training.distributed import DistInfo

    assert DistInfo(rank=1, world_size=2).rows(8) == slice(4, 8)
    with pytest.raises(ConfigError, match="^train.batch_size"):
        DistInfo(rank=0, world_size=3).rows(8)


@pytest.mark.slow
def test_torchrun_without_a_run_dir_trains_one_fresh_run(tmp_path: Path) -> None:
    """Without --run-dir each process would stamp its own runs/<config>-<time>: the command stopped with its error
    twice, then torchrun's ChildFailedError. Now the main process names the run for all of them."""
    import shutil
    import subprocess
    import sys

    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent))
    if torchrun is None:
        pytest.skip("torchrun is not beside this Python")
    sets = [a for o in ("train.steps=2", "train.progress=false", "train.amp=none") for a in ("--set", o)]
    done = subprocess.run(
        [
            torchrun,
            "--nproc_per_node=2",
            f"--master_port={free_port()}",
            "-m",
            "compressive_transformer.cli",
            "train",
            *sets,
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    (run,) = (tmp_path / "runs").iterdir()
    assert run.name.startswith("tiny-") and (run / "checkpoints").is_dir()
    assert done.stdout.count("run directory: ") == 1 and str(run.name) in done.stdout, done.stdout


def _data_worker(rank: int, world: int, port: int, run_dir: str, overrides: list[str], log_dir: str) -> None:
    import logging

    os.environ.update(
        WORLD_SIZE=str(world), RANK=str(rank), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    torch.set_num_threads(1)
    handler = logging.FileHandler(Path(log_dir) / f"rank{rank}.log")
    logging.getLogger("compressive_transformer.data.cache").addHandler(handler)
    logging.getLogger("compressive_transformer.data.cache").setLevel(logging.INFO)
    from compressive_transformer.training.distributed import DistInfo, shutdown

    train_run(build_config(None, overrides), run_dir, log=lambda s: None)
    shutdown(DistInfo(rank=rank, world_size=world))


@pytest.mark.slow
def test_processes_sharing_a_cache_build_the_tokenizer_and_each_split_once(tmp_path: Path) -> None:
    """Every process prepares the data before the processes join; the first to take the cache's lock trains the
    tokenizer and builds each split, the others wait on the lock (no collective to time out) and map its files."""
    books = tmp_path / "books"
    for split, n in (("train", 6), ("validation", 2), ("test", 1)):
        (books / split).mkdir(parents=True)
        for i in range(n):
            (books / split / f"{i}.txt").write_text(" ".join(f"w{(i * 7 + j) % 50}" for j in range(4000)) + "\n")
    overrides = [
        "data.format=pg19",
        f"data.path={books}",
        "data.tokenizer=bpe",
        "data.vocab_size=300",
        f"data.cache_dir={tmp_path / 'cache'}",
        "train.steps=2",
        "train.batch_size=2",
        "train.val_every=0",
        "train.progress=false",
        "train.amp=none",
    ]
    logs = tmp_path / "logs"
    logs.mkdir()
    mp.spawn(_data_worker, args=(2, free_port(), str(tmp_path / "run"), overrides, str(logs)), nprocs=2, join=True)
    lines = "".join(p.read_text() for p in logs.iterdir())
    assert lines.count("cached pg19 train:") == 1 and lines.count("cached pg19 validation:") == 1, lines
    assert len(list((tmp_path / "cache").glob("tokenizer-*"))) == 1
    run_tok = json.loads((tmp_path / "run" / "tokenizer" / "tokenizer.json").read_text())
    (cached,) = (tmp_path / "cache").glob("tokenizer-*/tokenizer.json")
    assert json.loads(cached.read_text()) == run_tok, "the run keeps the tokenizer its cache was built with"


def test_only_the_main_process_says_why_a_run_stopped(tmp_path: Path, monkeypatch, capsys) -> None:
    from compressive_transformer import cli
    from compressive_transformer.training import workflows
    from compressive_transformer.training.distributed import DistInfo, PeerStopped

    follower = DistInfo(rank=1, world_size=2)
    monkeypatch.setattr(workflows, "barrier", lambda info: None)
    with pytest.raises(PeerStopped):  # the main process undid the run it was starting
        workflows._plan_new(None, tmp_path / "gone", follower, log=print)
    cfg = config_from_text(TINY_TOML, ["train.batch_size=3"])
    with pytest.raises(PeerStopped):
        workflows._check_rows(cfg, follower)
    with pytest.raises(ConfigError, match="train.batch_size: 3 streams cannot be split over 2 processes"):
        workflows._check_rows(cfg, DistInfo(rank=0, world_size=2))

    def stopped(args) -> None:
        raise PeerStopped("rank 1: the main process stopped")

    monkeypatch.setattr(cli.COMMANDS["train"], "main", stopped)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert cli.main(["train"]) == 2
    assert capsys.readouterr().err == ""
