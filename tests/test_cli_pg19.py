"""End to end on the real PG-19 sample ($CT_TEST_DATA/pg19-sample, default ../shared/data): the CPU config trains,
evaluates and samples from the CLI, and a run killed after a checkpoint and resumed logs exactly the losses it logged
the first time."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from conftest import TEST_DATA, missing_data_reason

from compressive_transformer import cli
from compressive_transformer.runs.checkpoint import list_checkpoints
from compressive_transformer.runs.metrics import read_metrics

torch.set_num_threads(1)
ROOT = Path(__file__).resolve().parents[1]
PG19 = TEST_DATA / "pg19-sample"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not (PG19 / "train").is_dir(), reason=missing_data_reason(PG19)),
]


def test_pg19_sample_trains_evaluates_samples_and_resumes_exactly(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    run_dir = tmp_path / "pg19"
    common = ["--set", f"data.path={PG19}", "--set", "train.progress=false", "--set", "train.num_threads=1"]
    train = ["train", "--config", str(ROOT / "configs" / "pg19-cpu.toml"), "--run-dir", str(run_dir), *common]
    short = [
        "--set",
        "train.steps=4",
        "--set",
        "train.log_every=1",
        "--set",
        "train.checkpoint_every=2",
        "--set",
        "train.val_batches=2",
    ]
    assert cli.main(train + short) == 0
    first = [r for r in read_metrics(run_dir) if "loss" in r]
    assert [r["step"] for r in first] == [1, 2, 3, 4]

    assert (
        cli.main(
            ["evaluate", str(run_dir), "--split", "test", "--set", "eval.max_batches=3", "--set", "eval.mem_len=128"]
        )
        == 0
    )
    result = json.loads((run_dir / "eval_test.json").read_text())
    assert result["tokens"] > 0 and result["bits_per_token"] > 0 and result["mem_len"] == 128
    capsys.readouterr()
    assert (
        cli.main(
            [
                "generate",
                str(run_dir),
                "--prompt",
                "It was a dark and stormy night",
                "--max-tokens",
                "20",
                "--seed",
                "0",
            ]
        )
        == 0
    )
    assert capsys.readouterr().out.startswith("It was a dark and stormy night")

    # "kill" the run after its step-2 checkpoint: steps 3 and 4 were logged but never checkpointed
    shutil.rmtree(list_checkpoints(run_dir)[-1])
    assert cli.main(train + short + ["--resume"]) == 0
    again = [r for r in read_metrics(run_dir) if "loss" in r]
    strip = lambda rs: [{k: v for k, v in r.items() if k != "tokens_per_s"} for r in rs]  # noqa: E731
    assert strip(again) == strip(first)
