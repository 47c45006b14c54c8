"""The command line keeps freed memory in the process: repeated large temporaries stop page-faulting."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from compressive_transformer import cli

PROBE = textwrap.dedent(
    """
    import resource, sys, torch
    from compressive_transformer.runs import allocator
    if sys.argv[1] == "tuned":
        applied = allocator.keep_freed_memory()
    else:  # the control: glibc's static thresholds at their smallest, so every big block is returned when freed
        applied = allocator.set_thresholds(mmap=128 << 10, trim=128 << 10)
    def step():  # what a step does: big temporaries of a few sizes, allocated, touched and freed
        a = torch.ones(3 << 20); b = torch.ones(2 << 20) + a[: 2 << 20]; c = torch.ones(1 << 20); del a, b, c
    for _ in range(3):
        step()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(20):
        step()
    print(applied, (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 20)
    """
)


def probe(mode: str, env: dict | None = None) -> tuple[str, float]:
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True, env=env)
    applied, faults = out.stdout.split()
    return applied, float(faults)


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_kept_memory_stops_the_page_faults_of_repeated_temporaries():
    applied, tuned = probe("tuned")
    if applied != "True":
        pytest.skip("not glibc: mallopt is not available or has no effect")
    _, returning = probe("returning")  # not glibc's default, whose thresholds move with what was freed before
    pages_per_step = (3 + 2 + 2 + 1) * (4 << 20) // 4096  # 32 MiB of float32 touched per step (with b's temporary)
    if returning < 0.5 * pages_per_step:  # the control shows no faults: this C library ignores the thresholds
        pytest.skip(f"mallopt's thresholds have no effect here ({returning} faults per step with the smallest)")
    assert tuned < 0.05 * pages_per_step, tuned  # measured ~100 vs ~8,200


def test_the_setting_can_be_turned_off(monkeypatch):
    monkeypatch.setenv("CT_KEEP_FREED_MEMORY", "0")
    from compressive_transformer.runs.allocator import keep_freed_memory

    assert keep_freed_memory() is False


def test_the_command_line_applies_it(monkeypatch):
    calls = []
    monkeypatch.setattr("compressive_transformer.runs.allocator.keep_freed_memory", lambda: calls.append(1) or True)
    assert cli.main(["range"]) == 0
    assert calls == [1]
