"""Rendering the long-range experiment's results: accuracy-by-distance plots and markdown tables."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from compressive_transformer.analysis.plots import plot_accuracy_by_distance
from compressive_transformer.core.fileio import write_text_atomic


def write_long_range_outputs(out: Path, results: dict[str, Any], order: Sequence[str] = ()) -> None:
    """The plots (one per task: accuracy against distance with each model's range) and the markdown tables; models
    in ``order`` first, in that order."""
    for task, entries in _by_task(results, order).items():
        main = [e for e in entries if not e["name"].startswith("ct-")]
        if main:
            plot_accuracy_by_distance(
                main, out / f"{task}.png", title=f"{task}: equal attention cost", binned=binned(task)
            )
        cells = [e for e in entries if e["name"].startswith("ct-")]
        if cells:
            plot_accuracy_by_distance(
                cells + [e for e in main if e["name"] == "txl"],
                out / f"{task}_ablation.png",
                title=f"{task}: compression fn x loss",
                binned=binned(task),
            )
    write_text_atomic(out / "results.md", results_markdown(results, order))


def binned(task: str) -> bool:
    """Recall and copy answers spread over many distances: tables and plots pool them per segment-wide bin."""
    return task != "passkey"


def split_accuracy(entry: dict[str, Any], txl_reach: int) -> tuple[float, float]:
    """Mean accuracy over answers within / beyond ``txl_reach``."""
    within, beyond = [0, 0], [0, 0]
    for d, (ok, n) in entry["counts"].items():
        side = within if int(d) <= txl_reach else beyond
        side[0] += ok
        side[1] += n
    return (within[0] / within[1] if within[1] else float("nan"), beyond[0] / beyond[1] if beyond[1] else float("nan"))


def _by_task(results: dict[str, Any], order: Sequence[str]) -> dict[str, list[dict[str, Any]]]:
    """Runs per task, the models of ``order`` first in that order, then the others as the file has them."""
    rank = {name: i for i, name in enumerate(order)}
    by_task: dict[str, list[dict[str, Any]]] = {}
    for e in sorted(results.get("runs", []), key=lambda e: rank.get(e["name"], len(rank))):
        by_task.setdefault(e["task"], []).append(e)
    return by_task


def results_markdown(results: dict[str, Any], order: Sequence[str] = ()) -> str:
    """Accuracy-by-distance tables per task and the ablation table (compression fn x loss)."""
    lines = [
        f"# Long-range tasks at equal attention cost (preset `{results.get('preset')}`, seed {results.get('seed')})",
        "",
    ]
    by_task = _by_task(results, order)
    for task, entries in by_task.items():
        key = "accuracy_binned" if binned(task) else "accuracy"
        dists = sorted({int(d) for e in entries for d in e[key]})
        lines += [
            f"## {task}",
            "",
            "accuracy by distance" + (" (bins of one segment, centres shown)" if key == "accuracy_binned" else ""),
            "",
        ]
        lines.append(
            "| model | attention cost | max range l(n_m + c n_cm) | steps | " + " | ".join(str(d) for d in dists) + " |"
        )
        lines.append("|---|---|---|---|" + "---|" * len(dists))
        for e in entries:
            m = e["model"]
            row = [e["name"], str(m["attention_cost"]), str(m["max_range"]), str(e["train"]["steps"])]
            row += [f"{e[key][str(d)]:.2f}" if str(d) in e[key] else "" for d in dists]
            lines.append("| " + " | ".join(row) + " |")
        lines.append("")
        cells = [e for e in entries if e["name"].startswith("ct-")]
        txl = next((e for e in entries if e["name"] == "txl"), None)
        main_ct = next((e for e in entries if e["name"] == "ct"), None)
        if cells and main_ct and not any(e["name"] == "ct-conv-attention" for e in cells):
            cells.append(main_ct)  # the main model is the conv x attention cell (at its own, larger budget)
        if cells:
            reach = txl["model"]["max_range_last_position"] if txl else cells[0]["model"]["seg_len"] * 5 - 1
            lines += [
                f"### ablation: compression fn x loss ({task})",
                "",
                f"accuracy on answers within / beyond Transformer-XL's reach ({reach} tokens back from the answer)",
                "",
                "| compression fn | compression loss | within | beyond | all | steps |",
                "|---|---|---|---|---|---|",
            ]
            for e in cells + ([txl] if txl else []):
                w, b = split_accuracy(e, reach)
                fn = e["model"]["compression"] or "(Transformer-XL, n_m = 2k)"
                loss = e["model"]["compression_loss"] or "-"
                lines.append(
                    f"| {fn} | {loss} | {w:.2f} | {b:.2f} | {e['overall_accuracy']:.2f} | {e['train']['steps']} |"
                )
            lines.append("")
    commands = sorted({e["command"] for e in results.get("runs", [])})
    lines += ["Produced by:", ""] + [f"    {c}" for c in commands] + [""]
    return "\n".join(lines)


__all__ = ["binned", "results_markdown", "split_accuracy", "write_long_range_outputs"]
