"""The study runner: spec checks, the aggregate's arithmetic, resume after a kill at any point, parallel runs."""

from __future__ import annotations

import json
import math
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

from compressive_transformer.core.config import ConfigError
from compressive_transformer.experiments import study as study_module
from compressive_transformer.experiments.study import load_study, study_jobs
from compressive_transformer.experiments.study_report import aggregate, load_results
from compressive_transformer.experiments.study_run import run_study
from compressive_transformer.runs.checkpoint import latest_checkpoint
from compressive_transformer.training.workflows import train_run

SPEC = """
[study]
title = "tiny study"
seeds = [{seeds}]
baseline = "txl"
lookback_edges = [8, 24]
attention_segments = 2

[base.model]
d_model = 16
n_layers = 2
n_heads = 2
d_ff = 32
seg_len = 8
compression_rate = 2
dropout = 0.1

[base.data]
format = "text"
path = "{data}"

[base.train]
amp = "none"  # the killed study runs in a subprocess, where "auto" would pick bf16 on a CPU that has it
steps = 6
batch_size = 2
warmup_steps = 2
log_every = 2
val_every = 3
val_batches = 2
checkpoint_every = 2
progress = false

[base.eval]
batch_size = 2

[variants.txl.model]
mem_len = 16
cmem_len = 0

[variants.txl.evaluations.long]
mem_len = 32

[variants.ct.model]
mem_len = 8
cmem_len = 4
compression = "conv"
compression_loss = "attention"

[variants.ct.evaluations.long]
cmem_len = 12
"""


def make_corpus(root: Path) -> Path:
    """Generated books of a small vocabulary, so words recur at every distance."""
    rng = random.Random(0)
    vocab = ["the", "Holmes", "said", "Watson,", "night", "door", "letter", "--", "Baker", "street."]
    for split, n_docs, n_words in (("train", 3, 300), ("validation", 2, 120), ("test", 2, 100)):
        (root / split).mkdir(parents=True)
        for i in range(n_docs):
            (root / split / f"{i}.txt").write_text(" ".join(rng.choice(vocab) for _ in range(n_words)) + "\n")
    return root


@pytest.fixture
def spec(tmp_path: Path) -> Path:
    data = make_corpus(tmp_path / "data")
    path = tmp_path / "study.toml"
    path.write_text(SPEC.format(seeds="0, 1", data=data))
    return path


def stable(result: object) -> object:
    """A result without what legitimately differs between two identical runs (timings, paths, machine, the tree's
    state)."""
    if isinstance(result, dict):
        return {
            k: stable(v)
            for k, v in result.items()
            if k
            not in (
                "seconds",
                "cpu_seconds",
                "tokens_per_s",
                "machine",
                "provenance",
                "checkpoint",
                "final_train_loss_seconds",
            )
        }
    if isinstance(result, list):
        return [stable(v) for v in result]
    return result


def results_of(out: Path) -> dict[str, object]:
    return {
        str(p.relative_to(out)): stable(json.loads(p.read_text())) for p in sorted((out / "results").rglob("*.json"))
    }


def quiet(_: str) -> None:
    pass


# ---------------------------------------------------------------------------------------------------------------
# spec


def test_spec_errors_name_the_key(tmp_path: Path, spec: Path) -> None:
    text = spec.read_text()
    bad = tmp_path / "bad.toml"
    cases = [
        (text.replace('baseline = "txl"', 'baseline = "nope"'), "study.baseline: no variant named 'nope'"),
        (text.replace("[variants.ct.evaluations.long]\ncmem_len = 12\n", ""), "variants.ct: has no evaluations.long"),
        (
            text.replace("[variants.txl.evaluations.long]", "[variants.txl.evaluations.train]"),
            "'train' is the training lengths",
        ),
        (
            text.replace("mem_len = 32", "cmem_len = 32"),
            "variants.txl.evaluations.long.cmem_len: txl has no compressed memory",
        ),
        (text.replace('title = "tiny study"', 'title = "x"\nsplits = ["dev"]'), "study.splits"),
        (text.replace('title = "tiny study"', 'title = "x"\nwhat = 1'), "study.what: unknown key"),
        (text.replace("lookback_edges = [8, 24]", "lookback_edges = [24, 8]"), "study.lookback_edges"),
        (text.replace("seeds = [0, 1]", "seeds = [1, 1]"), "study.seeds"),
        (text + "\n[variants.ct.evaluations.long2]\nseg_len = 0\n", "seg_len: must be > 0"),
        (text + "\n[extra]\nx = 1\n", "unknown table \\[extra\\]"),
    ]
    for body, message in cases:
        bad.write_text(body)
        with pytest.raises(ConfigError, match=message):
            load_study(bad)


