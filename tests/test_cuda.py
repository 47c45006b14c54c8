"""The CUDA paths, checked against the CPU and fp32 wherever a GPU is present (skipped elsewhere, so CI on CPU skips
them; run them on a GPU machine with ``pytest tests/test_cuda.py``): the fused-attention path that ``attn_impl =
"auto"`` picks on CUDA (the fused Triton kernel), bf16 / fp16 autocast (fp16 with its gradient scaler), compiled
training and decoding with Triton kernels, the update and the decoder's step replayed as CUDA graphs, and the trainer
end to end with a checkpoint that resumes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import eager_and_compiled_steps, tiny_config, tiny_model

from compressive_transformer import CompressiveTransformerLM
from compressive_transformer.core.models.decode import Decoder
from compressive_transformer.runs.checkpoint import list_checkpoints
from compressive_transformer.runs.metrics import read_metrics
from compressive_transformer.runs.presets import TINY_TOML
from compressive_transformer.runs.rundir import config_from_text
from compressive_transformer.training.workflows import train_run

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
CUDA = torch.device("cuda")
VARIANTS = {
    "conv,attention": dict(),
    "dilated,autoencoder": dict(compression="dilated_conv", compression_loss="autoencoder", compression_extra_width=1),
    "mean_pool,pre-norm": dict(compression="mean_pool", compression_loss="none", norm="pre", gating=True),
    "txl": dict(cmem_len=0),
}
AMP = {"bf16": torch.bfloat16, "fp16": torch.float16}


@pytest.fixture(autouse=True)
def full_fp32_matmuls():
    """TF32 off: the comparisons with the CPU are of fp32 arithmetic, not of TF32's 10-bit mantissa."""
    old = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old


def stream(model, tokens: torch.Tensor, *, amp: torch.dtype | None = None, backward: bool = False):
    """Segments of 8 through ``model`` with memory carried (empty, filling, then compressing); per-segment outputs,
    the parameters' gradients summed over segments, and the final memory."""
    memory, outs = model.init_memory(tokens.shape[0]), []
    for t in range(0, tokens.shape[1], 8):
        with torch.autocast(tokens.device.type, dtype=amp, enabled=amp is not None):
            out = model(tokens[:, t : t + 8], memory=memory, targets=tokens[:, t : t + 8])
        if backward:
            (out.loss + out.aux_loss).backward()
        memory = out.memory
        outs.append(out)
    return outs, memory


