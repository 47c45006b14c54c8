"""The agent study runner (benchmarks/agents/run.py): training CPU seconds per run, contrasts decided by exact
permutation tests, the cost table, and a rerun that trains nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torchrl")
pytest.importorskip("gymnasium")

from benchmarks.agents import run as agents_run  # noqa: E402
from compressive_transformer.runs import cputime  # noqa: E402

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "agents" / "nonmatching.toml"
SMALL = '"env.delay=2", "train.n_envs=2", "train.unroll=4", "train.log_every=1", "train.checkpoint_every=2"'


def _spec(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.toml"
    path.write_text(
        f'config = "{CONFIG.as_posix()}"\nseeds = [0, 1, 2]\nenv_steps = 48\nbin_steps = 16\nfinal_fraction = 0.5\n'
        f'[models.lstm]\noverrides = [{SMALL}, "core.kind=\\"lstm\\""]\n'
        f'[models.txl]\noverrides = [{SMALL}, "model.mem_len=6", "model.cmem_len=0"]\n'
        '[[contrasts]]\na = "txl"\nb = "lstm"\n'
        '[[contrasts]]\na = "txl"\nb = "lstm"\nshift = 2.0\n'
    )
    return path


def test_runs_record_cpu_seconds_and_the_report_decides_the_contrasts(tmp_path: Path) -> None:
    spec, out = _spec(tmp_path), tmp_path / "out"
    (out / "cost.json").parent.mkdir(parents=True)
    (out / "cost.json").write_text(json.dumps({"models": {"txl": {"keys_per_query": 7, "acting_flops_per_step": 1e4}}}))
    assert agents_run.main([str(spec), "--out", str(out)]) == 0
    result = json.loads((out / "results.json").read_text())
    for model in ("lstm", "txl"):
        for seed in (0, 1, 2):
            total = cputime.total(out / "runs" / f"{model}-seed{seed}")
            assert total["steps"] == 6 and total["seconds"] > 0, "every update of the run is counted once"
        assert all(v > 0 for v in result["models"][model]["train_cpu_seconds"].values())
    plain, shifted = result["contrasts"]
    assert plain["n"] == [3, 3] and 1 / 20 - 1e-9 <= plain["p_permutation"] <= 1.0
    assert shifted["shift"] == 2.0 and shifted["p_permutation"] == pytest.approx(1 / 20), "a + 2 is above any rate"
    assert shifted["p_sign_flip"] == pytest.approx(1 / 8) and shifted["p_paired_t"] < 0.01
    md = (out / "results.md").read_text()
    assert "| txl | lstm | final_quarter | 2 | 0.050 | yes |" in md
    assert "| txl | 7 | 10,000 | - |" in md and "| lstm | - | - | - |" in md

    before = (out / "runs" / "txl-seed1" / cputime.FILE).read_text()
    agents_run.main([str(spec), "--out", str(out)])  # finished runs are skipped: nothing new is counted
    assert (out / "runs" / "txl-seed1" / cputime.FILE).read_text() == before

    for seed in (0, 1, 2):  # runs from before the record: the pilot's CPU seconds per step x steps, in brackets
        (out / "runs" / f"txl-seed{seed}" / cputime.FILE).unlink()
    cost = {"txl": {"keys_per_query": 7, "cpu_seconds_per_million_steps": 1e6}, "lstm": {"keys_per_query": None}}
    (out / "cost.json").write_text(json.dumps({"models": cost}))
    agents_run.main([str(spec), "--out", str(out), "--report-only"])
    md = (out / "results.md").read_text()
    assert "| txl | 7 | - | - | [48, pilot] |" in md and "| lstm | - | - | - | " in md


def test_a_run_from_before_the_cpu_record_reports_none(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text(json.dumps({"step": 10, "env_steps": 160}) + "\n")
    assert agents_run.train_cpu(run_dir) is None
    cputime.record(run_dir, start=4, end=10, seconds=3.0)  # only part of its updates counted
    assert agents_run.train_cpu(run_dir) is None
    cputime.record(run_dir, start=0, end=4, seconds=1.0)
    assert agents_run.train_cpu(run_dir) == 4.0


def test_an_arm_reused_from_another_study_reads_its_runs_and_trains_nothing(tmp_path: Path, capsys) -> None:
    first = _spec(tmp_path)
    assert agents_run.main([str(first)]) == 0  # the runs land in tmp_path / "tiny"
    done = json.loads((tmp_path / "tiny" / "results.json").read_text())["models"]["txl"]
    before = {s: (tmp_path / "tiny" / "runs" / f"txl-seed{s}" / cputime.FILE).read_text() for s in (0, 1)}
    second = tmp_path / "second.toml"
    second.write_text(
        f'config = "{CONFIG.as_posix()}"\noverrides = ["train.lr=1e-2"]\nseeds = [0, 1]\nenv_steps = 48\n'
        f'bin_steps = 16\nfinal_fraction = 0.5\n[models.txl]\nreuse = "tiny"\n'
        f'[models.txl-fast]\noverrides = [{SMALL}, "model.mem_len=6", "model.cmem_len=0"]\n'
        '[[pooled]]\nname = "fast"\na = ["txl-fast"]\nb = ["txl"]\n'
    )
    assert agents_run.main([str(second)]) == 0
    result = json.loads((tmp_path / "second" / "results.json").read_text())
    reused = result["models"]["txl"]
    assert reused["stability_by_seed"] == {k: v for k, v in done["stability_by_seed"].items() if k in ("0", "1")}
    assert reused["parameters"] == done["parameters"]
    assert not (tmp_path / "second" / "runs" / "txl-seed0").exists(), "nothing of the reused arm is written here"
    assert (tmp_path / "second" / "runs" / "txl-fast-seed0").is_dir()
    assert {s: (tmp_path / "tiny" / "runs" / f"txl-seed{s}" / cputime.FILE).read_text() for s in (0, 1)} == before
    spec = agents_run.resolve_reused(agents_run.load_toml(second), second)
    assert "train.lr=1e-2" not in agents_run.arm_overrides(spec, "txl"), "the other study's overrides, not these"
    assert "train.lr=1e-2" in agents_run.arm_overrides(spec, "txl-fast")
    assert result["pooled"][0]["runs"] == 2
    assert agents_run.main([str(second), "--check-finished"]) == 0
    (tmp_path / "third.toml").write_text(second.read_text().replace("seeds = [0, 1]", "seeds = [0, 1, 2]"))
    written = sorted(tmp_path.rglob("*"))
    assert agents_run.main([str(tmp_path / "third.toml"), "--check-finished"]) == 1, "txl-fast's seed 2 never ran"
    assert sorted(tmp_path.rglob("*")) == written, "checking writes nothing"


@pytest.mark.parametrize(
    "arm, header, message",
    [
        ('reuse = "nowhere"', "seeds = [0]\nenv_steps = 48", "no study"),
        ('reuse = "tiny"\n[models.x]\nreuse = "tiny"', "seeds = [0]\nenv_steps = 48", "has no arm 'x'"),
        ('reuse = "tiny"', "seeds = [0]\nenv_steps = 96", "ran 48 steps on seeds [0, 1, 2]; this spec asks 96"),
        ('reuse = "tiny"', "seeds = [0]\nenv_steps = 48", "is not finished; run the study it belongs to first"),
    ],
)
def test_a_reuse_that_cannot_hold_is_one_line(tmp_path: Path, capsys, arm: str, header: str, message: str) -> None:
    _spec(tmp_path)  # written, never run: its runs are not finished
    spec = tmp_path / "second.toml"
    spec.write_text(
        f'config = "{CONFIG.as_posix()}"\n{header}\nbin_steps = 16\nfinal_fraction = 0.5\n[models.txl]\n{arm}\n'
    )
    with pytest.raises(SystemExit) as e:
        agents_run.main([str(spec)])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and message in err and "\n" not in err


def test_each_run_records_its_provenance_and_a_report_never_rewrites_where_runs_ran(tmp_path: Path) -> None:
    spec, out = tmp_path / "one.toml", tmp_path / "out"
    spec.write_text(
        f'config = "{CONFIG.as_posix()}"\nseeds = [0]\nenv_steps = 48\nbin_steps = 16\nfinal_fraction = 0.5\n'
        f'[models.txl]\noverrides = [{SMALL}, "model.mem_len=6", "model.cmem_len=0"]\n'
    )
    assert agents_run.main([str(spec), "--out", str(out)]) == 0
    run = out / "runs" / "txl-seed0"
    (call,) = agents_run.run_records(run)
    assert call["env_steps"] == [0, 48] and call["data"]["generator"]["env"]["delay"] == 2
    assert set(call["code"]) >= {"commit", "dirty", "why"} and "cpu" in call["machine"]
    record = json.loads((run / agents_run.PROVENANCE).read_text())
    record["calls"][0]["machine"] = {"cpu": "the machine that ran it", "cores": 64}
    record["calls"][0]["code"] = {"commit": "f" * 40, "dirty": True}
    (run / agents_run.PROVENANCE).write_text(json.dumps(record))
    assert agents_run.main([str(spec), "--out", str(out), "--report-only"]) == 0
    result = json.loads((out / "results.json").read_text())
    assert result["machines"] == [{"cpu": "the machine that ran it", "cores": 64}], "the report keeps the runs' machine"
    assert result["report"]["machine"]["cpu"] != "the machine that ran it" and "machine" not in result
    assert "every run made by code fffffff (dirty)" in (out / "results.md").read_text()

    (run / agents_run.PROVENANCE).unlink()  # a run from before the records: the earlier report's machine is kept
    old = json.loads((out / "results.json").read_text())
    old.pop("report")
    old["machine"] = {"cpu": "recorded after the runs", "cores": 2}
    (out / "results.json").write_text(json.dumps(old))
    for _ in range(2):  # and stays through any number of later reports
        assert agents_run.main([str(spec), "--out", str(out), "--report-only"]) == 0
        result = json.loads((out / "results.json").read_text())
        assert result["machine_before_records"] == {"cpu": "recorded after the runs", "cores": 2}