def test_lengths_and_default_edges(spec: Path) -> None:
    study = load_study(spec)
    assert study.evaluation_names == ["train", "long"]
    assert study.lengths("txl", "long") == (8, 32, 0)
    assert study.lengths("ct", "train") == (8, 8, 4)
    assert study.lengths("ct", "long") == (8, 8, 12)
    assert study.lookback_edges() == [8, 24]
    no_edges = load_study(spec, []).__class__  # the same spec with derived edges:
    spec.write_text(spec.read_text().replace("lookback_edges = [8, 24]\n", ""))
    assert load_study(spec).lookback_edges() == [8, 16], "ct's n_m, txl's n_m = ct's n_m + c n_cm"
    assert no_edges is type(study)


# ---------------------------------------------------------------------------------------------------------------
# aggregate arithmetic on made-up results


def fake_result(job, bpc: float, bucket_bits: float) -> dict:
    names = ["first occurrence", "in segment", "1-8", "9-24", ">24"]
    record = lambda: {  # noqa: E731
        "seg_len": 8,
        "mem_len": 16,
        "cmem_len": 0,
        "bits_per_char": bpc,
        "bits_per_byte": bpc,
        "bits_per_token": 2 * bpc,
        "word_ppl": 2**bpc,
        "lookback": {"buckets": {n: {"bits_per_token": bucket_bits, "tokens": 10} for n in names}},
        "frequency": {"<100": {"ppl": 2**bpc, "words": 5}, "all": {"ppl": 2**bpc, "words": 5}},
    }
    return {
        "identity": job.identity(),
        "variant": job.variant,
        "seed": job.seed,
        "parameters": {"total": 100, "compressor": 0},
        "train_tokens": 96,
        "curve": {"step": [2, 4], "loss": [3.0, 2.0], "val_step": [3], "val_loss": [2.5]},
        "evaluations": {ev: {split: record() for split in job.splits} for ev in job.evaluations},
        "attention": None,
        "machine": {"cpu": "test"},
    }


