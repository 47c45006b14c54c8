"""The torch.compile path (the trainer's train.compile) on CPU: same outputs and gradients as eager mode, also
when the compile caches are warm (run it twice); and every model kind's training step as one graph."""

from __future__ import annotations

import pytest
import torch
from conftest import eager_and_compiled_steps, explain_training_step, tiny_config

from compressive_transformer import CompressiveTransformerLM, build_model


@pytest.mark.slow
def test_compiled_model_matches_eager_through_memory_filling_and_compression():
    torch.manual_seed(0)
    model = CompressiveTransformerLM(tiny_config())
    for eager, compiled in eager_and_compiled_steps(model):  # empty memory, full memory, full compressed memory
        torch.testing.assert_close(compiled[0], eager[0], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(compiled[1], eager[1], rtol=1e-5, atol=1e-6)
        assert len(compiled[2]) == len(eager[2])
        for g_compiled, g_eager in zip(compiled[2], eager[2]):
            torch.testing.assert_close(g_compiled, g_eager, rtol=1e-4, atol=1e-6)


ONE_GRAPH = {
    "transformer-xl": dict(cmem_len=0),
    "conv+attention": dict(),
    "conv+autoencoder": dict(compression_loss="autoencoder"),
    "conv+bptt": dict(compression_loss="bptt"),
    "dilated_conv+attention": dict(compression="dilated_conv", compression_extra_width=1),
    "max_pool": dict(compression="max_pool", compression_loss="none"),
    "mean_pool": dict(compression="mean_pool", compression_loss="none", cmem_positions="shared"),
    "most_used": dict(compression="most_used", compression_loss="none"),
    "same_length+clamp": dict(same_length=True, mem_len=6, clamp_len=5),
    "pre-norm+gating+dropout": dict(norm="pre", gating=True, dropout=0.1, attn_dropout=0.1),
    "transformer-ql": dict(
        scales=(1, 1), output_layers=1, n_layers=3, cmem_len=0, compression="max_pool", compression_loss="none"
    ),
    "wavenet": dict(vocab_size=256, mem_len=0, cmem_len=0, n_layers=3, wavenet_dilations=(1, 2, 4)),
    "adaptive softmax": dict(cmem_len=0, adaptive=dict(cutoffs=(10, 20), div_val=2)),
}


@pytest.mark.parametrize("kind", ONE_GRAPH)
def test_the_training_step_is_one_graph(kind):
    """Forward, task loss and compression loss over a full memory trace as one graph: no graph break (so no host
    synchronisation and nothing dynamo cannot follow), whatever the model kind, compressor or loss."""
    torch.manual_seed(0)
    explained = explain_training_step(build_model(tiny_config(**ONE_GRAPH[kind])).train())
    assert explained.graph_break_count == 0, [str(b.reason)[:200] for b in explained.break_reasons]
    assert explained.graph_count == 1


def test_the_training_step_with_the_fused_kernel_is_one_graph():
    """The fused kernel (``auto``'s choice on CUDA in bf16, compiled too) is a torch.library custom op: dynamo traces
    it whole inside the training step (here through Triton's interpreter on the CPU)."""
    pytest.importorskip("triton")
    torch.manual_seed(0)
    explained = explain_training_step(build_model(tiny_config(attn_impl="fused", d_model=32)).train())
    assert explained.graph_break_count == 0, [str(b.reason)[:200] for b in explained.break_reasons]
    ops = {str(n.target) for g in explained.graphs for n in g.graph.nodes if n.op == "call_function"}
    assert any("fused_relative_attention" in op for op in ops), "the custom op is in the graph"
