"""GPU benchmark: ours and the peers on one CUDA device, in fp32 and under bf16 autocast, each in its own process.

    python -m benchmarks.gpu --workload gpu                      # the GPU-sized workload (d 512, 8 layers, n_s 512)
    python -m benchmarks.gpu --workload reference --amp none     # the CPU reference workload on the GPU
    python -m benchmarks.gpu --workload tiny --device cpu --impl ours,ours_txl --out /tmp/g   # smoke run, no GPU

For every implementation and precision one child (``child.py --phase all --device cuda --amp ...``) measures
training and evaluation tokens/s (median step after the memories are full and a warm-up), the CUDA allocator's
peak in each phase, and generation's cost per token. MFU is against the same device's measured ``torch.mm`` rate
in the step's precision (fp32 without TF32, or bf16). ``ours+compile`` is our model with its training
step under ``torch.compile`` as ``train.compile = true`` runs it (evaluation stays eager, as the trainer's does);
``ours+<backend>`` and ``ours+<backend>+compile`` the same with ``model.attn_impl = <backend>`` (every attention
backend, eager and compiled). Writes ``<out>/<workload>.json`` and ``.md``.

Without a GPU the whole run is one command on the CPU (``--device cpu``, what tests/test_benchmark_gpu.py runs with
``TORCHDYNAMO_DISABLE=1`` so that nothing compiles), so that on a GPU machine running it is all that is left:

    python -m benchmarks.gpu --workload gpu --out benchmarks/results/gpu
"""

from __future__ import annotations

import argparse
import datetime as dt
import time
from pathlib import Path

from benchmarks import workloads
from benchmarks.bench import SHIPPED_PEERS, child, fmt, get, machine_info, python_for
from compressive_transformer.core.kernels import KERNELS
from compressive_transformer.runs.provenance import code_state

HERE = Path(__file__).resolve().parent

# key -> (adapter, build keywords)
ENTRIES = {
    "ours": ("ours", {}),
    "ours+compile": ("ours", {"compile": True}),
    "ours+graphs": ("ours", {"graphs": True}),
    **{f"ours+{b}": ("ours", {"attn_impl": b}) for b in KERNELS},
    **{f"ours+{b}+graphs": ("ours", {"attn_impl": b, "graphs": True}) for b in KERNELS},
    **{f"ours+{b}+compile": ("ours", {"attn_impl": b, "compile": True}) for b in KERNELS},
    "ours_txl": ("ours_txl", {}),
    "ours_txl+graphs": ("ours_txl", {"graphs": True}),
    "lucidrains": ("lucidrains", {}),
    "lucidrains_fixed": ("lucidrains_fixed", {}),
    "labml": ("labml", {}),
}
MATMUL_DTYPE = {"none": "float32", "bf16": "bfloat16"}


def mfu(tokens_per_s: float | None, flops_per_token: float, gflops: float | None) -> float | None:
    if not tokens_per_s or not gflops:
        return None
    return tokens_per_s * flops_per_token / (gflops * 1e9)


def ratios(res: dict) -> list[str]:
    """Ours against the fastest shipped peer and against our Transformer-XL, per precision and phase."""
    lines = []
    for amp, runs in res["runs"].items():
        for phase in ("train", "eval"):
            tps = {k: get(r, phase, "tokens_per_s") for k, r in runs.items()}
            peers = {k: v for k, v in tps.items() if k in SHIPPED_PEERS and v}
            best = max(peers, key=peers.get) if peers else None
            for mine in [k for k in runs if k == "ours" or k.startswith("ours+")]:
                if tps.get(mine) and best:
                    lines.append(
                        f"- {amp}, {phase}: {mine} = {tps[mine] / peers[best]:.2f}x {best}"
                        + (f", {tps[mine] / tps['ours_txl']:.2f}x ours_txl" if tps.get("ours_txl") else "")
                    )
    return lines


