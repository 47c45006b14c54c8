"""Agent runs are as safe to run and share as text runs: a lock against a second trainer, divergence stopped in one
line, a range check on every option, an unknown environment in one line, a damaged newest checkpoint passed over,
environments checkpointed as JSON records that replay exactly (MiniGrid's too), and runs of another kind refused."""

from __future__ import annotations

import dataclasses
import math
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from cli_helpers import assert_one_line_error, cli_run
from conftest import AGENT_TINY

pytest.importorskip("gymnasium")
pytest.importorskip("torchrl")

from compressive_transformer.agents.config import CoreConfig, EnvConfig, RLTrainConfig, load_rl_config  # noqa: E402
from compressive_transformer.agents.train import train_agent  # noqa: E402
from compressive_transformer.core.config import ConfigError  # noqa: E402
from compressive_transformer.runs.checkpoint import list_checkpoints  # noqa: E402
from compressive_transformer.runs.metrics import read_metrics  # noqa: E402
from compressive_transformer.runs.runlock import RunLock  # noqa: E402

torch.set_num_threads(1)
NONMATCHING = Path("configs/agents/nonmatching.toml")
SETS = [a for s in AGENT_TINY for a in ("--set", s)]


def cut_at_first_checkpoint(run_dir: Path) -> None:
    """The run as it was when killed after its first checkpoint."""
    for ckpt in list_checkpoints(run_dir)[1:]:
        shutil.rmtree(ckpt)


def test_a_second_trainer_of_the_same_run_stops_in_one_line(
    agent_run_copy: Path, capsys: pytest.CaptureFixture
) -> None:
    cut_at_first_checkpoint(agent_run_copy)
    with RunLock(agent_run_copy):  # the first `rl train --resume`, still running
        code, _, err = cli_run(capsys, "rl", "train", "--run-dir", str(agent_run_copy), "--resume", "--no-progress")
    assert_one_line_error(code, err, "is in use by process")
    assert [r["step"] for r in read_metrics(agent_run_copy)] == [2, 4, 6, 8]  # nothing written twice


