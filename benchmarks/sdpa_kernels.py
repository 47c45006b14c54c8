"""Which kernel ``F.scaled_dot_product_attention`` runs with a float additive mask (the ``sdpa-bias`` backend's
positional bias), with and without a gradient into that mask, and whether the mask's gradient is the explicit one.

    python -m benchmarks.sdpa_kernels [--device cpu] [--out benchmarks/results/sdpa_kernels]

Each case runs once under torch.profiler; the kernel is the ``aten::_scaled_dot_product_*`` operator it records. The
gradients are compared with softmax(q kᵀ + bias) v written out in fp32 (bf16 cases: against the fp32 product of the
same bf16 values, so the difference is bf16 rounding). Seconds of CPU; writes ``<out>.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.profiler import profile

HERE = Path(__file__).resolve().parent


def case(device: str, dtype: torch.dtype, grad: bool, mask_grad: bool, B=2, H=4, T=64, K=192, dh=32) -> dict:
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, n, dh, generator=g).to(device, dtype).requires_grad_(grad) for n in (T, K, K))
    bias = torch.randn(B, H, T, K, generator=g).to(device, dtype).requires_grad_(mask_grad)
    with profile() as prof:
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=1.0)
        if grad:
            y.float().square().sum().backward()
    kernels = sorted({e.name for e in prof.events() if e.name.startswith("aten::_scaled_dot_product")})
    out = {"device": device, "dtype": str(dtype).removeprefix("torch."), "grad": grad, "mask_grad": mask_grad}
    out["kernels"] = kernels
    if grad:
        ref = [t.detach().float().requires_grad_() for t in (q, k, v, bias)]
        y_ref = torch.softmax(ref[0] @ ref[1].transpose(-1, -2) + ref[3], -1) @ ref[2]
        y_ref.square().sum().backward()
        out["max_abs_grad_error"] = {
            name: float((t.grad.float() - r.grad).abs().max()) for name, t, r in zip("qkv", (q, k, v), ref)
        }
        if mask_grad:
            out["max_abs_grad_error"]["mask"] = float((bias.grad.float() - ref[3].grad).abs().max())
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", type=Path, default=HERE / "results" / "sdpa_kernels")
    a = ap.parse_args()
    grads = ((False, False), (True, False), (True, True))  # none; into q, k, v; into q, k, v and the mask
    rows = [case(a.device, dt, g, m) for dt in (torch.float32, torch.bfloat16) for g, m in grads]
    lines = [
        f"SDPA with a float additive mask on {a.device}, torch {torch.__version__} (`python -m benchmarks.sdpa_kernels`)",
        "",
        "| dtype | gradients into | kernel | max abs gradient error q / k / v / mask (against explicit) |",
        "|---|---|---|---|",
    ]
    for r in rows:
        err = r.get("max_abs_grad_error")
        errs = " / ".join(f"{err[n]:.2g}" if n in err else "–" for n in ("q", "k", "v", "mask")) if err else "–"
        into = "q, k, v, mask" if r["mask_grad"] else "q, k, v" if r["grad"] else "nothing"
        lines.append(f"| {r['dtype']} | {into} | {', '.join(r['kernels'])} | {errs} |")
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.with_suffix(".json").write_text(json.dumps({"torch": torch.__version__, "cases": rows}, indent=1))
    a.out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
