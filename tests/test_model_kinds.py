"""Model kinds behind one protocol: the built-ins satisfy MemoryModel, and a kind registered from outside the
package is what build_model (and so training, evaluation and generation) gets for the configs that name it."""

from __future__ import annotations

import torch

from compressive_transformer.core.models import (
    MODEL_KINDS,
    CompressiveTransformerLM,
    MemoryModel,
    TransformerQL,
    build_model,
    model_kind,
    register_model,
)
from compressive_transformer.core.streaming import segments, stream
from tests.conftest import tiny_config

torch.set_num_threads(1)


class ScaledLM(CompressiveTransformerLM):
    """A variant: the Compressive Transformer with its logits halved (a stand-in for a new architecture)."""

    def forward(self, *args, **kwargs):
        out = super().forward(*args, **kwargs)
        out.logits = out.logits / 2
        return out


def test_builtins_follow_the_protocol() -> None:
    ql = tiny_config(scales=(1, 1), n_layers=2, cmem_len=0, compression="max_pool", compression_loss="none")
    assert isinstance(build_model(tiny_config()), CompressiveTransformerLM)
    assert isinstance(build_model(ql), TransformerQL)
    for cfg in (tiny_config(), ql):
        assert isinstance(build_model(cfg), MemoryModel)
        assert model_kind(cfg).name == ("transformer-ql" if cfg.is_ql else "compressive")


def test_a_registered_kind_builds_and_streams() -> None:
    register_model("scaled", ScaledLM)
    try:
        model = build_model(tiny_config(kind="scaled"))
        assert isinstance(model, ScaledLM) and isinstance(model, MemoryModel)
        assert type(build_model(tiny_config())) is CompressiveTransformerLM  # other configs keep their kind
        tokens = torch.randint(model.cfg.vocab_size, (2, 16))
        steps = list(stream(model, segments(tokens, 8), batch_size=2))
        assert len(steps) == 2 and steps[-1].out.logits.shape == (2, 8, model.cfg.vocab_size)
    finally:
        del MODEL_KINDS["scaled"]
