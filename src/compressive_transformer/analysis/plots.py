"""PNG plots of the analyses (matplotlib): pure inputs in, one file out, nothing shown on screen.

Figures are made with matplotlib's object API (:func:`subplots`), never through pyplot's global state, so importing
or calling this module leaves the backend and the figures of the process that uses it as they were."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from compressive_transformer.core.fileio import replace_file

if TYPE_CHECKING:
    from matplotlib.figure import Figure

REGION_COLORS = {"compressed": "#2ca02c", "memory": "#ff7f0e", "segment": "#1f77b4"}


def subplots(nrows: int = 1, ncols: int = 1, **kwargs: Any) -> tuple[Figure, Any]:
    """A figure of its own (no pyplot, no backend chosen) and its axes, as ``pyplot.subplots`` returns them;
    ``figsize`` and the other keywords of :class:`~matplotlib.figure.Figure` go to the figure, the rest to its grid."""
    fig_keys = {k: kwargs.pop(k) for k in ("figsize", "dpi", "constrained_layout") if k in kwargs}
    from matplotlib.figure import Figure  # on first use: matplotlib takes most of a second to import

    fig = Figure(**fig_keys)
    return fig, fig.subplots(nrows, ncols, **kwargs)


def save_figure(fig: Any, path: str | Path) -> Path:
    """Write ``fig`` to ``path`` (its format from the suffix, PNG without one), replacing a previous figure
    atomically: a report's plots are regenerated in place, never left torn."""
    path = Path(path)
    fig.tight_layout()
    return replace_file(path, lambda tmp: fig.savefig(tmp, dpi=110, format=path.suffix.lstrip(".") or "png"))


def plot_accuracy_by_distance(
    entries: Sequence[Mapping[str, Any]], path: str | Path, *, title: str = "", binned: bool = False
) -> Path:
    """Accuracy against distance, one line per model, with each model's theoretical range l x (n_m + c n_cm) as a
    dashed vertical line of the same colour, one layer's reach from the answer's position (n_m + c n_cm + n_s - 1)
    as a dotted one, and chance level as a grey dotted line."""
    fig, ax = subplots(figsize=(7.5, 4.2))
    key = "accuracy_binned" if binned else "accuracy"
    drawn: dict[int, Any] = {}
    for i, e in enumerate(entries):
        color = f"C{i}"
        acc = e[key]
        xs = sorted(int(d) for d in acc)
        name = e.get("name") or e["model"]["kind"]
        m = e["model"]
        label = f"{name} (n_m={m['mem_len']}, n_cm={m['cmem_len']}, cost {m['attention_cost']})"
        ax.plot(xs, [acc[str(x)] for x in xs], marker="o", color=color, label=label)
        r = int(m["max_range"])
        if r not in drawn:
            drawn[r] = ax.axvline(r, color=color, linestyle="--", alpha=0.8)
            ax.text(r, 0.5, f"range {r} ", color=color, fontsize=8, rotation=90, va="center", ha="right")
        one = m.get("single_layer_reach_last_position")
        if one is not None and int(one) not in drawn:  # what one layer's memory reaches from the probed position
            drawn[int(one)] = ax.axvline(int(one), color=color, linestyle=":", alpha=0.6)
    ax.plot([], [], color="black", linestyle="--", label="theoretical range l(n_m + c n_cm)")
    ax.plot([], [], color="black", linestyle=":", alpha=0.6, label="one layer's reach n_m + c n_cm + n_s - 1")
    values = entries[0].get("task_config", {}).get("n_values") if entries else None
    if values:
        ax.axhline(1.0 / values, color="grey", linestyle=":", label=f"chance (1/{values})")
    ax.set_xlabel("distance of the answer's information (tokens back)")
    ax.set_ylabel("accuracy")
    ax.set_ylim(-0.02, 1.45)
    ax.set_yticks([0.0, 0.2, 0.4, 0.6, 0.8, 1.0])
    ax.set_title(title)
    ax.legend(fontsize=7, loc="upper right")
    ax.grid(alpha=0.3)
    return save_figure(fig, path)