def test_aggregate_intervals_and_paired_deltas_by_hand(tmp_path: Path, spec: Path) -> None:
    spec.write_text(spec.read_text().replace("seeds = [0, 1]", "seeds = [0, 1, 2]"))
    study = load_study(spec)
    out = tmp_path / "out"
    txl = {0: 1.50, 1: 1.40, 2: 1.45}
    ct = {0: 1.44, 1: 1.41, 2: 1.40}
    for job in study_jobs(study, out, threads=1, progress=False):
        values = txl if job.variant == "txl" else ct
        path = job.result_path
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(fake_result(job, values[job.seed], 10 * values[job.seed])))
    summary = aggregate(study, load_results(study, out))
    assert summary["runs_done"] == summary["runs_total"] == 6
    entry = summary["metrics"]["train/test"]["ct"]["bits_per_char"]
    assert entry["interval"]["mean"] == pytest.approx(statistics.mean(ct.values()))
    sd = statistics.stdev(ct.values())
    assert entry["interval"]["half_width"] == pytest.approx(4.302653 * sd / math.sqrt(3), rel=1e-5)
    diffs = [ct[s] - txl[s] for s in (0, 1, 2)]
    vs = entry["vs_baseline"]
    assert vs["per_seed"] == pytest.approx({str(s): d for s, d in zip((0, 1, 2), diffs)})
    assert vs["interval"]["mean"] == pytest.approx(statistics.mean(diffs))
    assert vs["interval"]["half_width"] == pytest.approx(4.302653 * statistics.stdev(diffs) / math.sqrt(3), rel=1e-5)
    assert vs["lower_in"] == 2, "seed 1 is worse for ct"
    assert "vs_baseline" not in summary["metrics"]["train/test"]["txl"]["bits_per_char"]
    bucket = summary["lookback"]["long/validation"]["ct"]["1-8"]
    assert bucket["vs_baseline"]["interval"]["mean"] == pytest.approx(10 * statistics.mean(diffs))
    gain = summary["frequency"]["train/test"]["ct"]["all"]["relative_gain"]
    assert gain["mean"] == pytest.approx(statistics.mean(1 - 2 ** ct[s] / 2 ** txl[s] for s in (0, 1, 2)))
    # a result made with other settings is not counted
    job = study_jobs(study, out, threads=1, progress=False)[0]
    stale = json.loads(job.result_path.read_text())
    stale["identity"]["measure"]["splits"] = ["test"]
    job.result_path.write_text(json.dumps(stale))
    assert aggregate(study, load_results(study, out))["runs_done"] == 5


def test_a_result_matches_the_precision_that_ran_not_the_configured_name(tmp_path: Path, spec: Path) -> None:
    """amp = "auto" trains in bf16 on a CPU with bf16 instructions and in fp32 elsewhere: a stored result counts for
    a job only where both resolve to the same precision, and a key added to the config since the result was
    written (at its default) does not invalidate it."""
    from compressive_transformer.experiments.study import result_state, stored_identity

    job = study_jobs(load_study(spec), tmp_path, threads=1, progress=False)[0]
    assert job.identity()["config"]["train.amp"] == job.identity()["config"]["eval.amp"] == "none"

    def write(identity_config: dict, flags: list[str]) -> None:
        result = fake_result(job, 1.0, 1.0)
        result["identity"] = {**result["identity"], "config": identity_config}
        result["machine"] = {"cpu": "test", "cpu_flags": flags}
        job.result_path.parent.mkdir(parents=True, exist_ok=True)
        job.result_path.write_text(json.dumps(result))

    old = {**job.identity()["config"], "train.amp": "auto", "eval.amp": ""}
    write(old, ["avx2", "fma"])  # "auto" on a CPU without bf16 ran in fp32
    assert result_state(job) == "done"
    write(old, ["avx2", "avx512_bf16"])  # the same config on a bf16 CPU trained another run
    assert result_state(job) == "retrain"
    assert stored_identity(json.loads(job.result_path.read_text()))["config"]["eval.amp"] == "bf16"
    older = {k: v for k, v in job.identity()["config"].items() if k != "model.positions.share"}
    write(older, [])
    assert result_state(job) == "done"
    write({**older, "model.positions.share": "all"}, [])
    assert result_state(job) == "retrain"


# ---------------------------------------------------------------------------------------------------------------
# real runs


