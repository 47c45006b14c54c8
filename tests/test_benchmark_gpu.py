"""benchmarks/gpu.py: ratios are against the fastest shipped peer and our Transformer-XL, MFU against the rate of
the step's own precision, and the harness runs end to end (on the CPU here, as ``--device cpu`` allows)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
gpu = pytest.importorskip("benchmarks.gpu")


def run(train: float, evaluate: float) -> dict:
    return {"train": {"tokens_per_s": train}, "eval": {"tokens_per_s": evaluate}}


def test_ratios_are_against_the_fastest_shipped_peer_and_our_transformer_xl():
    res = {
        "runs": {
            "bf16": {
                "ours": run(300.0, 900.0),
                "ours_txl": run(400.0, 1000.0),
                "lucidrains": run(200.0, 300.0),
                "labml": run(100.0, 600.0),
                "lucidrains_fixed": run(1000.0, 1000.0),  # not a shipped peer: never the reference
                "ours+compile": {"error": "boom"},
            }
        }
    }
    assert gpu.ratios(res) == [
        "- bf16, train: ours = 1.50x lucidrains, 0.75x ours_txl",
        "- bf16, eval: ours = 1.50x labml, 0.90x ours_txl",
    ]


def test_mfu_is_model_flops_over_the_measured_rate_and_absent_without_either():
    assert gpu.mfu(1000.0, 2e6, 4.0) == pytest.approx(0.5)  # 2 GFLOP/s of 4
    assert gpu.mfu(None, 2e6, 4.0) is None and gpu.mfu(1000.0, 2e6, None) is None


def test_the_default_run_has_every_kernel_eager_graphed_and_compiled():
    keys = set(gpu.ENTRIES)
    for kernel in ("reference", "explicit", "sdpa-bias", "fused"):
        assert {f"ours+{kernel}", f"ours+{kernel}+graphs", f"ours+{kernel}+compile"} <= keys
        assert gpu.ENTRIES[f"ours+{kernel}+compile"] == ("ours", {"attn_impl": kernel, "compile": True})
        assert gpu.ENTRIES[f"ours+{kernel}+graphs"] == ("ours", {"attn_impl": kernel, "graphs": True})
    assert {"ours", "ours+graphs", "ours+compile", "lucidrains", "labml"} <= keys


ENTRIES = ("ours", "ours+graphs", "ours+reference+compile", "labml")  # the default run is all of gpu.ENTRIES


@pytest.mark.slow
def test_the_benchmark_is_one_command_with_backends_eager_and_compiled_in_each_precision(tmp_path):
    """The GPU run as it will be made, dry on the CPU, for a few entries (each is a child; the whole default list
    takes minutes): fp32 and bf16. TORCHDYNAMO_DISABLE keeps it to seconds: torch.compile then runs eager code."""
    cmd = [
        sys.executable,
        "-m",
        "benchmarks.gpu",
        "--workload",
        "tiny",
        "--device",
        "cpu",
        "--amp",
        "none,bf16",
        "--impl",
        ",".join(ENTRIES),
        "--steps",
        "2",
        "--threads",
        "1",
        "--python",
        sys.executable,
        "--out",
        str(tmp_path),
    ]
    env = dict(os.environ, TORCHDYNAMO_DISABLE="1")
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=ROOT, env=env)
    assert p.returncode == 0, p.stderr[-2000:]
    res = json.loads((tmp_path / "tiny.json").read_text())
    assert set(res["runs"]) == {"none", "bf16"} and set(res["matmul_gflops"]) == {"float32", "bfloat16"}
    for amp in ("none", "bf16"):
        assert set(res["runs"][amp]) == set(ENTRIES)
        for key in [k for k in ENTRIES if k.startswith("ours")]:
            ours = res["runs"][amp][key]
            assert ours["amp"] == amp and ours["device"] == "cpu", key
            assert ours["train"]["tokens_per_s"] > 0 and ours["eval"]["tokens_per_s"] > 0, key
            assert len(ours["generate"]["per_prompt"]) == 2
        compiled = res["runs"][amp]["ours+reference+compile"]["config"]
        assert compiled["attn_impl"] == "reference" and compiled["compiled_steps"]
        assert res["runs"][amp]["ours+graphs"]["config"]["cuda_graphs"]
    md = (tmp_path / "tiny.md").read_text()
    assert md.count("| ours | ") == 2 and md.count("| ours+reference+compile | ") == 2
    labml = res["runs"]["none"]["labml"]
    if "error" in labml:  # the peers' venv is not this one: the row says so instead of failing the run
        assert "| labml | none | ERROR: " in md


PARTS = ["env", "warm", "kernels", "step", "tests-cuda", "tests", "step-flex", "peers", "train", "eval", "generation"]
PARTS.append("paper")


def dry_run(out: Path, *parts: str, **env: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "DEVICE": "cpu", "PYTHON": sys.executable, "WHEELS": str(out / "none"), **env}
    env.update(BUDGET="4000", LIMIT_SCALE="6")  # the GPU's limits would cut a dry run short on a loaded CPU
    env.pop("TORCHDYNAMO_DISABLE", None)
    cmd = ["bash", "benchmarks/gpu_check.sh", str(out), *parts]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=3000, cwd=ROOT, env=env)


@pytest.mark.slow
def test_the_prepared_gpu_check_runs_end_to_end_on_the_cpu(tmp_path):
    """benchmarks/gpu_check.sh as a dry run (DEVICE=cpu, tiny sizes): every part's code path runs and succeeds, each
    writes its results as it ends, the summary fits a screen; a part reruns alone, replacing its line."""
    pytest.importorskip("triton")  # the kernel parts run the Triton kernels (the [gpu] extra; setup.sh all)
    out = tmp_path / "check"
    p = dry_run(out)
    assert p.returncode == 0, (p.stdout + p.stderr)[-3000:]
    summary = (out / "summary.txt").read_text().splitlines()
    assert [line.split(":")[0] for line in summary] == PARTS
    assert all(line.split(": ", 1)[1].startswith("ok") for line in summary), summary
    warm = json.loads((out / "warm.json").read_text())["jobs"]
    assert {"forward:0", "key:0", "query:0", "first", "flex", "step"} <= set(warm)
    rows = {row["impl"]: row for row in json.loads((out / "kernels.json").read_text())["rows"]}
    assert {"fused (Triton)", "fused, first kernel", "sdpa-bias", "flex (FlexAttention)"} <= set(rows)
    assert all(row["forward_backward_tflops"] > 0 and row["max_rel_difference"] < 1e-5 for row in rows.values())
    passes = [name for name, _ in rows["fused (Triton)"]["launches_ms"]]  # each pass timed alone
    assert passes == ["forward_kernel", "key_value_grad_kernel", "key_value_grad_kernel", "query_grad_kernel"]
    step = json.loads((out / "step.json").read_text())["kernels"]["sdpa-bias"]
    assert step["tokens_per_s"] > 0 and step["graphs"] >= 1 and step["profile_of_one_replay"]["kernel_ms"] > 0
    assert json.loads((out / "step-flex.json").read_text())["kernels"]["flex"]["tokens_per_s"] > 0
    runs = json.loads((out / "gpu-train.json").read_text())["runs"]["bf16"]
    assert runs["ours+graphs"]["train"]["tokens_per_s"] > 0 and runs["ours+graphs"]["config"]["cuda_graphs"]
    assert json.loads((out / "paper_time.json").read_text())["hours"] > 0
    assert "== GPU check summary" in p.stdout and len(p.stdout.splitlines()) < 50  # one screen
    again = dry_run(out, "peers")  # one part alone: its line replaced, the others kept
    assert again.returncode == 0
    assert [line.split(":")[0] for line in (out / "summary.txt").read_text().splitlines()] == [
        *PARTS[:7],
        *PARTS[8:],
        "peers",
    ]


def test_a_failing_part_fails_the_check_and_says_so(tmp_path):
    """A part that fails (here the peers' install of a file that is no wheel) makes the exit status 1 and its line
    says so; the glob takes files only (a folder named like a wheel is not installed)."""
    wheels = tmp_path / "wheels"
    (wheels / "folder.whl").mkdir(parents=True)
    (wheels / "broken-0.1-py3-none-any.whl").write_text("not a zip")
    out = tmp_path / "check"
    p = dry_run(out, "peers", WHEELS=str(wheels))
    assert p.returncode == 1
    line = (out / "summary.txt").read_text().strip()
    assert line.startswith("peers: failed"), line
    assert "folder.whl" not in (out / "peers.log").read_text()


def test_the_peers_wheel_list_is_complete():
    """What the peers import: mogrifier needs einops; labml needs gitpython -> gitdb -> smmap."""
    names = [line.split("==")[0] for line in (ROOT / "benchmarks/peers-requirements.txt").read_text().splitlines()]
    names = [n for n in names if n and not n.startswith("#")]
    assert {"compressive-transformer-pytorch", "mogrifier", "einops", "labml-nn", "labml", "gitpython"} <= set(names)
    assert {"gitdb", "smmap"} <= set(names)
