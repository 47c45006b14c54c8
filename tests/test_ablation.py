"""The seeded long-range experiment: cells at one budget, resume after a kill, parallel = sequential, the report."""

from __future__ import annotations

import json

import pytest

from compressive_transformer.cli import main
from compressive_transformer.core.config import ConfigError
from compressive_transformer.experiments import ablation
from compressive_transformer.experiments.ablation import Cell, plan_cells, run_seeded
from compressive_transformer.experiments.ablation_report import PAPER_ABLATION, ordering_table, spearman
from compressive_transformer.experiments.long_range import PRESETS

MODELS = ("txl", "ct-conv-attention", "ct-max_pool-none")


def _quiet(_: str) -> None:
    pass


def _accuracies(out):
    return {
        (c.parent.name, c.name): json.loads(c.read_text())["overall_accuracy"] for c in (out / "cells").rglob("*.json")
    }


def test_every_model_trains_for_the_same_budget():
    cells = plan_cells(
        PRESETS["full"], tasks=("passkey",), models=("txl", "ct", "ablation"), seeds=(0, 1, 2), budget=None
    )
    assert len(cells) == 11 * 3 and {run.train.steps for _, run in cells} == {PRESETS["full"].ablation_steps}
    assert len({run.train.curriculum_steps for _, run in cells}) == 1
    cells = plan_cells(PRESETS["full"], tasks=("passkey",), models=("ct-dilated_conv-bptt",), seeds=(4,), budget=40)
    assert cells[0][1].train.steps == 40 and cells[0][1].train.seed == 4
    with pytest.raises(ConfigError, match="--seeds"):
        plan_cells(PRESETS["quick"], tasks=("passkey",), models=("txl",), seeds=(1, 1), budget=None)


def test_tiny_budget_end_to_end_with_intervals_and_the_papers_ordering(tmp_path):
    summary = run_seeded("quick", tmp_path, models=MODELS, seeds=(0, 1), log=_quiet, command="cmd")
    rows = summary["tasks"]["passkey"]
    assert set(rows) == set(MODELS)
    for name, row in rows.items():
        assert row["all"]["n"] == 2 and set(row["all"]["per_seed"]) == {"0", "1"} and row["steps"] == 2
        assert ("vs_baseline" in row) == (name != "ct-conv-attention")
    assert rows["ct-max_pool-none"]["vs_baseline"]["all"]["n"] == 2
    assert json.loads((tmp_path / "seeds.json").read_text()) == summary
    md = (tmp_path / "seeds.md").read_text()
    assert "paper rank" in md and "Spearman" in md and "max_pool × none" in md and "    cmd" in md


@pytest.mark.slow
def test_a_killed_run_resumes_with_its_finished_cells(tmp_path, monkeypatch):
    reference = tmp_path / "ref"
    run_seeded("quick", reference, models=MODELS[:2], seeds=(0, 1), log=_quiet)
    calls = []
    real = ablation.run_one

    def killed_on_the_third_cell(run):
        calls.append(run)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(run)

    monkeypatch.setattr(ablation, "run_one", killed_on_the_third_cell)
    out = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        run_seeded("quick", out, models=MODELS[:2], seeds=(0, 1), log=_quiet)
    assert len(list((out / "cells").rglob("*.json"))) == 2 and not list((out / "cells").rglob("*.tmp*"))
    calls.clear()
    monkeypatch.setattr(ablation, "run_one", lambda run: (calls.append(run), real(run))[1])
    run_seeded("quick", out, models=MODELS[:2], seeds=(0, 1), log=_quiet)
    assert len(calls) == 2  # only the two cells the kill left undone
    assert _accuracies(out) == _accuracies(reference)
    calls.clear()
    run_seeded("quick", out, models=MODELS[:2], seeds=(0, 1), log=_quiet)
    assert calls == []  # everything reused


def test_a_cell_of_another_budget_is_not_reused(tmp_path):
    run_seeded("quick", tmp_path, models=("txl",), seeds=(0,), log=_quiet)
    with pytest.raises(ConfigError, match="another budget"):
        run_seeded("quick", tmp_path, models=("txl",), seeds=(0,), budget=3, log=_quiet)
    assert Cell("passkey", "txl", 0).path(tmp_path).is_file()