@pytest.mark.parametrize("attn_impl", ["auto", "explicit", "sdpa-bias", "fused"])
@pytest.mark.parametrize("variant", VARIANTS.values(), ids=VARIANTS.keys())
def test_cuda_step_matches_the_cpu_forward_backward_and_memory(variant, attn_impl):
    """On CUDA "auto" is the fused Triton kernel; on the CPU the explicit one. Same logits, compression losses,
    memories and gradients of every weight."""
    torch.manual_seed(0)
    cpu = CompressiveTransformerLM(tiny_config(d_model=32, n_heads=4, **variant)).train()
    gpu = CompressiveTransformerLM(tiny_config(d_model=32, n_heads=4, attn_impl=attn_impl, **variant)).train()
    gpu.load_state_dict(cpu.state_dict())
    gpu.to(CUDA)
    tokens = torch.randint(0, 32, (2, 40))
    (ref, ref_mem), (got, got_mem) = stream(cpu, tokens, backward=True), stream(gpu, tokens.to(CUDA), backward=True)
    for a, b in zip(ref, got):
        torch.testing.assert_close(b.logits.cpu(), a.logits, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(b.aux_loss.cpu(), a.aux_loss, rtol=1e-4, atol=1e-5)
    for a, b in zip(ref_mem.layers, got_mem.layers):
        torch.testing.assert_close(b.mem.cpu(), a.mem, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(b.cmem.cpu(), a.cmem, rtol=1e-4, atol=1e-4)
        assert torch.equal(b.mem_mask.cpu(), a.mem_mask) and torch.equal(b.cmem_mask.cpu(), a.cmem_mask)
    for (name, p), q in zip(cpu.named_parameters(), gpu.parameters()):
        assert (p.grad is None) == (q.grad is None), name
        if p.grad is not None:
            torch.testing.assert_close(q.grad.cpu(), p.grad, rtol=1e-3, atol=1e-5, msg=name)


@pytest.mark.parametrize("amp", AMP)
def test_cuda_autocast_tracks_fp32_with_memory_and_loss_in_fp32(amp):
    torch.manual_seed(0)
    model = CompressiveTransformerLM(tiny_config(d_model=64, n_heads=4)).to(CUDA).train()
    tokens = torch.randint(0, 32, (4, 48), device=CUDA)
    ref, _ = stream(model, tokens)
    low, memory = stream(model, tokens, amp=AMP[amp], backward=True)
    assert low[-1].logits.dtype == AMP[amp] and low[-1].loss.dtype == torch.float32
    assert all(layer.mem.dtype == torch.float32 and layer.cmem.dtype == torch.float32 for layer in memory.layers)
    torch.testing.assert_close(
        torch.stack([o.loss for o in low]), torch.stack([o.loss for o in ref]), rtol=2e-2, atol=2e-2
    )
    torch.testing.assert_close(
        torch.stack([o.aux_loss for o in low]), torch.stack([o.aux_loss for o in ref]), rtol=5e-2, atol=5e-3
    )
    assert all(
        p.dtype == torch.float32 and p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters()
    )


@pytest.mark.parametrize("amp,graphs", [("none", False), ("bf16", False), ("fp16", False), ("bf16", True)])
def test_trainer_on_cuda_trains_checkpoints_and_resumes(tmp_path: Path, amp: str, graphs: bool):
    """The trainer on the GPU, killed after step 4 (last checkpoint at 3) and resumed: the resumed run continues the
    uninterrupted one (within the non-associativity of the GPU's reductions), fp16 through its gradient scaler."""
    quiet = ["train.progress=false", "train.val_batches=2", 'train.device="cuda"', f'train.amp="{amp}"']
    quiet.append(f"train.cuda_graphs={str(graphs).lower()}")
    cfg = config_from_text(
        TINY_TOML, [*quiet, "train.steps=6", "train.log_every=1", "train.checkpoint_every=3", "model.dropout=0.1"]
    )
    whole = train_run(cfg, tmp_path / "whole", log=lambda s: None)
    part = train_run(cfg, tmp_path / "killed", max_steps=4, log=lambda s: None)
    assert list_checkpoints(tmp_path / "killed")[-1].name == "step-00000003"
    resumed = train_run(None, tmp_path / "killed", resume=True, log=lambda s: None)
    assert resumed.step == 6 and all(torch.isfinite(torch.tensor(whole.losses)))
    torch.testing.assert_close(torch.tensor(resumed.losses), torch.tensor(whole.losses[3:]), rtol=1e-4, atol=1e-4)
    assert whole.losses[:4] == part.losses or torch.allclose(
        torch.tensor(whole.losses[:4]), torch.tensor(part.losses), rtol=1e-4
    )
    assert whole.losses[-1] < whole.losses[0]
    assert any("grad_norm" in r for r in read_metrics(tmp_path / "killed"))


@pytest.mark.parametrize("variant", ["conv,attention", "txl"])
def test_the_captured_update_on_cuda_follows_eager_training(variant):
    """train.cuda_graphs' update (real CUDA graphs) against the same updates run eagerly: losses, weights, memory."""
    from compressive_transformer.training.captured import CapturedUpdate, make_capturable
    from compressive_transformer.training.trainer import adam

    torch.manual_seed(0)
    models = [CompressiveTransformerLM(tiny_config(d_model=32, n_heads=4, **VARIANTS[variant])).to(CUDA)]
    models.append(CompressiveTransformerLM(models[0].cfg).to(CUDA))
    models[1].load_state_dict(models[0].state_dict())
    opts = [adam(m.parameters(), lr=1e-3) for m in models]
    make_capturable(opts[1])
    update = CapturedUpdate(models[1], opts[1], amp="none", grad_clip=0.1)
    tokens = torch.randint(0, 32, (2, 8 * 12), device=CUDA)
    mask = torch.ones(2, 8, dtype=torch.bool, device=CUDA)
    memories = [m.init_memory(2) for m in models]
    for t in range(0, tokens.shape[1] - 8, 8):
        x, y = tokens[:, t : t + 8], tokens[:, t + 1 : t + 9]
        out = models[0](x, memory=memories[0], targets=y)
        (out.loss + out.aux_loss).backward()
        torch.nn.utils.clip_grad_norm_(list(models[0].parameters()), 0.1)
        opts[0].step()
        opts[0].zero_grad(set_to_none=True)
        memories[0] = out.memory
        (stats, _), memories[1] = update(x, y, mask, memories[1])
        torch.testing.assert_close(stats[0], out.loss.detach(), rtol=1e-4, atol=1e-5)
    assert len(update.graphs.graphs) >= 1
    for p, q in zip(models[0].parameters(), models[1].parameters()):
        torch.testing.assert_close(q, p, rtol=1e-3, atol=1e-5)


@pytest.mark.timeout(240)
def test_the_compiled_and_captured_trainer_step_on_cuda_follows_eager_training(tmp_path: Path):
    """train.compile with train.cuda_graphs on a GPU (real CUDA graphs over the compiled step, bf16 with the kept
    weight copies): the trainer's losses follow the eager trainer's."""
    quiet = ["train.progress=false", "train.val_batches=2", 'train.device="cuda"', 'train.amp="bf16"', "train.steps=8"]
    quiet += ["train.log_every=1", "model.dropout=0.0"]
    eager = train_run(config_from_text(TINY_TOML, quiet), tmp_path / "eager", log=lambda s: None)
    both = config_from_text(TINY_TOML, [*quiet, "train.compile=true", "train.cuda_graphs=true"])
    both = train_run(both, tmp_path / "both", log=lambda s: None)
    torch.testing.assert_close(torch.tensor(both.losses), torch.tensor(eager.losses), rtol=2e-2, atol=2e-2)


# Compiling takes minutes where a step takes milliseconds: the compile tests get their own limit (benchmarks/gpu_check.sh
# runs them as a part of their own, the other CUDA tests under --timeout 90).
COMPILE_TIMEOUT = 240


@pytest.mark.slow
@pytest.mark.timeout(COMPILE_TIMEOUT)
def test_compiled_training_on_cuda_matches_eager():
    torch.manual_seed(0)
    model = CompressiveTransformerLM(tiny_config(d_model=32, n_heads=4)).to(CUDA)
    for eager, compiled in eager_and_compiled_steps(model, CUDA):  # empty memory, full memory, full compressed memory
        torch.testing.assert_close(compiled[0], eager[0], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(compiled[1], eager[1], rtol=1e-4, atol=1e-5)
        assert len(compiled[2]) == len(eager[2])
        for g_compiled, g_eager in zip(compiled[2], eager[2]):
            torch.testing.assert_close(g_compiled, g_eager, rtol=1e-3, atol=1e-5)


@pytest.mark.timeout(COMPILE_TIMEOUT)
@pytest.mark.parametrize("mode", ["eager", "compiled", "graphs", "graphs-fp32", "compiled-graphs"])
def test_cuda_decoder_equals_the_model_token_by_token(mode: str):
    """The decoder on the GPU (fp64 eager and replayed as CUDA graphs; fp32 under torch.compile's Triton kernels,
    replayed, and both, as ``generate`` runs it on a GPU) gives the model's logits and memory, through compression
    steps and ring wraps."""
    model = tiny_model(compression_extra_width=1).to(CUDA)
    if mode in ("compiled", "graphs-fp32", "compiled-graphs"):
        model = model.float()
    tokens = torch.randint(0, 32, (2, 50), device=CUDA)
    with torch.no_grad():
        memory = model(tokens[:, :11], memory=model.init_memory(2)).memory
        compile, graphs = mode.startswith("compiled"), "graphs" in mode  # compiled-graphs: what generate runs on CUDA
        decoder = Decoder(model, memory, compile=compile, cuda_graphs=graphs)
        for t in range(11, 50):
            got = decoder.step(tokens[:, t])
            out = model(tokens[:, t : t + 1], memory=memory)
            memory = out.memory
            tol = 1e-4 if next(model.parameters()).dtype == torch.float32 else 1e-10
            torch.testing.assert_close(got, out.logits[:, 0], rtol=tol, atol=tol)
    for a, b in zip(decoder.memory().layers, memory.layers):
        torch.testing.assert_close(a.mem, b.mem, rtol=tol, atol=tol)
        torch.testing.assert_close(a.cmem, b.cmem, rtol=tol, atol=tol)