def plot_attention_regions(result: Mapping[str, Any], path: str | Path, *, title: str = "") -> Path:
    """Bar plot like the paper's Figure 3: average attention per bucket, oldest to newest, coloured by region;
    the layer average as bars and each layer as a thin line."""
    regions = [r for r in result["regions"] if r["buckets"] > 0]
    fig, ax = subplots(figsize=(8, 3.6))
    x, labels, colors, heights = 0, [], [], []
    positions = []
    for r in regions:
        for b in range(r["buckets"]):
            positions.append(x)
            heights.append(result["average"][r["name"]][b])
            colors.append(REGION_COLORS.get(r["name"], "grey"))
            labels.append(f"{r['name'][0]}{b + 1}")
            x += 1
        x += 0.5
    ax.bar(positions, [0.0 if h is None or h != h else h for h in heights], color=colors, alpha=0.85)
    for layer, per_layer in enumerate(result["layers"]):
        ys = [per_layer[r["name"]][b] for r in regions for b in range(r["buckets"])]
        ys = [float("nan") if y is None else y for y in ys]
        ax.plot(
            positions,
            ys,
            linewidth=0.8,
            alpha=0.6,
            color="black",
            marker=".",
            markersize=3,
            label=f"layer {layer}" if layer == 0 else None,
        )
    ax.set_xticks(positions)
    ax.set_xticklabels(labels, fontsize=7)
    ax.set_ylabel("average attention weight per slot")
    from matplotlib.patches import Rectangle

    handles = [Rectangle((0, 0), 1, 1, color=REGION_COLORS[r["name"]]) for r in regions if r["name"] in REGION_COLORS]
    ax.legend(handles + ax.get_legend_handles_labels()[0][:1], [r["name"] for r in regions] + ["per layer"], fontsize=8)
    ax.set_title(title or "attention by memory region (oldest -> newest)")
    return save_figure(fig, path)


def plot_compressibility(series: Mapping[str, Any], path: str | Path, *, title: str = "") -> Path:
    """Compression loss per layer against training step (from metrics.jsonl), and the held-out value per layer."""
    fig, axes = subplots(1, 2, figsize=(10, 3.6))
    steps, per_layer = series.get("steps", []), series.get("per_layer", [])
    for i, ys in enumerate(per_layer):
        axes[0].plot(steps, ys, label=f"layer {i}")
    axes[0].set_xlabel("step")
    axes[0].set_ylabel("compression loss")
    axes[0].set_title("during training")
    if any(any(y > 0 for y in ys) for ys in per_layer):
        axes[0].set_yscale("log")
    held = series.get("held_out", [])
    axes[1].bar(range(len(held)), held, color="C2")
    axes[1].set_xticks(range(len(held)))
    axes[1].set_xlabel("layer")
    axes[1].set_title("held-out stream")
    if per_layer:
        axes[0].legend(fontsize=7)
    fig.suptitle(title or "compressibility of layers")
    return save_figure(fig, path)


def plot_frequency_buckets(result: Mapping[str, Any], path: str | Path, *, title: str = "") -> Path:
    """Word perplexity per train-frequency bucket, side by side for each checkpoint (log scale)."""
    names = list(result["models"])
    buckets = [b["name"] for b in result["buckets"]] + ["all"]
    fig, ax = subplots(figsize=(8, 3.8))
    width = 0.8 / max(len(names), 1)
    for i, name in enumerate(names):
        ppl = [result["models"][name]["buckets"].get(b, {}).get("ppl", float("nan")) for b in buckets]
        ax.bar([j + i * width for j in range(len(buckets))], ppl, width=width, label=name)
    ax.set_xticks([j + width * (len(names) - 1) / 2 for j in range(len(buckets))])
    ax.set_xticklabels(buckets)
    ax.set_yscale("log")
    ax.set_ylabel("word perplexity")
    ax.set_xlabel("occurrences of the word in the train split")
    ax.legend(fontsize=8)
    ax.set_title(title or "perplexity by word frequency")
    return save_figure(fig, path)


