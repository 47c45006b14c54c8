"""The WaveNet model kind: causal, with exactly the receptive field it states, and streamed segment by segment it
equals one pass over the whole stream (its receptive-field buffers are its memory)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from compressive_transformer.core.config import ConfigError
from compressive_transformer.core.context import receptive_field
from compressive_transformer.core.models import MemoryModel, WaveNet, build_model, model_kind
from compressive_transformer.core.streaming import segments, stream
from tests.conftest import tiny_config

torch.set_num_threads(1)
DILATIONS = (1, 2, 4, 8, 1, 2)


def wavenet(dilations: tuple[int, ...] = DILATIONS, **kw) -> WaveNet:
    torch.manual_seed(0)
    cfg = tiny_config(vocab_size=256, mem_len=0, cmem_len=0, n_layers=len(dilations), wavenet_dilations=dilations)
    return build_model(cfg.__class__(**{**cfg.__dict__, **kw}))


def input_gradients(model: WaveNet, tokens: torch.Tensor, t: int) -> torch.Tensor:
    """(T,) gradient norm of the logits at position t with respect to each position's input embedding."""
    held = {}

    def keep(_module, _inp, out):
        out.retain_grad()
        held["x"] = out
        return out

    handle = model.embed.register_forward_hook(keep)
    try:
        model.zero_grad()
        out = model(tokens)
        out.logits[0, t].sum().backward()
    finally:
        handle.remove()
    return held["x"].grad[0].norm(dim=-1)


def test_it_is_a_registered_memory_model() -> None:
    model = wavenet()
    assert isinstance(model, MemoryModel) and model_kind(model.cfg).name == "wavenet"
    assert model.receptive_field == receptive_field(DILATIONS) == 19
    assert model.parameters_of("compressor") == [] and len(model.parameters_of("model")) > 0


def test_no_output_depends_on_a_later_sample_and_the_receptive_field_is_as_stated() -> None:
    model = wavenet()
    R, T = model.receptive_field, 48
    tokens = torch.randint(256, (1, T), generator=torch.Generator().manual_seed(0))
    for t in (R + 3, T - 1):
        g = input_gradients(model, tokens, t)
        assert (g[t + 1 :] == 0).all(), "an output reads a later sample"
        assert (g[: t - R + 1] == 0).all(), "an output reads further back than its receptive field"
        assert (g[t - R + 1 : t + 1] > 0).all(), "an output ignores part of its receptive field"


@settings(max_examples=15, deadline=None)
@given(st.lists(st.integers(1, 23), min_size=1, max_size=6))
def test_streaming_in_any_segments_equals_one_pass(cuts: list[int]) -> None:
    model = wavenet().eval()
    tokens = torch.randint(256, (2, sum(cuts)), generator=torch.Generator().manual_seed(len(cuts)))
    whole = model(tokens).logits
    parts, memory, start = [], model.init_memory(2), 0
    for n in cuts:
        out = model(tokens[:, start : start + n], memory=memory)
        parts.append(out.logits)
        memory, start = out.memory, start + n
    torch.testing.assert_close(torch.cat(parts, dim=1), whole, rtol=1e-5, atol=1e-5)


def test_a_reset_row_forgets_and_the_other_row_does_not() -> None:
    model = wavenet().eval()
    a, b = torch.randint(256, (2, 2, 16), generator=torch.Generator().manual_seed(3))
    first = model(a)
    memory = first.memory.reset([0])
    second = model(b, memory=memory).logits
    torch.testing.assert_close(second[0], model(b[:1]).logits[0])  # row 0: as from an empty memory
    torch.testing.assert_close(second[1], model(torch.cat([a, b], 1)[1:]).logits[0, 16:])  # row 1: carried


def test_it_trains_through_the_streaming_loop() -> None:
    model = wavenet()
    tokens = torch.randint(256, (2, 33))
    steps = list(stream(model, segments(tokens[:, :-1], 8, tokens[:, 1:]), batch_size=2, with_targets=True))
    assert len(steps) == 4 and all(s.out.loss is not None and s.out.loss.isfinite() for s in steps)
    steps[0].out.loss.backward()
    assert all(p.grad is not None for p in model.parameters())


@pytest.mark.parametrize(
    ("kw", "key"),
    [
        (dict(n_layers=3, wavenet_dilations=(1, 2)), "model.n_layers"),
        (dict(n_layers=2, wavenet_dilations=(1, 0)), "model.wavenet.dilations"),
        (dict(n_layers=2, wavenet_dilations=(1, 2), mem_len=8, cmem_len=0), "model.memory.mem_len"),
    ],
)
def test_bad_configs_end_in_one_line(kw: dict, key: str) -> None:
    base = dict(vocab_size=256, mem_len=0, cmem_len=0)
    with pytest.raises(ConfigError, match=key):
        tiny_config(**{**base, **kw})


def test_a_killed_and_resumed_wavenet_run_reproduces_the_uninterrupted_losses(tmp_path) -> None:
    """The receptive-field buffers are checkpointed with the rest of the memory: resuming is bit for bit."""
    from compressive_transformer.runs.rundir import build_config
    from compressive_transformer.training.workflows import train_run

    cfg = build_config(
        None,
        [
            "model.wavenet_dilations=[1, 2, 4]",
            "model.n_layers=3",
            "model.mem_len=0",
            "model.cmem_len=0",
            "train.steps=6",
            "train.log_every=1",
            "train.checkpoint_every=3",
            "train.val_every=0",
            "train.amp=none",
        ],
    )
    whole = train_run(cfg, tmp_path / "whole", log=lambda s: None)
    train_run(cfg, tmp_path / "killed", max_steps=4, log=lambda s: None)  # last checkpoint at step 3
    resumed = train_run(None, tmp_path / "killed", resume=True, log=lambda s: None)
    assert resumed.step == 6 and whole.losses[3:] == resumed.losses
