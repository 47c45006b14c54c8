"""What the lm-evaluation-harness asks of a language model, in token ids and with memory carried: the log-likelihood
of a whole document (one pass, every predictable token scored once) and of continuations after their contexts.

Nothing here imports the harness, so the scoring is usable (and tested) without it. A document is scored by the same
streaming loop as ``evaluate --text`` (``streaming.stream``), cut into the same segments from its first token, many
documents to a batch; continuations likewise, every row's context read segment by segment into that row's memory,
so a context longer than a segment is never truncated.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Callable, Sequence

import numpy as np
import torch

from compressive_transformer.core.constants import IGNORE_INDEX
from compressive_transformer.core.streaming import Segment, stream
from compressive_transformer.inference.evaluate import evaluate
from compressive_transformer.runs.loading import Run
from compressive_transformer.runs.precision import amp_dtype, inference_amp


def run_amp(run: Run) -> torch.dtype | None:
    """The autocast dtype of the run's evaluation precision (``eval.amp``, else ``train.amp``)."""
    return amp_dtype(inference_amp(run.config, run.device))


def stream_nll(run: Run, ids: Sequence[int]) -> float:
    """Total negative log-likelihood (nats) of tokens 1..n-1 of ``ids`` given everything before them, computed by
    ``evaluate`` itself: the document streamed once from an empty memory with the run's evaluation lengths, exactly
    as ``evaluate --text`` scores a file (one document in one row). The reference the batched scoring must equal."""
    if len(ids) < 2:
        return 0.0
    corpus = SimpleNamespace(tokens=np.asarray(ids, dtype=np.int64), doc_offsets=np.array([0, len(ids)]))
    result = evaluate(
        run.model,
        corpus,
        split="lm-eval",
        batch_size=1,
        seg_len=run.seg_len,
        mem_len=run.mem_len,
        cmem_len=run.cmem_len,
        amp_dtype=run_amp(run),
    )
    return result.loss * result.tokens


def rolling_loglikelihoods(
    run: Run, documents: Sequence[Sequence[int]], *, prefix: Sequence[int] = (), batch_size: int
) -> list[float]:
    """Log-likelihood of each document's tokens, read after ``prefix`` in one pass with memory carried, documents
    batched ``batch_size`` to a batch, each in its own row from an empty memory and cut into segments from its first
    token, as ``evaluate`` cuts it. Without a prefix the first token has nothing to be predicted from and is not
    scored (as in ``evaluate``); with one, every token is; the prefix's own tokens never are."""
    pairs = [(list(prefix), list(ids)) if prefix else (list(ids[:1]), list(ids[1:])) for ids in documents]
    scored = [i for i, (ctx, cont) in enumerate(pairs) if ctx and cont]  # else nothing can be predicted
    out = [0.0] * len(documents)
    results = continuation_loglikelihoods(run, [pairs[i] for i in scored], batch_size=batch_size)
    for i, (ll, _) in zip(scored, results):
        out[i] = ll
    return out


def encode_pair(encode: Callable[[str], list[int]], context: str, continuation: str) -> tuple[list[int], list[int]]:
    """Token ids of a (context, continuation) pair as the harness expects them: whitespace that ends the context
    belongs to the continuation (``"Answer:" + " yes"``), and the pair is tokenized whole so that a subword merging
    across the boundary is not split differently than in running text. Where tokenizing the whole does not start
    with the context's own tokens, the continuation is tokenized on its own."""
    spaces = len(context) - len(context.rstrip())
    if spaces:
        context, continuation = context[:-spaces], context[-spaces:] + continuation
    ctx = encode(context) if context else []
    whole = encode(context + continuation)
    if whole[: len(ctx)] == ctx:
        return ctx, whole[len(ctx) :]
    return ctx, encode(continuation)


def padded_segments(rows: Sequence[tuple[Sequence[int], int]], seg_len: int) -> list[Segment]:
    """Left-aligned rows (token ids, number of final tokens to score) as full segments of ``seg_len``: inputs are
    each row's tokens but the last, targets the next tokens over the scored tail only, padding masked out so that it
    never enters memory. Every segment has the full length (Transformer-QL shifts whole states)."""
    width = max(len(ids) - 1 for ids, _ in rows)
    width = -(-max(width, 1) // seg_len) * seg_len  # whole segments
    tokens = torch.zeros(len(rows), width, dtype=torch.long)
    targets = torch.full((len(rows), width), IGNORE_INDEX, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.bool)
    for b, (ids, scored) in enumerate(rows):
        n = len(ids) - 1  # inputs
        tokens[b, :n] = torch.as_tensor(ids[:-1], dtype=torch.long)
        mask[b, :n] = True
        if scored:
            targets[b, n - scored : n] = torch.as_tensor(ids[-scored:], dtype=torch.long)
    return [
        Segment(tokens[:, s : s + seg_len], targets[:, s : s + seg_len], mask[:, s : s + seg_len])
        for s in range(0, width, seg_len)
    ]


@torch.no_grad()
def score_rows(run: Run, rows: Sequence[tuple[Sequence[int], int]]) -> list[tuple[float, bool]]:
    """(log-likelihood, greedy) of the last ``scored`` tokens of each row given all before it, one batch, memory
    carried from segment to segment; greedy: every scored token is the model's most likely next token."""
    device = run.device
    segments = padded_segments(rows, run.seg_len)
    logp = torch.zeros(len(rows), dtype=torch.float64, device=device)
    greedy = torch.ones(len(rows), dtype=torch.bool, device=device)
    steps = stream(
        run.model,
        segments,
        batch_size=len(rows),
        mem_len=run.mem_len,
        cmem_len=run.cmem_len,
        device=device,
        amp_dtype=run_amp(run),
    )
    for step in steps:
        targets = step.batch.targets.to(device)  # (B, T)
        scored = targets != IGNORE_INDEX
        if not bool(scored.any()):
            continue
        logits = step.out.logits.float()  # (B, T, V)
        picked = logits.log_softmax(-1).gather(-1, targets.clamp_min(0).unsqueeze(-1)).squeeze(-1)  # (B, T)
        logp += torch.where(scored, picked, 0.0).sum(1).double()  # padding's outputs may be anything, even NaN
        greedy &= ((logits.argmax(-1) == targets) | ~scored).all(1)
    return [(float(lp), bool(g)) for lp, g in zip(logp.tolist(), greedy.tolist())]


def continuation_loglikelihoods(
    run: Run, pairs: Sequence[tuple[Sequence[int], Sequence[int]]], *, batch_size: int
) -> list[tuple[float, bool]]:
    """(log-likelihood, greedy) of each continuation after its context (token ids; the context non-empty), scored in
    batches of ``batch_size`` rows of similar length (longest first); results in the order given."""
    order = sorted(range(len(pairs)), key=lambda i: -(len(pairs[i][0]) + len(pairs[i][1])))
    out: list[tuple[float, bool]] = [(0.0, True)] * len(pairs)
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        rows = [([*pairs[i][0], *pairs[i][1]], len(pairs[i][1])) for i in chunk]
        for i, result in zip(chunk, score_rows(run, rows)):
            out[i] = result
    return out


__all__ = [
    "continuation_loglikelihoods",
    "encode_pair",
    "padded_segments",
    "rolling_loglikelihoods",
    "run_amp",
    "score_rows",
    "stream_nll",
]
