"""Benchmark harness: training / evaluation / generation throughput, peak memory, parameters and MFU for one
workload, ours against the peer implementations, each implementation and phase in its own subprocess.

    python -m benchmarks.bench --workload reference --impl all
    python -m benchmarks.bench --workload tiny --steps 2          # smoke test, seconds
    python -m benchmarks.bench --workload reference --precisions fp32,bf16   # every implementation in both

With several precisions every implementation runs in each: fp32, and under ``torch.autocast`` to bf16 (the peers'
code unchanged inside it); results are keyed ``impl`` (fp32) and ``impl@bf16``, with the targets computed per
precision and at each implementation's faster precision. The machine's CPU, whether it has bf16 instructions and
the measured bf16 / fp32 rate of a 1024 x 1024 matmul are recorded beside the numbers.

Writes benchmarks/results/<workload>.json and .md (or --out DIR) and prints the markdown table.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import workloads
from benchmarks.backends import allowed_phases, backend_targets, base, expand, markdown_lines, split_key
from compressive_transformer.runs.provenance import code_state

HERE = Path(__file__).resolve().parent

OURS = ("ours", "ours_txl", "ours_compiled")
PEERS = ("lucidrains", "lucidrains_fixed", "labml")
ALL = OURS + PEERS
SHIPPED_PEERS = ("lucidrains", "labml")  # the targets compare against peers as they ship
# lucidrains_fixed: its eval and generation are lucidrains' own code paths, unchanged; ours_compiled: only the decoder
# is compiled (training and evaluation are ours, eager).
ONLY_PHASES = {"lucidrains_fixed": ("train",), "ours_compiled": ("generate",)}
VENV_PY = HERE / ".venv-peers" / "bin" / "python"


PRECISIONS = {"fp32": "none", "bf16": "bf16"}  # --precisions label -> child.py --amp


def machine_info() -> dict:
    """The CPU, its speed-relevant flags and whether it has bf16 instructions (without them bf16 is emulated)."""
    from compressive_transformer.runs.machine import cpu_model_and_flags
    from compressive_transformer.runs.precision import bf16_flags

    cpu, flags = cpu_model_and_flags()
    bf16 = bf16_flags(flags)
    return {
        "cpu": cpu,
        "cpu_flags": flags,
        "bf16_flags": bf16,
        "has_bf16_instructions": bool(bf16),
        "nproc": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
    }


def member_key(impl: str, precision: str) -> str:
    """``impl`` for fp32 (the keys of single-precision results), ``impl@bf16`` otherwise."""
    return impl if precision == "fp32" else f"{impl}@{precision}"


def peers_available(impl: str, a) -> bool:
    """Whether ``impl``'s package imports under the interpreter its children run with (peers need setup_peers.sh)."""
    if impl not in PEERS:
        return True
    module = "labml_nn.transformers.compressive" if impl == "labml" else "compressive_transformer_pytorch"
    probe = subprocess.run([python_for(impl, a), "-c", f"import {module}"], capture_output=True)
    return probe.returncode == 0


def matmul_precisions(python: str, w, a) -> dict:
    """The rate of a 1024 x 1024 matmul in fp32 and in bf16 on this machine: what bf16 can buy here (2-16x on CPUs
    with AVX-512 BF16 or AMX, well below 1x where bf16 is emulated)."""
    out: dict = {"n": 1024}
    for dtype, name in (("float32", "fp32"), ("bfloat16", "bf16")):
        r = child(python, "matmul", "matmul", w.name, a, extra=("--matmul-n", "1024", "--matmul-dtype", dtype))
        out[f"{name}_gflops"] = r.get("gflops_median")
        if "error" in r:
            out[f"{name}_error"] = r["error"]
    if out.get("fp32_gflops") and out.get("bf16_gflops"):
        out["bf16_over_fp32"] = out["bf16_gflops"] / out["fp32_gflops"]
    return out


def loadavg() -> list[float]:
    try:
        return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]
    except OSError:
        return []


