"""Attention kernels as benchmark members: ``ours+explicit``, ``ours+sdpa-bias``, ``ours+fused`` (any of our
adapters, ``+`` a ``model.attn_impl``), and the table of the issue's targets per kernel.

    python -m benchmarks.bench --workload reference --impl ours,lucidrains,labml \\
        --backends explicit,sdpa-bias,reference --precisions fp32,bf16 --phases train,eval

The targets compare each backend with the shipped peers, in each precision and with every member at its faster
precision per phase (the issue's "each implementation's best precision").
"""

from __future__ import annotations

SEP = "+"
# The targets: (name, phase or metric, goal, higher is better)
GOALS = {
    "train_vs_lucidrains": 1.3,
    "eval_vs_lucidrains": 1.6,
    "peak_rss_train_vs_lucidrains": 0.9,
    "peak_rss_eval_vs_lucidrains": 0.9,
    "train_mfu": 0.5,
}
LONG_MEMORY_GOAL = 2.0  # evaluation with long memories (the long_memory workload), against lucidrains


def split_key(key: str) -> tuple[str, str]:
    """``"impl@bf16"`` -> ("impl", "bf16"); a key without a precision is fp32."""
    impl, _, precision = key.partition("@")
    return impl, precision or "fp32"


def backend_variant(impl: str, build_kw: dict) -> tuple[str, dict]:
    """The adapter module and its build() keywords of a member name: ``ours+fused`` -> ours, attn_impl = fused."""
    name, _, backend = impl.partition(SEP)
    return name, ({**build_kw, "attn_impl": backend} if backend else build_kw)


def base(impl: str) -> str:
    return impl.partition(SEP)[0]


def expand(impls: list[str], backends: list[str], ours: tuple[str, ...]) -> list[str]:
    """Every one of our adapters once per backend (peers unchanged); no backends: the list as it is."""
    if not backends:
        return impls
    return [f"{i}{SEP}{b}" if i in ours else i for i in impls for b in (backends if i in ours else [None])]


def allowed_phases(impl: str, phases, only: dict[str, tuple[str, ...]], device: str = "cpu") -> tuple[str, ...]:
    """The phases a member runs: its adapter's (``only``)."""
    return tuple(only.get(base(impl), phases))


def _value(r: dict, phase: str, key: str):
    v = (r.get(phase) or {}).get(key)
    return v if isinstance(v, (int, float)) else None


def backend_targets(impls: dict[str, dict], peer: str = "lucidrains") -> dict[str, dict[str, float | None]]:
    """Per backend member (``ours+X`` or ``ours+X@bf16``), and per backend at its faster precision per phase
    (``ours+X@best``, against the peer at its own): the ratios the issue sets targets for."""
    groups: dict[str, dict[str, dict]] = {}  # impl -> precision -> results
    for key, r in impls.items():
        impl, precision = split_key(key)
        groups.setdefault(impl, {})[precision] = r

    def best(rs: dict[str, dict], phase: str, key: str, lowest: bool = False):
        vals = [v for r in rs.values() if (v := _value(r, phase, key)) is not None]
        return (min if lowest else max)(vals) if vals else None

    ref = groups.get(peer, {})
    out: dict[str, dict[str, float | None]] = {}
    for impl, by_precision in groups.items():
        if SEP not in impl:
            continue
        views = {f"{impl}@{p}" if p != "fp32" else impl: ({p: r}, {p: ref.get(p, {})}) for p, r in by_precision.items()}
        if len(by_precision) > 1:
            views[f"{impl}@best"] = (by_precision, ref)
        for name, (ours, theirs) in views.items():

            def ratio(phase, key, lowest=False, ours=ours, theirs=theirs):
                a, b = best(ours, phase, key, lowest), best(theirs, phase, key, lowest)
                return a / b if a is not None and b else None

            out[name] = {
                "train_vs_lucidrains": ratio("train", "tokens_per_s"),
                "eval_vs_lucidrains": ratio("eval", "tokens_per_s"),
                "peak_rss_train_vs_lucidrains": ratio("train", "peak_rss_mb", lowest=True),
                "peak_rss_eval_vs_lucidrains": ratio("eval", "peak_rss_mb", lowest=True),
                "train_mfu": best(ours, "train", "mfu"),
            }
    return out


def markdown_lines(table: dict[str, dict[str, float | None]], *, long_memory: bool = False) -> list[str]:
    """The per-backend target table: each ratio, marked where it meets its goal."""
    if not table:
        return []
    goals = {"eval_vs_lucidrains": LONG_MEMORY_GOAL} if long_memory else GOALS
    cols = [k for k in goals if any(row.get(k) is not None for row in table.values())]

    def cell(k, v):
        if v is None:
            return "–"
        higher = not k.startswith("peak")
        met = v >= goals[k] if higher else v <= goals[k]
        return f"{v:.3g} {'(met)' if met else '(NOT met)'}"

    head = ["backend member", *[f"{k} ({'>=' if not k.startswith('peak') else '<='} {goals[k]})" for k in cols]]
    lines = ["Targets per attention backend (ratios within this interleaved run):", ""]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, row in table.items():
        lines.append("| " + " | ".join([name, *[cell(k, row.get(k)) for k in cols]]) + " |")
    return lines + [""]
