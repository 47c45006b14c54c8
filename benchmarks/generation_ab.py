"""Generation on the CPU, this checkout against an earlier commit, interleaved: milliseconds per token of the decoder.

Each measurement is a fresh child process on one side's source tree (this checkout's ``src/``, or the earlier commit's
``src/`` unpacked with ``git archive``), with the same benchmark code: the workload's model (seed 0), a prompt of
``gen_long_prompt`` tokens read in segments of n_s, then ``--tokens`` greedy tokens through ``Decoder.step`` (what
``generate`` runs on a CPU), each timed. The sides alternate round by round (the order flipped each round), so load from
elsewhere hits both alike; what to compare is the ratio within a round, and its median over rounds. The machine's CPU
model and flags, the load average and the command are written beside the numbers.

    python -m benchmarks.generation_ab --baseline 183c9f2                  # reference workload, 5 rounds x 200 tokens
    python -m benchmarks.generation_ab --baseline 183c9f2 --rounds 9 --threads 1 --out benchmarks/results/generation

Run it on a quiet machine: on a loaded one the spread across rounds says how far to trust the ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from io import BytesIO
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def child(workload: str, tokens: int, threads: int) -> dict:
    """One side's measurement, in this process (the parent sets which ``compressive_transformer`` it imports)."""
    import torch

    import compressive_transformer
    from benchmarks.impls.ours import model_config
    from benchmarks.workloads import get
    from compressive_transformer import CompressiveTransformerLM
    from compressive_transformer.core.models.decode import Decoder

    torch.set_num_threads(threads)
    w = get(workload)
    torch.manual_seed(0)
    model = CompressiveTransformerLM(model_config(w)).eval()
    prompt = torch.randint(0, w.vocab, (1, w.gen_long_prompt), generator=torch.Generator().manual_seed(0))
    stamps = []
    with torch.no_grad():
        memory = model.init_memory(1)
        for segment in prompt.split(w.seg_len, dim=1):
            out = model(segment, memory=memory)
            memory = out.memory
        token = out.logits[:, -1].argmax(-1)
        decoder = Decoder(model, memory)
        for _ in range(8):  # warm-up: the allocator, the first token's one-off work
            token = decoder.step(token).argmax(-1)
        stamps.append(time.perf_counter())
        for _ in range(tokens):
            token = decoder.step(token).argmax(-1)
            stamps.append(time.perf_counter())
    per_token = [(b - a) * 1e3 for a, b in zip(stamps, stamps[1:])]
    return {"ms_per_token": per_token, "source": str(Path(compressive_transformer.__file__).parent)}


def unpack(commit: str, into: Path) -> Path:
    """``src/`` of ``commit`` (git archive), unpacked under ``into``."""
    archive = subprocess.run(["git", "archive", commit, "src"], cwd=ROOT, capture_output=True, check=True).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into / "src"


def measure(src: Path, a: argparse.Namespace) -> dict:
    env = dict(os.environ, PYTHONPATH=f"{src}{os.pathsep}{ROOT}", OMP_NUM_THREADS=str(a.threads))
    cmd = [sys.executable, "-m", "benchmarks.generation_ab", "--child", "--workload", a.workload]
    cmd += ["--tokens", str(a.tokens), "--threads", str(a.threads)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True, cwd=ROOT).stdout
    return json.loads(out.strip().splitlines()[-1])


def machine() -> dict:
    from compressive_transformer.runs.machine import cpu_model_and_flags

    cpu, flags = cpu_model_and_flags()
    return {"cpu": cpu, "cpu_flags": flags, "nproc": os.cpu_count(), "python": sys.version.split()[0]}


def loadavg() -> list[float]:
    try:
        return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]
    except OSError:
        return []


def report(result: dict) -> list[str]:
    rows = result["rounds"]
    ratios = [r["new_ms"] / r["baseline_ms"] for r in rows]
    lines = [
        f"# Generation on the CPU: this checkout against {result['baseline']}, interleaved",
        "",
        f"Workload `{result['workload']}`, batch 1, {result['tokens']} tokens per side and round after a "
        f"{result['prompt']}-token prompt, {result['threads']} thread(s); CPU: {result['machine']['cpu']} "
        f"({result['machine']['nproc']} visible); load average before/after: {result['load_before']} / "
        f"{result['load_after']}. Command: `{result['command']}`.",
        "",
        "| round | baseline ms/token (median) | this checkout ms/token (median) | ratio |",
        "|---|---|---|---|",
    ]
    lines += [
        f"| {i + 1} | {r['baseline_ms']:.3f} | {r['new_ms']:.3f} | {q:.3f} |"
        for i, (r, q) in enumerate(zip(rows, ratios))
    ]
    lines += ["", f"Median ratio over rounds: **{statistics.median(ratios):.3f}** (this checkout / baseline)."]
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline", help="the earlier commit (any git revision)")
    ap.add_argument("--workload", default="reference")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=200)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=HERE / "results" / "generation_ab")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        print(json.dumps(child(a.workload, a.tokens, a.threads)))
        return 0
    if not a.baseline:
        ap.error("--baseline: the commit to compare against is required")
    from benchmarks.workloads import get, write_report

    with tempfile.TemporaryDirectory() as tmp:
        sides = {"baseline": unpack(a.baseline, Path(tmp)), "new": ROOT / "src"}
        load_before, rounds = loadavg(), []
        for r in range(a.rounds):
            order = ["baseline", "new"] if r % 2 == 0 else ["new", "baseline"]
            got = {side: measure(sides[side], a) for side in order}
            rounds.append({f"{side}_ms": statistics.median(got[side]["ms_per_token"]) for side in got})
            rounds[-1] |= {f"{side}_all": got[side]["ms_per_token"] for side in got}
            print(f"round {r + 1}: baseline {rounds[-1]['baseline_ms']:.3f} ms, new {rounds[-1]['new_ms']:.3f} ms")
    result = {
        "baseline": a.baseline,
        "workload": a.workload,
        "tokens": a.tokens,
        "prompt": get(a.workload).gen_long_prompt,
        "threads": a.threads,
        "machine": machine(),
        "load_before": load_before,
        "load_after": loadavg(),
        "command": "python -m benchmarks.generation_ab " + " ".join(sys.argv[1:] if argv is None else argv),
        "rounds": rounds,
    }
    write_report(a.out, f"{a.workload}-vs-{a.baseline}", result, report(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