@pytest.mark.slow
def test_a_study_killed_at_any_point_resumes_to_the_same_results(tmp_path: Path, spec: Path) -> None:
    reference = tmp_path / "reference"
    summary = run_study(spec, reference, threads=1, log=quiet)
    assert summary["runs_done"] == 4
    md = (reference / "results.md").read_text()
    assert "**4 of 4 runs finished**" in md and "| ct |" in md and "±" in md
    assert (reference / ".gitignore").read_text().splitlines()[1:] == ["runs/", "cache/", "logs/"]
    ref = results_of(reference)
    assert len(ref) == 4
    for r in ref.values():
        ev = r["evaluations"]["long"]["test"]
        assert ev["bits_per_char"] > 0 and ev["chars"] > 0 and ev["words"] > 0
        lb = ev["lookback"]
        bucketed = sum(b["tokens"] for b in lb["buckets"].values())
        assert bucketed + lb["tokens_without_key"] + lb["tokens_outside_words"] == ev["predicted_tokens"]
        assert lb["tokens_outside_words"] == 2, "the newline after each document's last word"
    assert ref["results/ct/seed-0.json"]["evaluations"]["long"]["test"]["cmem_len"] == 12

    # kill the study while the third run (ct, seed 0) is training, then rerun it
    out = tmp_path / "killed"
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    cmd = [sys.executable, "-m", "compressive_transformer.cli", "study", str(spec), "--out", str(out), "--threads", "1"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    target = out / "runs" / "ct" / "seed-0" / "checkpoints"
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None and not (target.is_dir() and any(target.iterdir())):
        time.sleep(0.02)
    killed = proc.poll() is None
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert killed, "the study finished before it could be killed; make the runs longer"
    assert not (out / "results" / "ct" / "seed-0.json").exists()
    assert (out / "results" / "txl" / "seed-1.json").exists(), "finished runs were written as they finished"
    partial = (out / "results.md").read_text()
    assert "**2 of 4 runs finished**" in partial
    before = (out / "results" / "txl" / "seed-0.json").read_text()
    run_study(spec, out, threads=1, log=quiet)
    assert (out / "results" / "txl" / "seed-0.json").read_text() == before, "finished runs are reused, not redone"
    assert results_of(out) == ref
    for path in (out / "results").rglob("*.json"):  # the killed run's CPU seconds cover each of its steps once
        cpu = json.loads(path.read_text())["cpu_seconds"]
        assert cpu["train"]["steps"] == 6 and cpu["train"]["seconds"] > 0 and cpu["measure"] > 0
    assert "| 6 | " in (out / "results.md").read_text(), "the variants table gives the updates"

    # a run killed before its first checkpoint is started again
    again = tmp_path / "early"
    job = next(
        j for j in study_jobs(load_study(spec), again, threads=1, progress=False) if j.variant == "ct" and j.seed == 1
    )
    train_run(job.config, job.run_dir, max_steps=1, log=quiet)
    assert not (job.run_dir / "checkpoints").exists() or not any((job.run_dir / "checkpoints").iterdir())
    run_study(spec, again, threads=1, log=quiet)
    assert results_of(again) == ref

    # the study refuses to mix results of another config into its directory
    spec.write_text(spec.read_text().replace("steps = 6", "steps = 8"))
    with pytest.raises(ConfigError, match="was made with another run config"):
        run_study(spec, out, threads=1, log=quiet)


@pytest.mark.slow
def test_parallel_runs_give_the_sequential_results(tmp_path: Path, spec: Path) -> None:
    spec.write_text(spec.read_text().replace("seeds = [0, 1]", "seeds = [0]"))
    run_study(spec, tmp_path / "one", threads=1, parallel=1, log=quiet)
    run_study(spec, tmp_path / "two", threads=2, parallel=2, log=quiet)
    assert results_of(tmp_path / "one") == results_of(tmp_path / "two")
    assert (tmp_path / "two" / "logs" / "ct-seed-0.log").read_text().count("wrote") == 1
    said: list[str] = []  # more runs at once than threads in all: the study says it runs fewer, and how to fix it
    run_study(spec, tmp_path / "two", threads=1, parallel=2, log=said.append)
    assert "1 at a time with 1 thread(s) each (parallel 2 capped by 1 thread(s) in all: raise threads" in said[0]


@pytest.mark.slow
def test_out_of_memory_while_measuring_is_one_line_and_keeps_the_trained_runs(
    tmp_path: Path, spec: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Measuring whole documents can need more memory than training did: the error names the sizes to lower, and
    the rerun measures the trained runs again without training them again."""
    one = tmp_path / "one.toml"
    one.write_text(spec.read_text().replace("seeds = [0, 1]", "seeds = [0]").split("[variants.ct.model]")[0])
    out = tmp_path / "out"

    def no_memory(*args: object, **kwargs: object) -> None:
        raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 68719476736 bytes")

    monkeypatch.setattr(study_module, "token_nll", no_memory)
    with pytest.raises(ConfigError) as e:
        run_study(one, out, parallel=1, threads=1, log=quiet)
    message = str(e.value)
    assert "\n" not in message and message.startswith("out of memory while measuring txl seed 0 on validation")
    assert (
        "eval.batch_size = 2" in message
        and "evaluation 'train' seg_len/mem_len/cmem_len = 8/16/0" in message
        and "measured again" in message
    )
    checkpoint = latest_checkpoint(out / "runs" / "txl" / "seed-0")
    assert checkpoint is not None and not list((out / "results").rglob("*.json"))
    monkeypatch.undo()
    summary = run_study(one, out, parallel=1, threads=1, log=quiet)
    assert summary["runs_done"] == 1 and latest_checkpoint(out / "runs" / "txl" / "seed-0") == checkpoint


class Killed(BaseException):
    """Stands for SIGKILL: nothing after it runs in the process."""


def test_a_run_killed_after_training_keeps_its_final_train_loss(
    tmp_path: Path, spec: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A study killed after a run finished training but before its result was written, then rerun: the result
    equals the uninterrupted one, ``final_train_loss`` included (it was null: the rerun trained no step)."""
    one = tmp_path / "one.toml"
    one.write_text(spec.read_text().replace("seeds = [0, 1]", "seeds = [0]").split("[variants.ct.model]")[0])
    reference = tmp_path / "reference"
    run_study(one, reference, parallel=1, threads=1, log=quiet)
    out = tmp_path / "out"

    def killed(*args: object, **kwargs: object) -> None:
        raise Killed

    with monkeypatch.context() as m:
        m.setattr(study_module, "measure_run", killed)
        with pytest.raises(Killed):
            run_study(one, out, parallel=1, threads=1, log=quiet)
    assert latest_checkpoint(out / "runs" / "txl" / "seed-0") is not None
    run_study(one, out, parallel=1, threads=1, log=quiet)
    result = json.loads((out / "results" / "txl" / "seed-0.json").read_text())
    assert isinstance(result["final_train_loss"], float)
    assert results_of(out) == results_of(reference)


def test_each_result_records_its_code_and_data_and_the_report_keeps_the_runs_machines(
    tmp_path: Path, spec: Path
) -> None:
    """A run's result names the commit and the data's fingerprint that made it; rebuilding the report from the
    results keeps the machines the runs ran on (its own code and machine are recorded apart), and runs made by
    different code are listed run by run."""
    from compressive_transformer.experiments.study_report import write_report
    from compressive_transformer.runs.provenance import code_state, data_fingerprint

    one = tmp_path / "one.toml"
    one.write_text(spec.read_text().split("[variants.ct.model]")[0])  # txl, seeds 0 and 1
    out = tmp_path / "out"
    run_study(one, out, parallel=1, threads=1, log=quiet)
    study = load_study(one)
    result_path = out / "results" / "txl" / "seed-0.json"
    result = json.loads(result_path.read_text())
    want = data_fingerprint(study.configs["txl"].data, ("train", "validation", "test"))
    assert result["provenance"]["data"]["splits"] == want["splits"]
    assert result["provenance"]["code"]["commit"] == code_state(exclude=[out])["commit"]
    result["machine"] = result["machine"] | {"cpu": "the machine that ran it"}
    result["provenance"]["code"] = {"commit": "f" * 40, "dirty": True}
    result_path.write_text(json.dumps(result))
    summary = write_report(study, out)
    assert any(m["cpu"] == "the machine that ran it" for m in summary["machines"])
    assert summary["report"]["machine"]["cpu"] != "the machine that ran it"
    assert summary["provenance"]["mixed"] is True
    md = (out / "results.md").read_text()
    assert "| txl seed 0 | fffffff (dirty) |" in md and "| txl seed 1 |" in md and "This report: code" in md
