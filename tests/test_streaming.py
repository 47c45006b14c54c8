"""The one streaming loop: memory carried segment to segment, rows reset at their document boundary, the model's
mode restored however the caller stops, and the same outputs as the loop written out by hand."""

from __future__ import annotations

import torch

from compressive_transformer.core.streaming import Segment, segments, stream
from tests.conftest import tiny_model

torch.set_num_threads(1)


def _by_hand(model, parts: list[Segment], batch_size: int) -> list[torch.Tensor]:
    memory = model.init_memory(batch_size)
    logits = []
    for seg in parts:
        if seg.reset is not None and bool(seg.reset.any()):
            memory = memory.reset(seg.reset)
        out = model(seg.tokens, memory=memory)
        logits.append(out.logits)
        memory = out.memory
    return logits


@torch.no_grad()
def test_stream_equals_the_loop_by_hand_with_resets() -> None:
    model = tiny_model().eval()
    g = torch.Generator().manual_seed(0)
    V = model.cfg.vocab_size
    resets = ([True, True, True], [False, True, False], [False, False, False], [True, False, False])
    parts = [Segment(torch.randint(V, (3, 8), generator=g), reset=torch.tensor(r)) for r in resets]
    expected = _by_hand(model, parts, 3)
    got = [step.out.logits for step in stream(model, parts, batch_size=3)]
    assert len(got) == len(expected)
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b)


@torch.no_grad()
def test_each_step_sees_the_memory_it_read() -> None:
    model = tiny_model().eval()
    tokens = torch.randint(model.cfg.vocab_size, (2, 24))
    steps = list(stream(model, segments(tokens, 8), batch_size=2))
    assert [s.index for s in steps] == [0, 1, 2]
    assert [s.batch.tokens.shape[1] for s in steps] == [8, 8, 8]
    for before, after in zip(steps, steps[1:]):
        assert after.memory is before.out.memory
    assert int(steps[0].memory.layers[0].fill) == 0


def test_mode_is_restored_when_the_caller_stops_early() -> None:
    model = tiny_model().train()
    tokens = torch.randint(model.cfg.vocab_size, (2, 32))
    steps = stream(model, segments(tokens, 8), batch_size=2)
    with torch.no_grad():
        first = next(steps)
        assert not model.training and first.index == 0
    steps.close()
    assert model.training


def test_grad_is_decided_per_segment() -> None:
    model = tiny_model().train()
    tokens = torch.randint(model.cfg.vocab_size, (2, 16))
    parts = list(segments(tokens, 8, tokens))
    with torch.no_grad():
        steps = list(
            stream(model, parts, batch_size=2, eval_mode=False, with_targets=True, grad=lambda seg: seg is parts[1])
        )
    assert [s.out.loss.requires_grad for s in steps] == [False, True]
    assert model.training  # eval_mode=False leaves the mode alone
