"""One screen from the prepared GPU check's results folder (``bash benchmarks/gpu_check.sh`` prints it at the end):
each part's status, the attention kernels' times per pass, the training step's rate, MFU and where its kernel time
goes, the tests' outcome and ours against the peers.

    python -m benchmarks.gpu_summary benchmarks/results/gpu
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def _json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def kernel_lines(res: dict) -> list[str]:
    lines = [f"kernels ({res.get('device_name')}, {res.get('dtype')}): fwd / bwd ms, fwd+bwd TFLOP/s, saved MiB"]
    for r in res.get("rows", []):
        if "error" in r:
            lines.append(f"  {r['impl']:22s} ERROR {r['error'][:90]}")
            continue
        passes = " ".join(f"{n.removesuffix('_kernel')}={ms:.2f}" for n, ms in r.get("launches_ms", []))
        lines.append(
            f"  {r['impl']:22s} {r['forward_ms']:7.2f} / {r['backward_ms']:7.2f}  {r['forward_backward_tflops']:6.3g}"
            f"  {r.get('saved_for_backward_mib', 0):7.4g}  {passes[:70]}"
        )
    return lines


def step_lines(name: str, res: dict) -> list[str]:
    lines = []
    for kernel, e in res.get("kernels", {}).items():
        if "error" in e:
            lines.append(f"{name} {kernel}: ERROR {e['error'][:100]}")
            continue
        mfu = f"{e['mfu']:.1%}" if e.get("mfu") is not None else "-"
        prof = e.get("profile_of_one_replay", {})
        kinds = ", ".join(f"{k} {ms:.1f}" for k, ms in list(prof.get("kernel_ms_by_kind", {}).items())[:5])
        lines.append(
            f"{name} {kernel} (compiled {e.get('compiled')}): {e['tokens_per_s']:,.0f} tok/s, MFU {mfu}, "
            f"peak {e.get('peak_mib', 0):.0f} MiB; one replay {prof.get('kernel_ms', 0):.1f} ms: {kinds}"
        )
    return lines


def tests_line(log: Path) -> str | None:
    try:
        text = log.read_text().strip().splitlines()
    except OSError:
        return None
    tail = [line for line in text if " passed" in line or " failed" in line or " error" in line or "skipped" in line]
    return f"{log.stem}: {tail[-1].strip('= ')}" if tail else None


def summary(out: Path) -> list[str]:
    lines = ["== GPU check summary: " + str(out)]
    status = (out / "summary.txt").read_text().strip() if (out / "summary.txt").exists() else "(no summary.txt)"
    lines += [line for line in status.splitlines()]
    res = _json(out / "kernels.json")
    if res:
        lines += kernel_lines(res)
    for name in ("step", "step-flex"):
        res = _json(out / f"{name}.json")
        if res:
            lines += step_lines(name, res)
    for log in ("tests-cuda", "tests"):
        line = tests_line(out / f"{log}.log")
        if line:
            lines.append(line)
    for phase in ("train", "eval", "generation"):
        md = out / f"gpu-{phase}.md"
        if md.exists():
            lines += [line for line in md.read_text().splitlines() if line.startswith("- ")][:3]
    paper = _json(out / "paper_time.json")
    if paper and "hours" in paper:
        lines.append(f"paper: {paper['tokens_per_s']:,.0f} tok/s, {paper['hours']:.1f} h to the schedule's tokens")
    return lines


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    print("\n".join(summary(Path(args[0] if args else "benchmarks/results/gpu"))))


if __name__ == "__main__":
    main()
