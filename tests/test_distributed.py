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

from compressive_transformer.runs.rundir import build_config
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
