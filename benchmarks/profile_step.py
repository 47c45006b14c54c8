"""Where a training (or evaluation) step's time goes, for ours and the peers side by side, grouped by kind of work.

Each implementation runs in its own child (``child.py --phase profile_train``), fills its memories, warms up, then
runs ``--steps`` steps under ``torch.profiler``; every operator's self CPU time is summed per step and grouped into
matmuls, softmax and loss, layer norm, copies and layout, the optimizer, the remaining elementwise work, view and
allocation bookkeeping, and what no operator accounts for (Python, the autograd engine between operators). The
profiler itself slows a step (the table gives the same steps unprofiled), an operator that allocates a large
output is charged the page faults of touching it, and some elementwise operators are charged several times their
unprofiled cost (the positional bias's add: ~2.5 ms per call profiled, ~0.5 ms timed alone in the same step), so
compare kinds of work and matmul times, not single small operators. The
table says what a faster step has to remove: for a step ``r`` times faster than a peer's, everything that is not a
matmul must fit into ``peer step / r - our matmul time``.

    python -m benchmarks.profile_step                                  # train, ours + ours_txl + lucidrains
    python -m benchmarks.profile_step --phase eval --impl ours,lucidrains
    python -m benchmarks.profile_step --amp bf16                       # the same steps under bf16 autocast
"""

from __future__ import annotations

import argparse
from pathlib import Path

from benchmarks import workloads
from benchmarks.bench import child, python_for

HERE = Path(__file__).resolve().parent

MATMUL = {
    "aten::mm",
    "aten::addmm",
    "aten::bmm",
    "aten::baddbmm",
    "aten::baddbmm_",
    "aten::addbmm",
    "aten::_mkl_linear",
    "aten::mkldnn_convolution",
    "aten::convolution_backward",
}  # a convolution is a matmul over windows
SOFTMAX = {
    "aten::_softmax",
    "aten::_softmax_backward_data",
    "aten::_log_softmax",
    "aten::_log_softmax_backward_data",
    "aten::nll_loss_forward",
    "aten::nll_loss_backward",
    "aten::nll_loss2d_forward",
    "aten::nll_loss2d_backward",
}
NORM = {"aten::native_layer_norm", "aten::native_layer_norm_backward"}
COPY = {
    "aten::copy_",
    "aten::cat",
    "aten::clone",
    "aten::index_copy_",
    "aten::index_select",
    "aten::index",
    "aten::index_put_",
    "aten::_index_put_impl_",
    "aten::gather",
    "aten::scatter",
    "aten::scatter_add_",
    "aten::stack",
    "aten::_to_copy",
    "aten::as_strided_scatter",
    "aten::narrow_copy",
    "aten::roll",
    "aten::index_add_",
    "aten::embedding_dense_backward",
    "aten::embedding_backward",
    "aten::masked_scatter_",
}
VIEW = {
    "aten::view",
    "aten::as_strided",
    "aten::slice",
    "aten::select",
    "aten::transpose",
    "aten::t",
    "aten::permute",
    "aten::expand",
    "aten::unsqueeze",
    "aten::reshape",
    "aten::_unsafe_view",
    "aten::squeeze",
    "aten::detach",
    "aten::alias",
    "aten::split",
    "aten::chunk",
    "aten::narrow",
    "aten::unbind",
    "aten::split_with_sizes",
    "aten::_reshape_alias",
    "aten::unflatten",
    "aten::flatten",
    "aten::contiguous",
    "aten::view_as",
    "aten::expand_as",
    "aten::lift_fresh",
    "aten::detach_",
    "aten::result_type",
    "aten::empty",
    "aten::empty_strided",
    "aten::empty_like",
    "aten::resize_",
    "aten::set_",
    "aten::linear",
    "aten::matmul",
    "aten::einsum",
    "aten::layer_norm",
    "aten::softmax",
    "aten::log_softmax",
    "aten::cross_entropy_loss",
    "aten::nll_loss",
    "aten::nll_loss_nd",
    "aten::dropout",
    "aten::embedding",
    "aten::scaled_dot_product_attention",
}
CATEGORIES = (
    "matmul & convolution",
    "fused attention",
    "softmax & loss",
    "layer norm",
    "copies & layout",
    "optimizer",
    "elementwise & reductions",
    "views, allocation & op wrappers",
    "autograd & framework",
    "not in any op",
)


