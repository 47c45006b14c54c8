"""Produce benchmarks/long_range/results.json (the committed results): what the `task long-range` CLI runs, in order.

    python benchmarks/long_range/run_full.py [main|ablation|tasks|all|seeds]

Each stage merges its runs into results.json, so stages may run separately. One torch thread: the experiment is
sized for two CPU cores.
"""

import sys

import torch

from compressive_transformer.experiments.ablation import run_seeded
from compressive_transformer.experiments.long_range import ABLATION_MODELS, run_long_range

OUT = "benchmarks/long_range"

if __name__ == "__main__":
    torch.set_num_threads(1)
    stage = sys.argv[1] if len(sys.argv) > 1 else "all"
    if stage in ("main", "all"):  # the equal-cost comparison
        run_long_range("full", OUT, tasks=("passkey",), models=("txl", "ct"), seed=0)
    if stage in ("ablation", "all"):  # compression fn x loss, smaller budget per cell; conv x attention is "ct" above
        run_long_range(
            "full", OUT, tasks=("passkey",), models=[m for m in ABLATION_MODELS if m != "ct-conv-attention"], seed=0
        )
    if stage == "ablation-rest":  # the cells still missing when the first ablation run was stopped (time)
        run_long_range(
            "full",
            OUT,
            tasks=("passkey",),
            models=("ct-conv-autoencoder", "ct-dilated_conv-attention", "ct-dilated_conv-autoencoder"),
            seed=0,
        )
    if stage == "seeds":  # every cell and Transformer-XL at one budget over three seeds, two cells at a time (~2 h)
        run_seeded(
            "full",
            OUT + "/seeds",
            tasks=("passkey",),
            models=("txl", "ablation"),
            seeds=(0, 1, 2),
            parallel=2,
            command="python benchmarks/long_range/run_full.py seeds",
        )
    if stage in ("tasks", "all"):  # the other two tasks, at a smaller budget (half of it the one-segment curriculum)
        run_long_range(
            "full", OUT, tasks=("associative_recall", "selective_copy"), models=("txl", "ct"), seed=0, budget=300
        )