def markdown(res: dict, w: workloads.Workload) -> str:
    prompts = list(w.gen_prompts)
    head = [
        "implementation",
        "precision",
        "params",
        "train tok/s",
        "train MFU",
        "eval tok/s",
        "eval MFU",
        "peak GPU MiB train / eval",
        *[f"ms/token after {p}" for p in prompts],
        f"gen tok/s ({w.gen_long} new)",
    ]
    lines = [
        f"## GPU, workload `{w.name}` ({res['date']}, {res['gpu']}, torch {res['torch']})",
        "",
        f"d_model {w.d_model}, {w.n_layers} layers, {w.n_heads} heads, d_ff {w.d_ff}, n_s {w.seg_len}, n_m {w.mem_len}, "
        f"n_cm {w.cmem_len}, c {w.rate}, batch {w.batch}; medians of {res['steps']} steps. Matmul rate "
        + ", ".join(f"{k}: {v:.0f} GFLOP/s" for k, v in res["matmul_gflops"].items())
        + ".",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for amp, runs in res["runs"].items():
        rate = res["matmul_gflops"].get(MATMUL_DTYPE.get(amp, ""))
        for key, r in runs.items():
            if "error" in r:
                lines.append(f"| {key} | {amp} | ERROR: {r['error'][:120]} |" + " |" * (len(head) - 3))
                continue
            gen = {p["prompt"]: p["ms_per_token_mean"] for p in get(r, "generate", "per_prompt") or []}
            cells = [
                key,
                amp,
                f"{r.get('param_count', 0) / 1e6:.2f} M",
                fmt(get(r, "train", "tokens_per_s")),
                fmt(mfu(get(r, "train", "tokens_per_s"), res["flops"]["train_per_token"], rate), ".1%"),
                fmt(get(r, "eval", "tokens_per_s")),
                fmt(mfu(get(r, "eval", "tokens_per_s"), res["flops"]["forward_per_token"], rate), ".1%"),
                f"{fmt(get(r, 'train', 'peak_cuda_mb'))} / {fmt(get(r, 'eval', 'peak_cuda_mb'))}",
                *[fmt(gen.get(p), ".2f") for p in prompts],
                fmt(get(r, "generate", "long", "tokens_per_s"), ".0f"),
            ]
            lines.append("| " + " | ".join(cells) + " |")
    lines += ["", *ratios(res)]
    if any(get(r, "train", "frozen_kv_layers") for runs in res["runs"].values() for r in runs.values()):
        lines += [
            "",
            "compressive-transformer-pytorch as shipped freezes its key/value weights after the first "
            "compression (`lucidrains`), which makes its training step cheaper; `lucidrains_fixed` trains them.",
        ]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", default="gpu", choices=sorted(workloads.WORKLOADS))
    ap.add_argument("--impl", default=",".join(ENTRIES), help=f"comma-separated subset of {', '.join(ENTRIES)}")
    ap.add_argument("--amp", default="none,bf16", help="comma-separated precisions: none (fp32) and/or bf16")
    ap.add_argument("--device", default="cuda")
    ap.add_argument(
        "--phase", default="all", choices=("all", "train", "eval", "generate"), help="what each child measures"
    )
    ap.add_argument("--steps", type=int, default=None, help="timed steps per phase (default: the workload's)")
    ap.add_argument("--warmup", type=int, default=None)
    ap.add_argument("--threads", type=int, default=4, help="CPU threads of each child (they launch the kernels)")
    ap.add_argument(
        "--python", default=None, help="interpreter for the children (default: benchmarks/.venv-peers if present)"
    )
    ap.add_argument("--out", default=str(HERE / "results" / "gpu"))
    ap.add_argument("--name", default=None, help="stem of the report files (default: the workload's name)")
    a = ap.parse_args()
    w = workloads.get(a.workload)
    keys = [k.strip() for k in a.impl.split(",") if k.strip()]
    amps = [x.strip() for x in a.amp.split(",") if x.strip()]
    for k in keys:
        if k not in ENTRIES:
            raise SystemExit(f"unknown --impl {k!r}; use some of {', '.join(ENTRIES)}")
    for amp in amps:
        if amp not in MATMUL_DTYPE:
            raise SystemExit(f"unknown --amp {amp!r}; use none and/or bf16")

    import torch

    cuda = torch.device(a.device).type == "cuda"
    if cuda and not torch.cuda.is_available():
        raise SystemExit(f"--device {a.device}: no CUDA device here; use --device cpu for a smoke run of this harness")
    dev = ("--device", a.device)
    py0 = python_for("ours", a)
    res = {
        "workload": w.to_dict(),
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": machine_info(),
        "code": code_state(),
        "gpu": torch.cuda.get_device_name(a.device) if cuda else "cpu",
        "torch": torch.__version__,
        "steps": w.steps if a.steps is None else a.steps,
        "matmul_gflops": {},
        "runs": {},
        "flops": {
            "train_per_token": workloads.train_flops_per_token(w),
            "forward_per_token": workloads.forward_flops_per_token(w),
        },
    }
    for amp in amps:
        m = child(py0, "matmul", "matmul", w.name, a, extra=(*dev, "--matmul-dtype", MATMUL_DTYPE[amp]))
        res["matmul_gflops"][MATMUL_DTYPE[amp]] = m.get("gflops_median")
        print(f"[gpu] matmul {MATMUL_DTYPE[amp]}: {m.get('gflops_median', m.get('error'))}", flush=True)
    for amp in amps:
        res["runs"][amp] = {}
        for key in keys:
            impl, build_kw = ENTRIES[key]
            t0 = time.perf_counter()
            r = child(python_for(impl, a), impl, a.phase, w.name, a, build_kw, extra=(*dev, "--amp", amp))
            if a.phase != "all" and "error" not in r:  # one phase: its numbers where "all" puts them
                r[a.phase] = {k: v for k, v in r.items() if k not in ("config", "label", "param_count")}
            res["runs"][amp][key] = r
            summary = (
                r.get("error")
                or f"train {fmt(get(r, 'train', 'tokens_per_s'))} tok/s, eval {fmt(get(r, 'eval', 'tokens_per_s'))} tok/s"
            )
            print(f"[gpu] {amp:4s} {key:17s} {time.perf_counter() - t0:6.1f}s  {summary}", flush=True)
            workloads.write_report(Path(a.out), a.name or w.name, res, markdown(res, w).splitlines(), echo=False)
    workloads.write_report(Path(a.out), a.name or w.name, res, markdown(res, w).splitlines())


if __name__ == "__main__":
    main()