def child(
    python: str,
    impl: str,
    phase: str,
    workload: str,
    a,
    build_kw: dict | None = None,
    timeout: int = 1800,
    extra: tuple[str, ...] = (),
) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads), MKL_NUM_THREADS=str(a.threads), PYTHONDONTWRITEBYTECODE="1")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "r.json"
        cmd = [
            python,
            "-m",
            "benchmarks.child",
            "--impl",
            impl,
            "--phase",
            phase,
            "--workload",
            workload,
            "--threads",
            str(a.threads),
            "--out",
            str(out),
        ]
        if a.steps is not None:
            cmd += ["--steps", str(a.steps)]
        if a.warmup is not None:
            cmd += ["--warmup", str(a.warmup)]
        if build_kw:
            cmd += ["--build-kw", json.dumps(build_kw)]
        cmd += list(extra)
        t0 = time.perf_counter()
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout, cwd=str(HERE.parent))
        except subprocess.TimeoutExpired:
            return {"error": f"timed out after {timeout} s"}
        if p.returncode != 0 or not out.exists():
            tail = (p.stderr or p.stdout).strip().splitlines()[-1:] or ["(no output)"]
            return {"error": tail[0][:400], "stderr_tail": (p.stderr or "")[-3000:]}
        r = json.loads(out.read_text())
        r["wall_s"] = time.perf_counter() - t0
        return r


def interleaved(impls: list, phase: str, w, a) -> dict[str, dict]:
    """Runs every implementation's timed steps interleaved: step k of each implementation (in a rotating order)
    before step k+1 of any, each in its own long-lived child. Slow drifts in outside load then hit all alike, so
    the ratios are far steadier than with one implementation after the other."""
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads), MKL_NUM_THREADS=str(a.threads), PYTHONDONTWRITEBYTECODE="1")
    steps = w.steps if a.steps is None else a.steps
    tmp = tempfile.mkdtemp()
    procs = {}
    # members: implementation names (all on workload w, fp32), or (key, implementation, workload spec[, amp])
    members = [m if isinstance(m, tuple) else (m, m, w.name) for m in impls]
    members = [m if len(m) == 4 else (*m, "none") for m in members]
    impls = [key for key, _, _, _ in members]
    for impl, name, spec, amp in members:
        cmd = [
            python_for(name, a),
            "-m",
            "benchmarks.child",
            "--impl",
            name,
            "--phase",
            phase,
            "--workload",
            spec,
            "--threads",
            str(a.threads),
            "--serve",
            "--amp",
            amp,
            "--out",
            str(Path(tmp) / f"{impl}.json"),
        ]
        if a.warmup is not None:
            cmd += ["--warmup", str(a.warmup)]
        procs[impl] = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=str(HERE.parent),
        )
    failed: dict[str, str] = {}

    def ask(impl: str, cmd: str) -> str | None:
        p = procs[impl]
        try:
            p.stdin.write(cmd + "\n")
            p.stdin.flush()
            for line in p.stdout:
                if line.startswith("@@ "):
                    return line[3:].strip()
        except (BrokenPipeError, OSError):
            pass
        failed[impl] = (
            ((p.stderr.read() if p.poll() is not None else "") or "child exited").strip().splitlines()[-1][:400]
        )
        return None

    for impl in impls:  # memories filled and warm-up, one at a time
        ask(impl, "fill")
    live = [i for i in impls if i not in failed]
    for k in range(steps):
        order = live[k % len(live) :] + live[: k % len(live)] if live else []
        for impl in order:
            if impl not in failed:
                ask(impl, "step")
    out = {}
    for impl in impls:
        p = procs[impl]
        if impl not in failed:
            try:
                p.stdin.write("quit\n")
                p.stdin.flush()
            except (BrokenPipeError, OSError):
                pass
        try:
            _, err = p.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            p.kill()
            _, err = p.communicate()
        f = Path(tmp) / f"{impl}.json"
        if impl in failed or not f.exists():
            out[impl] = {"error": failed.get(impl) or (err or "no output").strip().splitlines()[-1][:400]}
        else:
            out[impl] = json.loads(f.read_text())
    return out


def python_for(impl: str, a) -> str:
    if a.python:
        return a.python
    if impl in PEERS or VENV_PY.exists():
        return str(VENV_PY) if VENV_PY.exists() else sys.executable
    return sys.executable


def fmt(x, spec=".0f", none="–") -> str:
    return none if x is None else format(x, spec)