def category(op: str) -> str:
    """The kind of work of one profiler key (its self time only: wrappers such as aten::linear count as overhead)."""
    if op in MATMUL:
        return "matmul & convolution"
    if "scaled_dot_product" in op or "flash_attention" in op:
        return "fused attention"
    if op in SOFTMAX:
        return "softmax & loss"
    if op in NORM:
        return "layer norm"
    if "adam" in op.lower() or "_foreach" in op or op.startswith("Optimizer."):
        return "optimizer"
    if op in COPY:
        return "copies & layout"
    if op in VIEW:
        return "views, allocation & op wrappers"
    if op.startswith("aten::"):
        return "elementwise & reductions"
    return "autograd & framework"  # autograd nodes' own time, engine functions, record_function ranges


def grouped(r: dict) -> dict[str, float]:
    """ms per step by category; "not in any op" is the profiled wall time no operator's self time covers."""
    out = dict.fromkeys(CATEGORIES, 0.0)
    for op, ms in r["self_ms_per_step"].items():
        out[category(op)] += ms
    out["not in any op"] = max(0.0, r["wall_ms_per_step"] - sum(r["self_ms_per_step"].values()))
    return out


def report(results: dict[str, dict], phase: str, w, speedups: tuple[float, ...]) -> list[str]:
    ok = {k: v for k, v in results.items() if "error" not in v}
    groups = {k: grouped(v) for k, v in ok.items()}
    names = list(ok)
    lines = [f"# Where a `{w.name}` {phase} step goes (torch.profiler, self CPU time per step, ms)", ""]
    lines += ["| kind of work | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for c in CATEGORIES:
        cells = [f"{groups[n][c]:.1f} ({groups[n][c] / ok[n]['wall_ms_per_step']:.0%})" for n in names]
        lines.append(f"| {c} | " + " | ".join(cells) + " |")
    lines.append("| **profiled step** | " + " | ".join(f"**{ok[n]['wall_ms_per_step']:.1f}**" for n in names) + " |")
    lines.append(
        "| the same steps unprofiled | " + " | ".join(f"{ok[n]['unprofiled_ms_per_step']:.1f}" for n in names) + " |"
    )
    for k, v in results.items():
        if "error" in v:
            lines += ["", f"- `{k}`: {v['error']}"]
    ours = next((n for n in names if n.startswith("ours") and n != "ours_txl"), None)
    peers = [n for n in names if not n.startswith("ours")]
    if ours and peers:
        mm = groups[ours]["matmul & convolution"]
        lines += [
            "",
            f"What `{ours}` may spend on everything but matmuls ({mm:.1f} ms) to be r times faster than a peer:",
            "",
        ]
        lines += [
            "| peer | peer step ms (unprofiled) | " + " | ".join(f"r = {s:g}" for s in speedups) + " | ours now |",
            "|---|---|" + "---|" * (len(speedups) + 1),
        ]
        rest = ok[ours]["unprofiled_ms_per_step"] - mm
        for p in peers:
            t = ok[p]["unprofiled_ms_per_step"]
            lines.append(f"| {p} | {t:.1f} | " + " | ".join(f"{t / s - mm:.1f}" for s in speedups) + f" | {rest:.1f} |")
    for n in names:
        top = list(ok[n]["self_ms_per_step"].items())[:12]
        lines += [
            "",
            f"`{n}`, the 12 costliest operators: "
            + ", ".join(f"{op.removeprefix('aten::')} {ms:.1f}" for op, ms in top),
        ]
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", default="reference", choices=sorted(workloads.WORKLOADS))
    ap.add_argument("--phase", default="train", choices=["train", "eval"])
    ap.add_argument("--impl", default="ours,ours_txl,lucidrains", help="comma-separated adapters (benchmarks/impls)")
    ap.add_argument("--steps", type=int, default=4, help="profiled steps per implementation")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--python", default=None, help="interpreter for the children (default: benchmarks/.venv-peers if present)"
    )
    ap.add_argument("--amp", default="none", choices=["none", "bf16"], help="autocast of the profiled steps")
    ap.add_argument("--out", type=Path, default=HERE / "results")
    a = ap.parse_args()
    w = workloads.get(a.workload)
    results = {}
    for impl in a.impl.split(","):
        print(f"[profile] {impl} {a.phase} ...", flush=True)
        results[impl] = child(python_for(impl, a), impl, f"profile_{a.phase}", a.workload, a, extra=("--amp", a.amp))
    lines = report(results, a.phase, w, speedups=(1.0, 1.4, 1.6))
    name = f"profile_{a.phase}" + ("" if a.amp == "none" else f"_{a.amp}")
    workloads.write_report(
        a.out, name, {"workload": w.to_dict(), "phase": a.phase, "amp": a.amp, "results": results}, lines
    )


if __name__ == "__main__":
    main()