def plot_temporal_range(result: Mapping[str, Any], path: str | Path, *, title: str = "") -> Path:
    """Effect of perturbing the input d tokens back on the final output, against d, with the theoretical range."""
    fig, ax = subplots(figsize=(7, 3.6))
    ds = result["distances"]
    ax.plot(ds, [max(e, 1e-12) for e in result["effects"]], marker=".")
    ax.axhline(result["tolerance"], color="grey", linestyle=":", label=f"tolerance {result['tolerance']:g}")
    ax.axvline(
        result["theoretical_max_range"],
        color="C3",
        linestyle="--",
        label=f"theoretical l(n_m + c n_cm) = {result['theoretical_max_range']}",
    )
    if result.get("theoretical_reach") is not None:
        ax.axvline(
            result["theoretical_reach"],
            color="C1",
            linestyle="-.",
            linewidth=2,
            label=f"+ position in segment = {result['theoretical_reach']}",
        )
    ax.axvline(
        result["empirical_range"],
        color="C2",
        linestyle="-",
        linewidth=1,
        alpha=0.8,
        label=f"empirical = {result['empirical_range']}",
    )
    ax.set_yscale("log")
    ax.set_xlabel("distance of the perturbed token (tokens back)")
    ax.set_ylabel("max |change of final log-probs|")
    ax.legend(fontsize=7)
    ax.set_title(title or "temporal range")
    return save_figure(fig, path)


def plot_training_curves(
    curves: Mapping[str, Mapping[str, Sequence[float]]], path: str | Path, *, key: str = "loss", title: str = ""
) -> Path:
    """Several runs on one plot: ``{run name: {"step": [...], key: [...], "val_step": [...], "val_" + key: [...]}}``."""
    fig, ax = subplots(figsize=(7, 3.8))
    for i, (name, c) in enumerate(curves.items()):
        if c.get(key):
            ax.plot(c["step"], c[key], color=f"C{i}", label=f"{name} train")
        if c.get("val_" + key):
            ax.plot(
                c["val_step"], c["val_" + key], color=f"C{i}", linestyle="--", marker="o", label=f"{name} validation"
            )
    ax.set_xlabel("step")
    ax.set_ylabel(key)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    ax.set_title(title or f"training curves ({key})")
    return save_figure(fig, path)


def _smooth(ys: Sequence[float], k: int) -> list[float]:
    """Trailing moving average over ``k`` points (the first points average what exists)."""
    out, acc = [], 0.0
    for i, y in enumerate(ys):
        acc += y
        if i >= k:
            acc -= ys[i - k]
        out.append(acc / min(i + 1, k))
    return out