def get(d: dict, *path):
    for k in path:
        if not isinstance(d, dict) or k not in d:
            return None
        d = d[k]
    return d


def derive(res: dict, w: workloads.Workload) -> None:
    """MFU per phase (against the matmul rate of the member's precision) and the ratios the issue sets targets for:
    per precision (``targets``: fp32, ``targets_bf16``), and with every implementation at its faster precision
    (``targets_best``) where more than one was measured."""
    rates = {"fp32": res["matmul"]["gflops"] * 1e9}
    if get(res, "matmul_bf16", "gflops"):
        rates["bf16"] = res["matmul_bf16"]["gflops"] * 1e9
    for name, r in res["impls"].items():
        rate = rates.get(split_key(name)[1])
        if rate is None or not math.isfinite(rate):
            continue
        for phase in ("train", "eval"):
            ph = r.get(phase) or {}
            if ph.get("min_s"):
                ph["tokens_per_s_best"] = ph["tokens_per_step"] / ph["min_s"]
        for phase, flops in (
            ("train", workloads.train_flops_per_token(w)),
            ("eval", workloads.forward_flops_per_token(w)),
        ):
            tps = get(r, phase, "tokens_per_s")
            if tps:
                r[phase]["model_tflops_per_token"] = flops / 1e12
                r[phase]["achieved_gflops"] = flops * tps / 1e9
                r[phase]["mfu"] = flops * tps / rate
    precisions = sorted({split_key(k)[1] for k in res["impls"]}, key=lambda p: p != "fp32")
    for precision in precisions:
        view = {split_key(k)[0]: r for k, r in res["impls"].items() if split_key(k)[1] == precision}
        res["targets" if precision == "fp32" else f"targets_{precision}"] = targets(view)
    if len(precisions) > 1:
        best: dict[str, dict] = {}
        for key, r in res["impls"].items():  # each implementation at the precision of its faster training step
            impl, precision = split_key(key)
            speed = get(r, "train", "tokens_per_s") or get(r, "eval", "tokens_per_s") or 0
            if impl not in best or speed > best[impl][0]:
                best[impl] = (speed, precision, r)
        res["best_precision"] = {impl: p for impl, (speed, p, _) in best.items() if speed}  # measured ones only
        res["targets_best"] = targets({impl: r for impl, (_, _, r) in best.items()})
    res["backend_targets"] = backend_targets(res["impls"])