@pytest.mark.parametrize("kind", ["transformer", "lstm"])
def test_divergence_stops_in_one_line_and_resumes_with_a_lower_lr(
    kind: str, agent_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """A learning rate of 1e6 made NaN probabilities that torch refused to sample from, in a traceback."""
    run_dir = tmp_path / "run"
    code, _, err = cli_run(
        capsys, "rl", "train", str(NONMATCHING), *SETS, "--set", f'core.kind="{kind}"', "--set",
        "train.env_steps=32", "--run-dir", str(run_dir), "--no-progress",
    )  # fmt: skip
    assert code == 0, err
    ckpt = list_checkpoints(run_dir)[-1]
    lr = "1e6" if kind == "transformer" else "1e30"  # an LSTM's gates saturate: it takes a larger step to diverge
    longer = ["--set", "train.env_steps=400", "--no-progress"]
    code, _, err = cli_run(
        capsys, "rl", "train", "--run-dir", str(run_dir), "--resume", "--set", f"train.lr={lr}", *longer
    )
    assert_one_line_error(code, err, "at update", "training stopped", f"continue from {ckpt} with --resume", "train.lr")
    code, _, err = cli_run(
        capsys, "rl", "train", "--run-dir", str(run_dir), "--resume", "--set", "train.lr=1e-4", *longer
    )
    assert code == 0, err
    assert all(math.isfinite(r["loss"]) for r in read_metrics(run_dir))
    assert load_rl_config(run_dir / "config.toml").train.lr == 1e-4


OUT_OF_RANGE: dict[type, dict[str, list[Any]]] = {
    EnvConfig: {
        "name": ["chess"],
        "n_objects": [1, 0],
        "delay": [-1],
        "show_steps": [0],
        "n_distractors": [0],
        "minigrid_id": ["", "  "],
    },
    CoreConfig: {"kind": ["gru"], "embed_dim": [0], "lstm_hidden": [0]},
    RLTrainConfig: {
        "seed": [-1, 2**32],
        "env_steps": [0],
        "n_envs": [0],
        "unroll": [0],
        "lr": [0.0, -1.0, math.inf, math.nan],
        "optimizer": ["sgd", ""],
        "rmsprop_decay": [-0.1, 1.0, math.nan],
        "rmsprop_eps": [0.0, -0.01, math.nan],
        "rmsprop_momentum": [-0.1, 1.0],
        "lr_schedule": ["cosine"],
        "loss_reduction": ["max"],
        "gamma": [0.0, 1.5],
        "entropy_cost": [-0.1],
        "value_cost": [0.0],
        "grad_clip": [0.0],
        "rho_clip": [0.0, -1.0],
        "c_clip": [0.0, -1.0],
        "log_every": [0],
        "checkpoint_every": [0, 3],  # 3: not a multiple of log_every = 10
        "window": [0],
        "threads": [0],
        "actors": [-1, 3],  # 3: does not divide n_envs = 16
        "actors_lockstep": ["yes"],
    },
}
SECTIONS = {EnvConfig: "env", CoreConfig: "core", RLTrainConfig: "train"}


def test_every_field_of_the_agent_config_has_a_range() -> None:
    for cls, fields in OUT_OF_RANGE.items():
        assert set(fields) == {f.name for f in dataclasses.fields(cls)}, f"{cls.__name__}: a field is not walked"
        for name, values in fields.items():
            for value in values:
                with pytest.raises(ConfigError) as e:
                    cls(**{name: value})
                message = str(e.value)
                assert message.startswith(f"{SECTIONS[cls]}.{name}: ") and "\n" not in message, message


def test_rho_and_c_clip_out_of_range_from_the_command_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    for key in ("train.rho_clip=0", "train.c_clip=-1"):
        code, _, err = cli_run(capsys, "rl", "train", "--set", key, "--run-dir", str(tmp_path / "r"))
        assert_one_line_error(code, err, key.split("=")[0], "must be > 0")
    assert not (tmp_path / "r").exists()


def test_an_unknown_minigrid_environment_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    pytest.importorskip("minigrid")
    sets = ["--set", 'env.name="minigrid"', "--set", 'env.minigrid_id="MiniGrid-Nope-v0"']
    code, _, err = cli_run(capsys, "rl", "train", *sets, "--run-dir", str(tmp_path / "r"))
    assert_one_line_error(code, err, "env.minigrid_id", "MiniGrid-Nope-v0", "MiniGrid-MemoryS7-v0")


def test_a_damaged_newest_checkpoint_falls_back_to_the_previous_one(
    agent_run: Path, agent_run_copy: Path, capsys: pytest.CaptureFixture
) -> None:
    newest = list_checkpoints(agent_run_copy)[-1]
    weights = newest / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])  # truncated on disk
    code, out, err = cli_run(capsys, "rl", "train", "--run-dir", str(agent_run_copy), "--resume", "--no-progress")
    assert code == 0, err
    assert "falling back to an older checkpoint" in out and str(newest) in out
    assert read_metrics(agent_run_copy) == read_metrics(agent_run)
    same = list_checkpoints(agent_run)[-1] / "model.safetensors"
    assert weights.read_bytes() == same.read_bytes(), "continued from step 4 exactly as the uninterrupted run"


def test_minigrid_environments_replay_exactly_on_resume(tmp_path: Path) -> None:
    pytest.importorskip("minigrid")
    cfg = load_rl_config(
        Path("configs/agents/minigrid-memory.toml"),
        [
            *AGENT_TINY[:5],
            "train.env_steps=48",
            "model.mem_len=4",
            "model.cmem_len=4",
            "model.d_model=16",
            "model.d_ff=16",
        ],
    )
    full, cut = tmp_path / "full", tmp_path / "cut"
    train_agent(cfg, full, progress=False)
    shutil.copytree(full, cut)
    cut_at_first_checkpoint(cut)
    train_agent(None, cut, resume=True, progress=False)
    assert read_metrics(cut) == read_metrics(full)
    a, b = (list_checkpoints(d)[-1] / "model.safetensors" for d in (full, cut))
    assert a.read_bytes() == b.read_bytes()


def test_runs_of_the_other_kind_are_refused_in_one_line(
    agent_run: Path, finished_run: Path, capsys: pytest.CaptureFixture
) -> None:
    code, _, err = cli_run(capsys, "evaluate", str(agent_run), "--split", "test")
    assert_one_line_error(code, err, "is an agent run", "rl train --resume")
    code, _, err = cli_run(capsys, "rl", "train", "--run-dir", str(finished_run), "--resume", "--no-progress")
    assert_one_line_error(code, err, "does not hold an agent run")
