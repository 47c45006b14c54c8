"""The compressor table is the one extension point: a compressor registered from outside the package is usable by
name in ModelConfig, and its flags (not its name) decide validation, memory tracking and the parameter groups."""

from __future__ import annotations

import re

import pytest
import torch
from torch import Tensor, nn

from compressive_transformer import CompressiveTransformerLM, ConfigError
from compressive_transformer.core.compression import Compressor
from compressive_transformer.core.registry import COMPRESSORS, compressor_spec, register_compressor
from tests.conftest import tiny_config

torch.set_num_threads(1)


class LastSlot(Compressor):
    """Keeps a learned scaling of each group's newest state: the smallest trainable compressor."""

    def __init__(self, d_model: int, rate: int) -> None:
        super().__init__(rate, 0)
        self.scale = nn.Parameter(torch.ones(d_model))

    def forward(self, windows: Tensor, usage: Tensor | None = None) -> Tensor:
        return windows[:, :, -1] * self.scale


@pytest.fixture
def last_slot():
    spec = register_compressor(
        "last_slot", lambda cfg: LastSlot(cfg.d_model, cfg.compression.rate), trainable=True, extra_width=False
    )
    yield spec
    del COMPRESSORS["last_slot"]


def test_a_registered_compressor_is_usable_by_name(last_slot) -> None:
    cfg = tiny_config(compression="last_slot", compression_loss="attention")
    torch.manual_seed(0)
    model = CompressiveTransformerLM(cfg).double()
    assert all(isinstance(c, LastSlot) for c in model.compressors)
    assert any(p is model.compressors[0].scale for p in model.parameters_of("compressor"))
    memory = model.init_memory(2)
    tokens = torch.randint(cfg.vocab_size, (2, cfg.seg_len))
    for _ in range(4):  # enough segments to evict and compress
        out = model(tokens, memory=memory, targets=tokens)
        memory = out.memory
    assert bool(memory.layers[0].cmem_mask.any())
    out.aux_loss.backward()
    assert model.compressors[0].scale.grad is not None


def test_validation_reads_the_flags(last_slot) -> None:
    with pytest.raises(ConfigError, match="has parameters"):
        tiny_config(compression="last_slot", compression_loss="none")
    with pytest.raises(ConfigError, match="keeps whole slots"):
        tiny_config(compression="last_slot", compression_extra_width=1)
    with pytest.raises(ConfigError, match="pools between scales"):
        tiny_config(compression="last_slot", compression_loss="none", scales=(1, 1), n_layers=2, cmem_len=0)


def test_unknown_names_list_the_registered_ones(last_slot) -> None:
    with pytest.raises(ConfigError, match="last_slot"):
        tiny_config(compression="nope")
    with pytest.raises(KeyError, match="conv"):
        compressor_spec("nope")


def test_builtin_flags() -> None:
    assert {n for n, s in COMPRESSORS.items() if s.trainable} >= {"conv", "dilated_conv"}
    assert [n for n, s in COMPRESSORS.items() if s.needs_usage] == ["most_used"]
    assert {n for n, s in COMPRESSORS.items() if s.scale_pool is not None} == {"max_pool", "mean_pool"}


def test_registering_checks_its_arguments_and_never_replaces_a_built_in() -> None:
    from compressive_transformer.core.models import register_model
    from compressive_transformer.core.registry import (
        COMPRESSION_LOSSES,
        FORMATS,
        KERNELS,
        MODEL_KINDS,
        CorpusFormat,
        register_compression_loss,
        register_format,
        register_kernel,
    )

    tables = [dict(t) for t in (COMPRESSORS, COMPRESSION_LOSSES, KERNELS, MODEL_KINDS, FORMATS)]
    build = lambda cfg: None  # noqa: E731
    refused = [
        (lambda: register_compressor("conv", build, trainable=True), "'conv' is built in and is never replaced"),
        (lambda: register_kernel("explicit", build), "'explicit' is built in"),
        (lambda: register_kernel("auto", build), "'auto' is built in"),
        (lambda: register_kernel("math", build), "'math' is built in"),
        (lambda: register_model("compressive", build), "'compressive' is built in"),
        (lambda: register_compression_loss("attention", local=True, compute=build), "'attention' is built in"),
        (lambda: register_format(CorpusFormat("text", build, build)), "'text' is built in"),
        (lambda: register_compressor("123", build, trainable=True), "the name '123' is not a word"),
        (lambda: register_compressor("", build, trainable=True), "the name '' is not a word"),
        (lambda: register_compressor(None, build, trainable=True), "the name None is not a word"),
        (lambda: register_compressor("mine", build, trainable="yes"), "trainable must be True or False, not 'yes'"),
        (lambda: register_compressor("mine", 5, trainable=True), "build must be a callable or 'package.module:attr'"),
        (lambda: register_compressor("mine", "nocolon", trainable=True), "name a builder as 'package.module:attr'"),
        (lambda: register_kernel("mine", build, weights=1), "weights must be True or False, not 1"),
        (lambda: register_model("mine", build, check=3), "check must be a callable"),
        (lambda: register_format("lines"), "give a CorpusFormat, not str"),
    ]
    for call, message in refused:
        with pytest.raises((ValueError, TypeError), match=re.escape(message)):
            call()
    assert [dict(t) for t in (COMPRESSORS, COMPRESSION_LOSSES, KERNELS, MODEL_KINDS, FORMATS)] == tables
