"""Markdown of the seeded long-range experiment, with the ordering of the compression cells set beside the paper's.

The paper's ablation (seed ``001``: enwik8, validation bits per character, lower is better) ranks seven cells. Here
a cell is ranked by its mean passkey-style accuracy over seeds (higher is better); the table shows both orderings
side by side and Spearman's rank correlation over the cells both hold, and it marks which of our neighbours in the
ranking are separated by their intervals at all, so no ordering is read into overlapping intervals.
"""

from __future__ import annotations

from typing import Any

# (compression fn, compression loss, enwik8 validation BPC), best first: seed 001, "Compression approaches on Enwik8".
PAPER_ABLATION: tuple[tuple[str, str, float], ...] = (
    ("conv", "attention", 0.973),
    ("dilated_conv", "attention", 0.977),
    ("most_used", "none", 0.980),
    ("mean_pool", "none", 0.982),
    ("conv", "autoencoder", 0.984),
    ("max_pool", "none", 0.986),
    ("conv", "bptt", 0.996),
)


def paper_rank() -> dict[str, int]:
    """Model name (``ct-<fn>-<loss>``) -> rank in the paper's table, 1 = best."""
    return {f"ct-{fn}-{loss}": i + 1 for i, (fn, loss, _) in enumerate(PAPER_ABLATION)}


def spearman(a: list[float], b: list[float]) -> float:
    """Spearman's rank correlation of two equally long lists without ties (ranks as given)."""
    n = len(a)
    if n < 2:
        return float("nan")
    return 1.0 - 6.0 * sum((x - y) ** 2 for x, y in zip(a, b)) / (n * (n * n - 1))


def _fmt(iv: dict[str, Any]) -> str:
    if iv["n"] == 0:
        return "-"
    return f"{iv['mean']:.3f}" if iv["half_width"] is None else f"{iv['mean']:.3f} ± {iv['half_width']:.3f}"


def _label(name: str, row: dict[str, Any]) -> str:
    if row["compression"] is None:
        return f"{name} (no compressed memory)"
    return f"{row['compression']} × {row['compression_loss']}"


def ordering_table(
    rows: dict[str, dict[str, Any]], *, metric: str = "accuracy", higher_is_better: bool = True
) -> list[str]:
    """Our cells (``ct-<fn>-<loss>`` -> compression, compression_loss and the interval ``all`` of ``metric``) ranked
    best first next to the paper's ranking; whether each is separated from the next by the intervals."""
    paper = paper_rank()
    sign = -1.0 if higher_is_better else 1.0
    cells = sorted((n for n in rows if rows[n]["compression"] is not None), key=lambda n: sign * rows[n]["all"]["mean"])
    lines = [
        f"| our rank | cell | {metric} (mean ± 95%) | separated from the next | paper rank | paper BPC |",
        "|---|---|---|---|---|---|",
    ]
    bpc = {f"ct-{fn}-{loss}": b for fn, loss, b in PAPER_ABLATION}
    for i, name in enumerate(cells):
        iv = rows[name]["all"]
        sep = "-"
        if i + 1 < len(cells):
            nxt = rows[cells[i + 1]]["all"]
            a, b = (iv["low"], nxt["high"]) if higher_is_better else (nxt["low"], iv["high"])
            sep = "yes" if a is not None and b is not None and a > b else "no"
        lines.append(
            f"| {i + 1} | {_label(name, rows[name])} | {_fmt(iv)} | {sep} | {paper.get(name, '-')} | {bpc.get(name, '-')} |"
        )
    shared = [n for n in cells if n in paper]
    ours = {n: i + 1 for i, n in enumerate(shared)}
    theirs = {n: i + 1 for i, n in enumerate(sorted(shared, key=paper.get))}
    rho = spearman([ours[n] for n in shared], [theirs[n] for n in shared])
    lines += [
        "",
        f"Spearman's rank correlation with the paper over the {len(shared)} cells both have: {rho:+.2f} "
        "(+1 the same order, -1 reversed); a neighbour not separated by its interval is not ordered by these seeds.",
    ]
    return lines


def study_ordering(results: dict[str, Any], *, metric: str = "bits_per_token", evaluation: str | None = None) -> str:
    """The ordering table for a ``compressive-transformer study`` of the ablation (``benchmarks/ablation``): its
    ``results.json`` ranked by ``metric`` (lower is better) on ``evaluation`` (default: the first on a test split)."""
    evaluations = list(results["metrics"])
    if not evaluations:
        raise ValueError("the study has no measured runs yet")
    evaluation = evaluation or next((e for e in evaluations if e.endswith("/test")), evaluations[0])
    rows = {}
    for name, variant in results["variants"].items():
        fn, _, loss = variant["compression"].partition(" + ")
        measured = results["metrics"][evaluation].get(name, {}).get(metric)
        if loss and measured is not None:
            rows[f"ct-{fn}-{loss}"] = {"compression": fn, "compression_loss": loss, "all": measured["interval"]}
    lines = [
        f"# {results.get('title', 'ablation')}: the cells' ordering against the paper's",
        "",
        f"Ranked by {metric.replace('_', ' ')} on `{evaluation}` (lower is better), mean over seeds "
        f"{', '.join(map(str, results.get('seeds', [])))} with its 95% interval; the paper ranks by enwik8 "
        "validation bits per character.",
        "",
    ]
    return "\n".join(lines + ordering_table(rows, metric=metric.replace("_", " "), higher_is_better=False)) + "\n"


def render(summary: dict[str, Any]) -> str:
    seeds = ", ".join(map(str, summary["seeds"]))
    lines = [
        f"# Long-range tasks over seeds {seeds} (preset `{summary['preset']}`)",
        "",
        "Every model trained for the same number of steps; accuracy is the mean over seeds with its 95% Student-t "
        f"interval. Within / beyond: answers at most / more than {summary['txl_reach']} tokens back "
        "(Transformer-XL's reach at equal attention cost).",
        "",
    ]
    for task, rows in summary["tasks"].items():
        lines += [
            f"## {task}",
            "",
            "| model | steps | all | within | beyond | all − conv × attention (paired) |",
            "|---|---|---|---|---|---|",
        ]
        for name, row in sorted(rows.items(), key=lambda kv: -kv[1]["all"]["mean"]):
            diff = row.get("vs_baseline", {}).get("all")
            delta = _fmt(diff["interval"]) if diff else "-"
            lines.append(
                f"| {_label(name, row)} | {row['steps']} | {_fmt(row['all'])} | {_fmt(row['within'])} | "
                f"{_fmt(row['beyond'])} | {delta} |"
            )
        if sum(r["compression"] is not None for r in rows.values()) > 1:
            lines += ["", f"### ordering of the compression cells ({task}) against the paper's (enwik8 BPC)", ""]
            lines += ordering_table(rows)
        lines.append("")
    if summary.get("command"):
        lines += ["Produced by:", "", f"    {summary['command']}", ""]
    return "\n".join(lines)


__all__ = ["PAPER_ABLATION", "ordering_table", "paper_rank", "render", "spearman", "study_ordering"]