def targets(impls: dict[str, dict]) -> dict:
    """The target ratios among ``impls`` (implementation name -> its results, all in one precision or each at its
    best)."""
    ours = impls.get("ours", {})
    t = {}

    def best_peer(path, peers=SHIPPED_PEERS, lowest=False):
        vals = [(get(impls.get(p, {}), *path), p) for p in peers]
        vals = [(v, p) for v, p in vals if v]
        if not vals:
            return None, None
        return (min if lowest else max)(vals)

    def ratio(target, value, ref, ref_name, goal, higher=True, note=""):
        if value is None or ref is None:
            t[target] = {"met": None, "note": "not measured"}
            return
        rv = value / ref
        t[target] = {
            "value": rv,
            "goal": goal,
            "vs": ref_name,
            "met": rv >= goal if higher else rv <= goal,
            "note": note,
        }
        # the same ratio from each side's fastest step (less sensitive to outside load)
        if target.startswith(("train", "eval")) and ref_name:
            phase = target.split("_")[0]
            a_, b_ = get(ours, phase, "tokens_per_s_best"), get(impls.get(ref_name, {}), phase, "tokens_per_s_best")
            if a_ and b_:
                t[target]["value_best_step"] = a_ / b_

    v, p = best_peer(("train", "tokens_per_s"))
    ratio(
        "train_vs_fastest_peer",
        get(ours, "train", "tokens_per_s"),
        v,
        p,
        1.4,
        note="lucidrains as shipped freezes its k/v weights (cheaper step)",
    )
    v2, p2 = best_peer(("train", "tokens_per_s"), peers=PEERS)
    ratio("train_vs_fastest_peer_incl_fixed", get(ours, "train", "tokens_per_s"), v2, p2, 1.4)
    ratio(
        "train_vs_ours_txl",
        get(ours, "train", "tokens_per_s"),
        get(impls.get("ours_txl", {}), "train", "tokens_per_s"),
        "ours_txl",
        0.9,
    )
    v, p = best_peer(("eval", "tokens_per_s"))
    ratio("eval_vs_fastest_peer", get(ours, "eval", "tokens_per_s"), v, p, 1.6)
    for phase in ("train", "eval"):
        v, p = best_peer((phase, "peak_rss_mb"), lowest=True)
        ratio(f"peak_rss_{phase}_vs_lowest_peer", get(ours, phase, "peak_rss_mb"), v, p, 1.0, higher=False)
    pp = get(ours, "generate", "per_prompt") or []
    if len(pp) >= 2:
        growth = pp[-1]["ms_per_token_median"] / pp[0]["ms_per_token_median"]
        t["generation_cost_constant"] = {
            "value": growth,
            "goal": 1.15,
            "met": growth <= 1.15,
            "note": f"median ms/token after {pp[-1]['prompt']} vs after {pp[0]['prompt']} tokens",
        }
    for peer in SHIPPED_PEERS:
        ref = get(impls.get(peer, {}), "generate", "long", "tokens_per_s")
        ratio(f"generation_vs_{peer}", get(ours, "generate", "long", "tokens_per_s"), ref, peer, 10.0)
        if "ours_compiled" in impls:
            ratio(
                f"generation_compiled_vs_{peer}",
                get(impls["ours_compiled"], "generate", "long", "tokens_per_s"),
                ref,
                peer,
                10.0,
                note="decoder step under torch.compile; its compilation is in the warm-up (first_call_s)",
            )
    mfu = get(ours, "train", "mfu")
    if mfu is not None:
        t["train_mfu"] = {"value": mfu, "goal": 0.75, "met": mfu >= 0.75}
    return t


def markdown(res: dict, w: workloads.Workload) -> str:
    m = res["matmul"]
    lines = [
        f"### Workload `{w.name}` — {res['date']}",
        "",
        f"Machine: {res['machine']['cpu']} ({res['machine']['nproc']} cores visible), torch {res['torch']}, "
        f"{res['threads']} threads, {', '.join(res.get('precisions', ['fp32']))}. "
        f"Load average at start/end: {res['load_start']} / {res['load_end']}. "
        f"Matmul rate (fp32 {m['n']}x{m['n']} `torch.mm`, median): {m['gflops']:.1f} GFLOP/s "
        f"(before {m['before']:.1f}, after {m['after']:.1f}).",
        "",
        *bf16_lines(res),
        f"d_model {w.d_model}, {w.n_layers} layers, {w.n_heads} heads, FFN {w.d_ff}, vocab {w.vocab}, "
        f"n_s {w.seg_len}, n_m {w.mem_len}, n_cm {w.cmem_len}, c {w.rate}, batch {w.batch}; "
        f"ours_txl: n_m {w.mem_len + w.cmem_len}, n_cm 0. Medians over {res['steps']} steps after "
        f"{w.fill_segments} memory-filling + {res['warmup']} warm-up steps; "
        + (
            "train/eval steps of all implementations interleaved (step k of each before step k+1 of any); "
            if res.get("interleave")
            else ""
        )
        + f"{res['rounds']} round(s) ({res['gen_rounds']} with generation), median round. "
        f"Generation batch {w.gen_batch}.",
        "",
    ]
    prompts = list(w.gen_prompts)
    head = [
        "impl",
        "params",
        "train tok/s (best step)",
        "train MFU",
        "eval tok/s (best step)",
        "eval MFU",
        "peak RSS train MB",
        "peak RSS eval MB",
    ]
    if prompts:
        head += [f"gen ms/tok after {p} (median; mean)" for p in prompts] + [f"gen tok/s ({w.gen_long} new)"]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, r in res["impls"].items():
        row = [f"{name}", fmt(r.get("param_count"), ",")]
        for phase in ("train", "eval"):
            ph = r.get(phase, {})
            if "error" in ph:
                row += ["error", ""]
            else:
                best = ph.get("tokens_per_s_best")
                row += [
                    fmt(ph.get("tokens_per_s")) + (f" ({best:.0f})" if best else ""),
                    fmt(ph.get("mfu") and 100 * ph["mfu"], ".1f") + ("%" if ph.get("mfu") else ""),
                ]
        row += [fmt(get(r, "train", "peak_rss_mb")), fmt(get(r, "eval", "peak_rss_mb"))]
        if prompts:
            pp = {x["prompt"]: x for x in get(r, "generate", "per_prompt") or []}
            row += [
                f"{fmt(get(pp, p, 'ms_per_token_median'), '.1f')}; {fmt(get(pp, p, 'ms_per_token_mean'), '.1f')}"
                if p in pp
                else "–"
                for p in prompts
            ]
            row += [fmt(get(r, "generate", "long", "tokens_per_s"), ".1f")]
        lines.append("| " + " | ".join(row) + " |")
    lines.append("")
    notes = []
    for name, r in res["impls"].items():
        for phase in ("train", "eval", "generate"):
            if "error" in r.get(phase, {}):
                notes.append(f"- `{name}` {phase}: error `{r[phase]['error']}`")
        if get(r, "train", "frozen_kv_layers"):
            notes.append(
                f"- `{name}`: {r['train']['frozen_kv_layers']}/{w.n_layers} layers had `to_kv.weight.requires_grad == False`"
                " during the timed steps (its in-place `detach_()`), so no k/v weight gradients were computed."
            )
    if notes:
        lines += ["Notes:", *notes, ""]
    titles = {
        "targets": "Targets, fp32",
        "targets_bf16": "Targets, bf16 autocast",
        "targets_best": "Targets, every implementation at its faster precision",
    }
    for name, title in titles.items():
        if res.get(name) and any(v.get("met") is not None for v in res[name].values()):  # not all "not measured"
            if len([n for n in titles if res.get(n)]) > 1:
                lines += [f"{title}:", ""]
            if name == "targets_best":
                lines += ["Faster precision: " + ", ".join(f"{i} {p}" for i, p in res["best_precision"].items()), ""]
            lines += target_table(res[name])
    lines += markdown_lines(res.get("backend_targets") or {}, long_memory=w.name == "long_memory")
    return "\n".join(lines)


