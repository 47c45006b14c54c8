"""One adapter per implementation. Each module exposes ``build(workload) -> Impl`` where ``Impl`` has

- ``param_count``: int (all parameters, embeddings included)
- ``prepare(x, y)``: turns a (B, T) token batch into whatever ``train_step``/``eval_step`` take (not timed)
- ``train_step(batch)``: forward + backward (task loss + auxiliary compression loss) + optimizer step, memory carried
- ``eval_step(batch)``: forward under no_grad in eval mode, task loss computed, memory carried
- ``generate(prompt, n_new)``: reads the (B, P) prompt, then produces ``n_new`` tokens; returns the
  :func:`stamp` times at which each new token became available (list of n_new floats)
- ``reset()``: empty memories (start of a new stream)

Adapters of different packages never import each other, so each runs in its own process with only its own package
loaded. The harness moves ``Impl.model`` to the device and the batches and prompts with it.
"""

from __future__ import annotations

import time


def stamp() -> float:
    """``time.perf_counter()`` once the GPU's queued work (if any) is done: on a GPU, kernels run asynchronously, so
    a stamp taken without waiting would time their launch, not their work."""
    import torch

    if torch.cuda.is_initialized():  # no CUDA context, no queued work
        torch.cuda.synchronize()
    return time.perf_counter()
