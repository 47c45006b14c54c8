"""How high can training MFU go on this machine? The matmuls of one real training step, each re-timed alone.

The profiler records every matrix multiplication of steady-state training steps of our model (shapes and count),
then each distinct shape is timed in isolation (median of repeats, same threads), as is the 2048^2 GEMM that MFU is
measured against. Summing the isolated times gives the step's *matmul-only* time: what the step would cost if every
other operation (softmax, masks, copies, layer norms, the optimizer, Python) were free. Dividing the model FLOPs
by that time bounds MFU from above for this workload on this machine, whatever the implementation does around the
matmuls.

    python -m benchmarks.roofline --workload reference            # prints a table, writes results/roofline.{json,md}
"""

from __future__ import annotations

import collections
import json
import statistics
import time
from pathlib import Path

import torch

from benchmarks.impls import ours
from benchmarks.workloads import in_process_script, train_flops_per_token, write_report

HERE = Path(__file__).resolve().parent

MATMULS = {"aten::mm": 2, "aten::addmm": 3, "aten::bmm": 2, "aten::baddbmm": 3, "aten::baddbmm_": 3}


def _flops(name: str, shapes: list) -> float:
    """2 * m * n * k of one call, from the recorded input shapes (addmm/baddbmm: inputs 1 and 2)."""
    a, b = (shapes[0], shapes[1]) if name in ("aten::mm", "aten::bmm") else (shapes[1], shapes[2])
    batch = a[0] if len(a) == 3 else 1
    return 2.0 * batch * a[-2] * a[-1] * b[-1]


def _time(shape_a: list, shape_b: list, repeats: int) -> float:
    a, b = torch.randn(*shape_a), torch.randn(*shape_b)
    op = torch.bmm if len(shape_a) == 3 else torch.mm
    for _ in range(3):
        op(a, b)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        op(a, b)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    a, w = in_process_script(
        __doc__,
        HERE / "results",
        steps=(2, "profiled training steps (after the memories are full)"),
        repeats=(30, "timings per distinct matmul shape"),
    )
    impl = ours.build(w)
    x, y = torch.randint(0, w.vocab, (w.batch, w.seg_len)), torch.randint(0, w.vocab, (w.batch, w.seg_len))
    for _ in range(w.fill_segments + 1):
        impl.train_step((x, y))

    from torch.profiler import profile

    with profile(record_shapes=True) as prof:
        for _ in range(a.steps):
            impl.train_step((x, y))
    calls: collections.Counter = collections.Counter()
    for e in prof.events():
        if e.name in MATMULS and e.input_shapes:
            s = e.input_shapes
            ab = (s[0], s[1]) if e.name in ("aten::mm", "aten::bmm") else (s[1], s[2])
            calls[(e.name, json.dumps(ab))] += 1

    rows, total_s, total_flops = [], 0.0, 0.0
    for (name, ab), n in calls.most_common():
        sa, sb = json.loads(ab)
        per_step = n / a.steps
        t = _time(sa, sb, a.repeats)
        f = _flops("aten::mm" if len(sa) == 2 else "aten::bmm", [sa, sb])
        rows.append({"op": name, "a": sa, "b": sb, "calls_per_step": per_step, "ms": t * 1e3, "gflops": f / t / 1e9})
        total_s += per_step * t
        total_flops += per_step * f
    n_peak = w.matmul_n
    peak = 2.0 * n_peak**3 / _time([n_peak, n_peak], [n_peak, n_peak], max(5, a.repeats // 3)) / 1e9
    model_flops = train_flops_per_token(w) * w.batch * w.seg_len
    result = {
        "workload": w.to_dict(),
        "threads": a.threads,
        "peak_gflops": peak,
        "executed_matmul_gflop_per_step": total_flops / 1e9,
        "model_gflop_per_step": model_flops / 1e9,
        "matmul_only_s_per_step": total_s,
        "matmul_rate_gflops": total_flops / total_s / 1e9,
        "mfu_upper_bound": model_flops / total_s / (peak * 1e9),
        "shapes": rows,
    }
    lines = [
        f"# Matmul roofline of a `{a.workload}` training step ({a.threads} threads)",
        "",
        f"- {n_peak}^2 fp32 GEMM rate (what MFU is measured against): {peak:.1f} GFLOP/s",
        f"- model FLOPs per step: {model_flops / 1e9:.2f} GFLOP; matmul FLOPs actually executed: {total_flops / 1e9:.2f} GFLOP",
        f"- the step's matmuls timed alone: {total_s * 1e3:.1f} ms per step, i.e. {total_flops / total_s / 1e9:.1f} GFLOP/s",
        f"- **MFU upper bound** (model FLOPs / matmul-only time / GEMM rate): {result['mfu_upper_bound']:.1%}",
        "",
        "| op | A | B | calls/step | ms each | GFLOP/s |",
        "|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['op']} | {r['a']} | {r['b']} | {r['calls_per_step']:g} | {r['ms']:.3f} | {r['gflops']:.1f} |"
        for r in rows
    ]
    write_report(a.out, "roofline", result, lines)


if __name__ == "__main__":
    main()