def bf16_lines(res: dict) -> list[str]:
    """Whether the CPU has bf16 instructions and what bf16 buys on its matmuls: the context of every bf16 number."""
    m, cmp = res["machine"], res.get("matmul_precisions")
    if "bf16_flags" not in m:
        return []
    has = (
        f"has bf16 instructions ({', '.join(m['bf16_flags'])})"
        if m["bf16_flags"]
        else "has no bf16 instructions (bf16 is emulated)"
    )
    line = f"The CPU {has}."
    if cmp and cmp.get("bf16_gflops") and cmp.get("fp32_gflops"):
        line += (
            f" A {cmp['n']}x{cmp['n']} matmul: fp32 {cmp['fp32_gflops']:.1f} GFLOP/s, bf16 {cmp['bf16_gflops']:.1f} "
            f"GFLOP/s ({cmp['bf16_gflops'] / cmp['fp32_gflops']:.2f}x fp32)."
        )
    return [line, ""]


def target_table(targets_: dict) -> list[str]:
    lines = ["| target | measured (median) | goal | vs | met | from best steps |", "|---|---|---|---|---|---|"]
    for k, v in targets_.items():
        if v.get("met") is None:
            lines.append(f"| {k} | – | | | not measured | |")
            continue
        lines.append(
            f"| {k} | {v['value']:.3g} | {'<=' if k.startswith('peak') or k.startswith('generation_cost') else '>='} {v['goal']} "
            f"| {v.get('vs', '')} | {'yes' if v['met'] else 'NO'} | {fmt(v.get('value_best_step'), '.3g')} |"
        )
    return lines + [""]


def describe(phase: str, r: dict) -> str:
    if "error" in r:
        return "ERROR " + r["error"]
    if phase == "generate" and "long" in r:
        return f"gen tok/s={r['long']['tokens_per_s']:.1f}, ms/tok=" + ",".join(
            f"{x['ms_per_token_mean']:.2f}" for x in r["per_prompt"]
        )
    return ", ".join(
        f"{k}={r[k]:.4g}" for k in ("tokens_per_s", "median_s", "peak_rss_mb") if isinstance(r.get(k), (int, float))
    )