@pytest.mark.slow
def test_parallel_cells_equal_sequential_ones(tmp_path):
    run_seeded("quick", tmp_path / "seq", models=("ct-max_pool-none",), seeds=(0, 1), log=_quiet)
    run_seeded("quick", tmp_path / "par", models=("ct-max_pool-none",), seeds=(0, 1), parallel=2, log=_quiet)
    assert _accuracies(tmp_path / "seq") == _accuracies(tmp_path / "par")


def test_cli_seeds_and_parallel(tmp_path, capsys):
    assert (
        main(["task", "long-range", "--preset", "quick", "--models", "txl", "--seeds", "0,1", "--out", str(tmp_path)])
        == 0
    )
    assert (tmp_path / "seeds.md").is_file() and len(list((tmp_path / "cells").rglob("*.json"))) == 2
    assert "--seeds 0,1" in json.loads((tmp_path / "seeds.json").read_text())["command"]
    assert main(["task", "long-range", "--preset", "quick", "--parallel", "2", "--out", str(tmp_path)]) != 0
    assert main(["task", "long-range", "--preset", "quick", "--seeds", "0,x", "--out", str(tmp_path)]) != 0
    err = capsys.readouterr().err
    assert "--parallel: only with --seeds" in err and "--seeds:" in err


def test_ordering_against_the_paper():
    assert spearman([1, 2, 3], [1, 2, 3]) == 1.0 and spearman([1, 2, 3], [3, 2, 1]) == -1.0
    iv = lambda m, h: {"mean": m, "half_width": h, "low": m - h, "high": m + h, "n": 3}  # noqa: E731
    rows = {
        f"ct-{fn}-{loss}": {"compression": fn, "compression_loss": loss, "all": iv(0.1 * (i + 1), 0.01)}
        for i, (fn, loss, _) in enumerate(PAPER_ABLATION)
    }  # the paper's best is our worst
    text = "\n".join(ordering_table(rows))
    assert "over the 7 cells both have: -1.00" in text
    assert text.splitlines()[2].startswith("| 1 | conv × bptt | 0.700 ± 0.010 | yes | 7 | 0.996 |")


def test_the_real_text_ablation_spec_holds_every_cell_at_one_budget():
    from pathlib import Path

    from compressive_transformer.experiments.study import load_study

    spec = Path(__file__).resolve().parents[1] / "benchmarks" / "ablation" / "study.toml"
    study = load_study(spec)
    cells = {
        (c.model.compression.function, c.model.compression.loss)
        for c in study.configs.values()
        if c.model.memory.cmem_len > 0
    }
    assert {(fn, loss) for fn, loss, _ in PAPER_ABLATION} <= cells and len(cells) == 9
    assert len({c.train.steps for c in study.configs.values()}) == 1 and study.settings.seeds == (0, 1, 2)
    txl = study.configs["transformer-xl"].model
    ct = study.configs["conv-attention"].model
    assert txl.memory.mem_len == ct.memory.mem_len + ct.memory.cmem_len  # equal attention cost


def test_study_ordering_ranks_lower_bits_first_and_reads_the_variants_cells():
    from compressive_transformer.experiments.ablation_report import study_ordering

    iv = lambda m: {"mean": m, "half_width": 0.01, "low": m - 0.01, "high": m + 0.01, "n": 3}  # noqa: E731
    results = {
        "title": "t",
        "seeds": [0, 1, 2],
        "variants": {
            "txl": {"compression": "-"},
            "a": {"compression": "conv + attention"},
            "b": {"compression": "max_pool + none"},
            "c": {"compression": "conv + bptt"},
        },
        "metrics": {
            "train/validation": {},
            "train/test": {
                "txl": {"bits_per_token": {"interval": iv(1.0)}},
                "a": {"bits_per_token": {"interval": iv(2.0)}},
                "b": {"bits_per_token": {"interval": iv(1.5)}},
                "c": {"bits_per_token": {"interval": iv(1.505)}},
            },
        },
    }
    rows = [line for line in study_ordering(results).splitlines() if line.startswith("| ")][1:]
    assert [r.split(" | ")[1] for r in rows] == ["max_pool × none", "conv × bptt", "conv × attention"]
    assert [r.split(" | ")[3] for r in rows] == ["no", "yes", "-"]  # 1.5 and 1.505 overlap; 1.505 and 2.0 do not
    assert "`train/test`" in study_ordering(results)