def plot_study_curves(curves: Mapping[str, Mapping[str, Mapping[str, Sequence[float]]]], path: str | Path) -> Path:
    """Per variant (a colour) and seed (a thin line): training loss (smoothed, left) and, where the runs recorded
    it, validation loss (right)."""
    has_val = any(c.get("val_loss") for seeds in curves.values() for c in seeds.values())
    fig, axes = subplots(1, 2 if has_val else 1, figsize=(11, 4) if has_val else (6.5, 4), squeeze=False)
    axes = axes[0]
    for i, (variant, seeds) in enumerate(curves.items()):
        for j, (_seed, c) in enumerate(seeds.items()):
            label = variant if j == 0 else None
            if c.get("loss"):
                axes[0].plot(c["step"], _smooth(c["loss"], 8), color=f"C{i}", linewidth=0.9, alpha=0.8, label=label)
            if has_val and c.get("val_loss"):
                axes[1].plot(
                    c["val_step"], c["val_loss"], color=f"C{i}", marker=".", linewidth=0.9, alpha=0.8, label=label
                )
    for ax, what in zip(
        axes, ("training loss (moving average of 8 logs)", "validation loss (first validation batches)")
    ):
        ax.set_xlabel("update")
        ax.set_ylabel("nats per token")
        ax.set_title(what, fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    lows = [min(c["val_loss"]) for seeds in curves.values() for c in seeds.values() if c.get("val_loss")]
    highs = [
        c["val_loss"][len(c["val_loss"]) // 3] for seeds in curves.values() for c in seeds.values() if c.get("val_loss")
    ]
    if lows and highs:  # zoom on the part of training where the variants separate
        axes[1].set_ylim(min(lows) - 0.05, max(highs) + 0.05)
    fig.suptitle("training curves, one line per seed")
    return save_figure(fig, path)


def plot_study_bars(summary: Mapping[str, Any], path: str | Path) -> Path:
    """Bits per character per split and evaluation memory, one bar per variant with its interval over seeds."""
    keys = list(summary["metrics"])
    variants = list(summary["variants"])
    fig, ax = subplots(figsize=(max(6.0, 1.6 * len(keys) + 2), 4))
    width = 0.8 / max(len(variants), 1)
    lo = []
    for i, v in enumerate(variants):
        means, errs = [], []
        for k in keys:
            iv = summary["metrics"][k][v]["bits_per_char"]["interval"]
            means.append(iv["mean"] if iv["n"] else float("nan"))
            errs.append(iv["half_width"] if iv.get("half_width") is not None else 0.0)
        lo += [m - e for m, e in zip(means, errs) if m == m]
        ax.bar(
            [j + i * width for j in range(len(keys))], means, width=width, yerr=errs, capsize=3, color=f"C{i}", label=v
        )
    ax.set_xticks([j + width * (len(variants) - 1) / 2 for j in range(len(keys))])
    ax.set_xticklabels([k.replace("/", "\n") for k in keys], fontsize=8)
    if lo:
        ax.set_ylim(min(lo) - 0.03, None)
    ax.set_ylabel("bits per character")
    pct = round(100 * summary["level"])
    ax.set_title(f"bits per character (mean over seeds, {pct}% interval); evaluation memory / split", fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    return save_figure(fig, path)


def plot_study_lookback(summary: Mapping[str, Any], key: str, path: str | Path) -> Path:
    """Paired difference to the baseline in bits per token, per lookback bucket, with intervals; the token share of
    each bucket under its label."""
    base = summary["baseline"]
    per = summary["lookback"][key]
    buckets = summary["lookback_buckets"]
    others = [v for v in per if v != base]
    total = sum(per[base][b].get("tokens", 0) for b in buckets) or 1
    fig, ax = subplots(figsize=(9, 4))
    width = 0.8 / max(len(others), 1)
    for i, v in enumerate(others):
        means, errs = [], []
        for b in buckets:
            iv = per[v][b].get("vs_baseline", {}).get("interval", {})
            means.append(iv.get("mean") if iv.get("n") else float("nan"))
            errs.append(iv.get("half_width") or 0.0)
        ax.bar(
            [j + i * width for j in range(len(buckets))],
            means,
            width=width,
            yerr=errs,
            capsize=3,
            color=f"C{i + 1}",
            label=f"{v} - {base}",
        )
    ax.axhline(0.0, color="black", linewidth=0.8)
    ax.set_xticks([j + width * (len(others) - 1) / 2 for j in range(len(buckets))])
    ax.set_xticklabels(
        [f"{b}\n{100 * per[base][b].get('tokens', 0) / total:.0f}% of tokens" for b in buckets], fontsize=8
    )
    ax.set_xlabel("tokens since the word's previous occurrence, counted back from the segment start")
    ax.set_ylabel(f"bits per token, minus {base}'s")
    ev, split = key.split("/")
    ax.set_title(
        f"where the memory helps ({split}, evaluation memory '{ev}'): below 0 is better than {base}", fontsize=10
    )
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    return save_figure(fig, path)