def pick_median(phase: str, rs: list[dict]) -> dict:
    """Of several rounds, the run with the median throughput (all rounds' throughputs kept beside it)."""
    ok = [r for r in rs if "error" not in r]
    if not ok:
        return rs[-1]
    key = (lambda r: r["long"]["tokens_per_s"]) if phase == "generate" else (lambda r: r["tokens_per_s"])
    ok.sort(key=key)
    best = dict(ok[(len(ok) - 1) // 2])
    if len(rs) > 1:
        best["rounds_tokens_per_s"] = [key(r) for r in ok]
        best["rounds_peak_rss_mb"] = [r.get("peak_rss_mb") for r in ok]
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", default="reference", choices=sorted(workloads.WORKLOADS))
    ap.add_argument("--impl", default="all", help=f"all, or a comma-separated subset of {', '.join(ALL)}")
    ap.add_argument("--phases", default="train,eval,generate")
    ap.add_argument("--steps", type=int, default=None, help="timed steps per phase (default: the workload's)")
    ap.add_argument("--warmup", type=int, default=None, help="warm-up steps after the memories are full")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=str(HERE / "results"))
    ap.add_argument(
        "--rounds", type=int, default=1, help="repeat every measurement round-robin; report the median round"
    )
    ap.add_argument(
        "--interleave",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="train/eval: all implementations alive at once, their timed steps interleaved (default)",
    )
    ap.add_argument("--gen-rounds", type=int, default=1, help="rounds that include the (slow) generation phase")
    ap.add_argument(
        "--one-process",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="all phases of an implementation in one child (default: only for the tiny smoke workload)",
    )
    ap.add_argument(
        "--report-only", default=None, metavar="JSON", help="rebuild targets and markdown from a results JSON"
    )
    ap.add_argument(
        "--python", default=None, help="interpreter for the children (default: benchmarks/.venv-peers if present)"
    )
    ap.add_argument(
        "--precisions", default="fp32", help="comma-separated: fp32 and/or bf16 (torch.autocast around every step)"
    )
    ap.add_argument(
        "--backends",
        default="",
        help="comma-separated model.attn_impl values: each of our implementations once per backend (ours+flex, ...)",
    )
    a = ap.parse_args()

    if a.report_only:
        res = json.loads(Path(a.report_only).read_text())
        spec = dict(res["workload"])
        w = workloads.Workload(spec.pop("name"), **{k: tuple(v) if isinstance(v, list) else v for k, v in spec.items()})
        res.setdefault("gen_rounds", 1)
        derive(res, w)
        md = markdown(res, w)
        Path(a.report_only).write_text(json.dumps(res, indent=1))
        Path(a.report_only).with_suffix(".md").write_text(md + "\n")
        print(md)
        return
    w = workloads.get(a.workload)
    impls = list(ALL) if a.impl == "all" else [s.strip() for s in a.impl.split(",") if s.strip()]
    impls = expand(impls, [b.strip() for b in a.backends.split(",") if b.strip()], OURS)
    for i in impls:
        if base(i) not in ALL:
            raise SystemExit(f"unknown impl {i!r}; use all or some of {', '.join(ALL)}")
    precisions = [p.strip() for p in a.precisions.split(",") if p.strip()]
    for p in precisions:
        if p not in PRECISIONS:
            raise SystemExit(f"unknown precision {p!r}; use fp32 and/or bf16")
    phases = [p for p in a.phases.split(",") if p]
    if not w.train:
        phases = [p for p in phases if p != "train"]
    if not w.gen_prompts:
        phases = [p for p in phases if p != "generate"]

    import torch

    res = {
        "workload": w.to_dict(),
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": machine_info(),
        "code": code_state(),
        "torch": torch.__version__,
        "threads": a.threads,
        "load_start": loadavg(),
        "steps": w.steps if a.steps is None else a.steps,
        "warmup": w.warmup if a.warmup is None else a.warmup,
        "rounds": a.rounds,
        "interleave": a.interleave,
        "gen_rounds": min(a.gen_rounds, a.rounds),
        "precisions": precisions,
        "impls": {},
    }
    py0 = python_for("ours", a)
    print(
        f"[bench] {w.name}: impls {impls}, precisions {precisions}, phases {phases}, load {res['load_start']}",
        flush=True,
    )
    mm_runs = [child(py0, "matmul", "matmul", w.name, a)]
    res["matmul_precisions"] = matmul_precisions(py0, w, a)
    one_process = a.one_process if a.one_process is not None else w.name == "tiny"
    keys = {member_key(i, p): (i, p) for p in precisions for i in impls}  # every implementation in every precision
    runs: dict[str, dict[str, list[dict]]] = {key: {p: [] for p in phases} for key in keys}
    meta: dict[str, dict] = {key: {} for key in keys}
    if a.interleave and not one_process:
        for phase in [p for p in phases if p in ("train", "eval")]:
            members = [
                (key, i, w.name, PRECISIONS[p])
                for key, (i, p) in keys.items()
                if phase in allowed_phases(i, phases, ONLY_PHASES)
            ]
            t0 = time.perf_counter()
            for impl, r in interleaved(members, phase, w, a).items():
                runs[impl][phase].append(r)
                for k in ("label", "param_count", "config", "loaded_packages"):
                    if k in r:
                        meta[impl][k] = r[k]
                print(
                    f"[bench] interleaved {impl:17s} {phase:8s} {time.perf_counter() - t0:6.1f}s  {describe(phase, r)}",
                    flush=True,
                )
        phases_seq = [p for p in phases if p not in ("train", "eval")]
    else:
        phases_seq = phases
    for rnd in range(
        a.rounds if phases_seq else 0
    ):  # round-robin, so a burst of outside load hits every implementation alike
        for key, (impl, precision) in keys.items():
            py = python_for(impl, a)
            mine = [
                p
                for p in phases_seq
                if p in allowed_phases(impl, phases, ONLY_PHASES) and (p != "generate" or rnd < a.gen_rounds)
            ]
            todo = [("all", mine)] if one_process else [(p, [p]) for p in mine]
            for run_phase, covered in todo:
                t0 = time.perf_counter()
                out = child(py, impl, run_phase, w.name, a, extra=("--amp", PRECISIONS[precision]))
                for k in ("label", "param_count", "config", "loaded_packages"):
                    if k in out:
                        meta[key][k] = out[k]
                for phase in covered:
                    r = out.get(phase, out) if run_phase == "all" and "error" not in out else out
                    runs[key][phase].append(r)
                    print(
                        f"[bench] r{rnd} {key:17s} {phase:8s} {time.perf_counter() - t0:6.1f}s  {describe(phase, r)}",
                        flush=True,
                    )
        if a.rounds > 1:
            mm_runs.append(child(py0, "matmul", "matmul", w.name, a))
    mm_runs.append(child(py0, "matmul", "matmul", w.name, a))
    for key in keys:
        res["impls"][key] = {**meta[key], **{p: pick_median(p, rs) for p, rs in runs[key].items() if rs}}
    g = [m["gflops_median"] for m in mm_runs if "gflops_median" in m]
    res["matmul"] = {
        "n": mm_runs[0].get("size", w.matmul_n),
        "before": g[0] if g else float("nan"),
        "after": g[-1] if g else float("nan"),
        "gflops": max(g) if g else float("nan"),
        "runs": mm_runs,
        "note": "MFU uses the largest median of the runs (the least-disturbed measurement)",
    }
    if "bf16" in precisions:  # bf16 members' MFU is against the bf16 rate at the same size
        mm = child(py0, "matmul", "matmul", w.name, a, extra=("--matmul-dtype", "bfloat16"))
        res["matmul_bf16"] = {
            "n": mm.get("size", w.matmul_n),
            "gflops": mm.get("gflops_median", float("nan")),
            "runs": [mm],
        }
    res["load_end"] = loadavg()
    res["flops"] = {
        "matmul_params": workloads.matmul_params(w),
        "train_per_token": workloads.train_flops_per_token(w),
        "forward_per_token": workloads.forward_flops_per_token(w),
    }
    derive(res, w)
    workloads.write_report(Path(a.out), w.name, res, markdown(res, w).splitlines())


if __name__ == "__main__":
    main()
