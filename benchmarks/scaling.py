"""Cost of a training step against the attention size, ours (compressive) against ours as Transformer-XL.

For each total T = n_m + n_cm, ours uses n_m = n_cm = T / 2 and Transformer-XL n_m = T, n_cm = 0: both attend over
n_s + T keys. Each point is a fresh subprocess timing training steps (forward + backward of task + compression
loss, Adam step) at steady state. The cost should grow linearly in T, and equal T should cost about the same.

    python -m benchmarks.scaling                     # reference widths, T in 128..2048
    python -m benchmarks.scaling --totals 64,128 --steps 2 --width tiny   # smoke

Writes benchmarks/results/scaling.json and scaling.png (or --out DIR).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import time
from pathlib import Path

from benchmarks import workloads
from benchmarks.bench import child, interleaved, loadavg, machine_info, python_for
from compressive_transformer.runs.provenance import code_state

HERE = Path(__file__).resolve().parent


def linear_fit(xs: list[float], ys: list[float]) -> dict:
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0
    icpt = my - slope * mx
    ss_res = sum((y - (icpt + slope * x)) ** 2 for x, y in zip(xs, ys))
    ss_tot = sum((y - my) ** 2 for y in ys)
    return {"slope_s_per_slot": slope, "intercept_s": icpt, "r2": 1 - ss_res / ss_tot if ss_tot else 1.0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--width", default="reference", choices=sorted(workloads.WORKLOADS), help="widths/batch from this workload"
    )
    ap.add_argument("--totals", default="128,256,512,1024,2048", help="n_m + n_cm values")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=str(HERE / "results"))
    ap.add_argument("--python", default=None)
    ap.add_argument(
        "--interleave",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="all points alive at once, timed steps interleaved (default; steadier under outside load)",
    )
    ap.add_argument(
        "--report-only", default=None, metavar="JSON", help="rebuild fits, markdown and plot from a scaling JSON"
    )
    a = ap.parse_args()
    base = workloads.get(a.width)
    if a.report_only:
        res = json.loads(Path(a.report_only).read_text())
        totals = sorted({p["total"] for p in res["points"]})
        report(res, totals, base, a, Path(a.report_only).parent)
        return
    totals = [int(t) for t in a.totals.split(",")]
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    res = {
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": machine_info(),
        "code": code_state(),
        "threads": a.threads,
        "width": a.width,
        "load_start": loadavg(),
        "points": [],
    }
    specs = {}
    for total in totals:
        # ours_txl.build turns (n_m, n_cm) into (n_m + n_cm, 0), so both get the same workload.
        w = base.replace(name=f"scaling_{total}", mem_len=total // 2, cmem_len=total - total // 2, gen_prompts=())
        specs[total] = (w, json.dumps(w.to_dict()))
    pre = {}
    if a.interleave:  # every (implementation, T) alive at once, timed steps interleaved (see bench.interleaved)
        members = [(f"{impl}@{total}", impl, specs[total][1]) for total in totals for impl in ("ours", "ours_txl")]
        res["interleaved"] = True
        pre = interleaved(members, "train", base.replace(steps=a.steps), a)
    for total in totals:
        for impl in ("ours", "ours_txl"):
            w, spec = specs[total]
            t0 = time.perf_counter()
            r = pre[f"{impl}@{total}"] if a.interleave else child(python_for(impl, a), impl, "train", spec, a)
            pt = {
                "impl": impl,
                "total": total,
                "attn_keys": w.seg_len + total,
                "mem_len": w.mem_len if impl == "ours" else total,
                "cmem_len": w.cmem_len if impl == "ours" else 0,
                **{k: r.get(k) for k in ("median_s", "p25_s", "p75_s", "tokens_per_s", "peak_rss_mb", "error")},
            }
            res["points"].append(pt)
            msg = pt["error"] or f"{pt['median_s']:.3f} s/step"
            print(f"[scaling] T={total:5d} {impl:9s} {time.perf_counter() - t0:5.1f}s  {msg}", flush=True)
            res["load_end"] = loadavg()
            (out / "scaling.json").write_text(json.dumps(res, indent=1))  # partial results survive an interruption
    report(res, totals, base, a, out)


def report(res: dict, totals: list[int], base, a, out: Path) -> None:
    for impl in ("ours", "ours_txl"):
        pts = [p for p in res["points"] if p["impl"] == impl and p.get("median_s")]
        if len(pts) >= 2:
            res[f"fit_{impl}"] = linear_fit([p["total"] for p in pts], [p["median_s"] for p in pts])
    ratios = []
    for total in totals:
        o = [p["median_s"] for p in res["points"] if p["impl"] == "ours" and p["total"] == total and p.get("median_s")]
        x = [
            p["median_s"]
            for p in res["points"]
            if p["impl"] == "ours_txl" and p["total"] == total and p.get("median_s")
        ]
        if o and x:
            ratios.append({"total": total, "ours_over_txl_time": o[0] / x[0]})
    res["ours_over_txl"] = ratios
    (out / "scaling.json").write_text(json.dumps(res, indent=1))

    lines = [
        f"### Scaling sweep ({res['width']} widths) — {res['date']}",
        "",
        f"{res['machine']['cpu']} ({res['machine']['nproc']} cores), {res['threads']} threads, load {res['load_start']} / {res['load_end']}. "
        "Median seconds per training step (forward + backward + Adam)"
        + (", all points' steps interleaved" if res.get("interleaved") else "")
        + ", batch "
        f"{base.batch} x n_s {base.seg_len}.",
        "",
        "| n_m + n_cm | keys per query | ours (n_m = n_cm = T/2) s/step | Transformer-XL (n_m = T) s/step | ours / XL |",
        "|---|---|---|---|---|",
    ]
    for total in totals:
        o = next((p for p in res["points"] if p["impl"] == "ours" and p["total"] == total), {})
        x = next((p for p in res["points"] if p["impl"] == "ours_txl" and p["total"] == total), {})
        r = next((q["ours_over_txl_time"] for q in ratios if q["total"] == total), None)
        f = lambda v: f"{v:.3f}" if v else "–"  # noqa: E731
        lines.append(f"| {total} | {base.seg_len + total} | {f(o.get('median_s'))} | {f(x.get('median_s'))} | {f(r)} |")
    for impl in ("ours", "ours_txl"):
        fit = res.get(f"fit_{impl}")
        if fit:
            lines.append(
                f"\nLinear fit {impl}: {1e3 * fit['intercept_s']:.1f} ms + {1e6 * fit['slope_s_per_slot']:.1f} us x T, R^2 = {fit['r2']:.4f}"
            )
    md = "\n".join(lines) + "\n"
    (out / "scaling.md").write_text(md)
    print(md)

    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed; no plot")
        return
    fig, ax = plt.subplots(figsize=(6, 4))
    for impl, label, mk in (
        ("ours", "ours, compressive (n_m = n_cm = T/2)", "o"),
        ("ours_txl", "ours, Transformer-XL (n_m = T)", "s"),
    ):
        pts = [p for p in res["points"] if p["impl"] == impl and p.get("median_s")]
        if not pts:
            continue
        xs, ys = [p["total"] for p in pts], [1e3 * p["median_s"] for p in pts]
        lo = [1e3 * (p["median_s"] - p["p25_s"]) for p in pts]
        hi = [1e3 * (p["p75_s"] - p["median_s"]) for p in pts]
        line = ax.errorbar(xs, ys, yerr=[lo, hi], fmt=mk, label=label, capsize=3)
        fit = res.get(f"fit_{impl}")
        if fit:
            fx = [0, max(xs)]
            ax.plot(
                fx,
                [1e3 * (fit["intercept_s"] + fit["slope_s_per_slot"] * x) for x in fx],
                "--",
                color=line[0].get_color(),
                label=f"fit: {1e3 * fit['intercept_s']:.0f} ms + {1e6 * fit['slope_s_per_slot']:.0f} us/slot (R²={fit['r2']:.3f})",
            )
    ax.set_xlabel("n_m + n_cm (memory slots per layer)")
    ax.set_ylabel("ms per training step")
    ax.set_title(f"Training step vs memory size ({res['width']} widths, {res['threads']} threads)")
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "scaling.png", dpi=120)
    print(f"wrote {out / 'scaling.png'}")


if __name__ == "__main__":
    main()
