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


def ordering_table(rows: dict[str, dict[str, Any]]) -> list[str]:
    """Our cells ranked by mean accuracy next to the paper's ranking; whether each is separated from the next."""
    paper = paper_rank()
    cells = sorted((n for n in rows if rows[n]["compression"] is not None), key=lambda n: -rows[n]["all"]["mean"])
    lines = ["| our rank | cell | accuracy (mean ± 95%) | separated from the next | paper rank | paper BPC |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    bpc = {f"ct-{fn}-{loss}": b for fn, loss, b in PAPER_ABLATION}
    for i, name in enumerate(cells):
        iv = rows[name]["all"]
        sep = "-"
        if i + 1 < len(cells):
            nxt = rows[cells[i + 1]]["all"]
            sep = "yes" if iv["low"] is not None and nxt["high"] is not None and iv["low"] > nxt["high"] else "no"
        lines.append(f"| {i + 1} | {_label(name, rows[name])} | {_fmt(iv)} | {sep} | {paper.get(name, '-')} | {bpc.get(name, '-')} |")
    shared = [n for n in cells if n in paper]
    ours = {n: i + 1 for i, n in enumerate(shared)}
    theirs = {n: i + 1 for i, n in enumerate(sorted(shared, key=paper.get))}
    rho = spearman([ours[n] for n in shared], [theirs[n] for n in shared])
    lines += ["", f"Spearman's rank correlation with the paper over the {len(shared)} cells both have: {rho:+.2f} "
              "(+1 the same order, -1 reversed); a neighbour not separated by its interval is not ordered by these seeds."]  # fmt: skip
    return lines


def render(summary: dict[str, Any]) -> str:
    seeds = ", ".join(map(str, summary["seeds"]))
    lines = [f"# Long-range tasks over seeds {seeds} (preset `{summary['preset']}`)", "",
             "Every model trained for the same number of steps; accuracy is the mean over seeds with its 95% Student-t "
             f"interval. Within / beyond: answers at most / more than {summary['txl_reach']} tokens back "
             "(Transformer-XL's reach at equal attention cost).", ""]  # fmt: skip
    for task, rows in summary["tasks"].items():
        lines += [f"## {task}", "", "| model | steps | all | within | beyond | all − conv × attention (paired) |",
                  "|---|---|---|---|---|---|"]  # fmt: skip
        for name, row in sorted(rows.items(), key=lambda kv: -kv[1]["all"]["mean"]):
            diff = row.get("vs_baseline", {}).get("all")
            delta = _fmt(diff["interval"]) if diff else "-"
            lines.append(f"| {_label(name, row)} | {row['steps']} | {_fmt(row['all'])} | {_fmt(row['within'])} | "
                         f"{_fmt(row['beyond'])} | {delta} |")  # fmt: skip
        if sum(r["compression"] is not None for r in rows.values()) > 1:
            lines += ["", f"### ordering of the compression cells ({task}) against the paper's (enwik8 BPC)", ""]
            lines += ordering_table(rows)
        lines.append("")
    if summary.get("command"):
        lines += ["Produced by:", "", f"    {summary['command']}", ""]
    return "\n".join(lines)


__all__ = ["PAPER_ABLATION", "ordering_table", "paper_rank", "render", "spearman"]
