"""Mixed precision: "auto" resolution, one-line errors, bf16 autocast tracking fp32 (inference, training, the decoder,
generation), with memory buffers and the losses kept in fp32."""

from __future__ import annotations

import copy
import shutil

import pytest
import torch
from conftest import tiny_config

from compressive_transformer import CompressiveTransformerLM, build_model
from compressive_transformer.core.config import ConfigError, load_run_config
from compressive_transformer.core.models.decode import Decoder
from compressive_transformer.data import build_tokenizer, load_corpus, read_documents
from compressive_transformer.inference.generate import SamplingConfig, generate
from compressive_transformer.runs import precision
from compressive_transformer.runs.precision import describe, inference_amp, resolve_amp
from compressive_transformer.runs.presets import TINY_TOML
from compressive_transformer.runs.rundir import config_from_text
from compressive_transformer.training.trainer import Trainer


def run(model, tokens, autocast: bool):
    memory, losses = model.init_memory(tokens.shape[0]), []
    for t in range(0, tokens.shape[1], 8):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            out = model(tokens[:, t : t + 8], memory=memory, targets=tokens[:, t : t + 8])
        memory = out.memory
        losses.append(out.loss)
    return torch.stack(losses), memory, out


def test_bf16_autocast_tracks_fp32_and_keeps_memory_in_fp32():
    torch.manual_seed(0)
    model = CompressiveTransformerLM(tiny_config(d_model=32, n_heads=4)).eval()
    tokens = torch.randint(0, 32, (2, 48))
    ref, _, _ = run(model, tokens, autocast=False)
    low, memory, out = run(model, tokens, autocast=True)
    assert out.logits.dtype == torch.bfloat16 and out.loss.dtype == torch.float32
    assert all(layer.mem.dtype == torch.float32 and layer.cmem.dtype == torch.float32 for layer in memory.layers)
    torch.testing.assert_close(low, ref, rtol=2e-2, atol=2e-2)


def test_bf16_autocast_backward_reaches_every_weight():
    torch.manual_seed(0)
    model = build_model(tiny_config(d_model=32, n_heads=4)).train()
    memory = model.init_memory(2)
    for _ in range(3):
        tokens = torch.randint(0, 32, (2, 8))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(tokens, memory=memory, targets=tokens)
        (out.loss + out.aux_loss).backward()
        memory = out.memory
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
    assert all(p.dtype == torch.float32 for p in model.parameters())


def test_inference_under_autocast_then_without_it_uses_tables_of_each_precision():
    """The projected positional tables reused at inference are keyed by the autocast dtype too: a bf16 table from an
    autocast evaluation is never fed to an fp32 one (a dtype error), nor the reverse (silently lower precision)."""
    torch.manual_seed(0)
    model = CompressiveTransformerLM(tiny_config(d_model=32, n_heads=4)).eval()
    tokens = torch.randint(0, 32, (2, 48))
    fresh = copy.deepcopy(model)
    with torch.no_grad():
        low, _, _ = run(model, tokens, autocast=True)  # bf16 tables made and kept
        fp32, _, _ = run(model, tokens, autocast=False)
        ref, _, _ = run(fresh, tokens, autocast=False)
        low_again, _, _ = run(model, tokens, autocast=True)
    assert torch.equal(fp32, ref) and torch.equal(low_again, low)


def test_decoder_under_autocast_matches_the_model_under_autocast():
    """The ring-buffer decoder's cache writes take the buffers' dtype, so it runs under bf16 autocast and computes
    what ``model.forward`` computes under the same autocast, token by token, up to one bf16 rounding (the two sum
    their score terms in different orders; in fp32 they agree to 1e-10, tests/test_decode.py)."""
    torch.manual_seed(0)
    model = CompressiveTransformerLM(tiny_config(d_model=32, n_heads=4)).eval()
    tokens = torch.randint(0, 32, (2, 40))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        memory = model(tokens[:, :8], memory=model.init_memory(2)).memory
        decoder = Decoder(model, memory)
        ours, theirs = [], []
        for t in range(8, tokens.shape[1]):
            ours.append(decoder.step(tokens[:, t]).float())
            out = model(tokens[:, t : t + 1], memory=memory)
            theirs.append(out.logits[:, 0].float())
            memory = out.memory
    torch.testing.assert_close(torch.stack(ours), torch.stack(theirs), rtol=1e-2, atol=1e-4)
    for a, b in zip(decoder.memory().layers, memory.layers):
        assert a.mem.dtype == b.mem.dtype == torch.float32
        torch.testing.assert_close(a.mem, b.mem, rtol=1e-2, atol=1e-4)
        torch.testing.assert_close(a.cmem, b.cmem, rtol=1e-2, atol=1e-4)


def test_generate_runs_under_bf16_and_the_logits_track_fp32():
    torch.manual_seed(0)
    model = CompressiveTransformerLM(tiny_config(d_model=32, n_heads=4)).eval()
    prompt = torch.randint(0, 32, (20,)).tolist()
    fp32 = generate(model, prompt, max_new_tokens=24, sampling=SamplingConfig(temperature=0), keep_logits=True)
    low = generate(
        model, prompt, max_new_tokens=24, sampling=SamplingConfig(temperature=0), keep_logits=True, amp="bf16"
    )
    torch.testing.assert_close(low.logits[0], fp32.logits[0], rtol=0.05, atol=0.05)


@pytest.mark.parametrize(
    "flags, expected",
    [(["avx2", "fma"], "none"), (["avx512f", "avx512_bf16"], "bf16"), (["amx_tile", "amx_bf16"], "bf16")],
)
def test_auto_picks_bf16_only_on_cpus_with_bf16_instructions(monkeypatch, flags, expected):
    monkeypatch.setattr(precision, "cpu_bf16_flags", lambda: [f for f in flags if f in precision.CPU_BF16_FLAGS])
    assert resolve_amp("auto", "cpu") == expected
    assert expected.replace("none", "fp32") in describe("auto", "cpu")
    for explicit in ("none", "bf16", "fp16"):  # an explicit choice is kept whatever the machine
        assert resolve_amp(explicit, "cpu") == explicit


def test_auto_on_cuda_follows_the_devices_bf16_support(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for native, expected in ((True, "bf16"), (False, "none")):
        monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True, n=native: n)
        assert resolve_amp("auto", "cuda") == expected
    assert resolve_amp("auto", "mps") == "none"


def test_cpu_bf16_flags_read_from_proc_cpuinfo(monkeypatch, fp32_unless_asked):
    monkeypatch.setattr(precision, "cpu_bf16_flags", fp32_unless_asked)  # the real one: the conftest pins them empty
    monkeypatch.setattr(precision, "cpu_model_and_flags", lambda: ("Some CPU", ["avx2", "avx512_bf16"]))
    assert precision.cpu_bf16_flags() == ["avx512_bf16"]


@pytest.mark.parametrize("override, key", [("train.amp=fp8", "train.amp"), ("eval.amp=half", "eval.amp")])
def test_unknown_precision_is_a_one_line_error(override, key):
    with pytest.raises(ConfigError, match=f"^{key}: unknown") as e:
        load_run_config(None, [override])
    assert "\n" not in str(e.value)
    with pytest.raises(ConfigError, match="^train.amp: unknown"):
        resolve_amp("bfloat", "cpu")


def test_eval_amp_follows_train_amp_unless_set():
    cfg = load_run_config(None, ['train.amp="bf16"'])
    assert inference_amp(cfg, "cpu") == "bf16"
    assert inference_amp(load_run_config(None, ['train.amp="bf16"', 'eval.amp="none"']), "cpu") == "none"
    assert inference_amp(load_run_config(None, []), "cpu") == "none"  # auto, and this CPU has no bf16 (conftest)


def test_generation_on_a_cpu_is_fp32_under_auto_and_bf16_only_when_asked(monkeypatch):
    """Batch-1 decoding on a CPU is faster in fp32 even with bf16 instructions, so "auto" generates in fp32 there
    while evaluation (large matmuls) takes bf16; an explicit bf16 is honoured."""
    from compressive_transformer.runs.precision import generation_amp

    monkeypatch.setattr(precision, "cpu_bf16_flags", lambda: ["avx512_bf16"])
    auto = load_run_config(None, [])
    assert inference_amp(auto, "cpu") == "bf16" and generation_amp(auto, "cpu") == "none"
    assert generation_amp(load_run_config(None, ['eval.amp="bf16"']), "cpu") == "bf16"
    assert generation_amp(load_run_config(None, ['train.amp="bf16"', 'eval.amp="none"']), "cpu") == "none"


def test_trainer_logs_the_resolved_precision(tmp_path):
    lines = []
    cfg = config_from_text(TINY_TOML, ["train.progress=false", 'train.amp="auto"', 'train.device="cpu"'])
    tok = build_tokenizer(cfg.data, read_documents(cfg.data, "train"))
    corpus = load_corpus(cfg.data, "train", tok, tmp_path / ".cache")
    t = Trainer(cfg, train_corpus=corpus, run_dir=tmp_path, log=lines.append)
    assert t.amp == "none" and any(line.startswith("precision fp32 (amp = 'auto'") for line in lines)


# The tolerance: over the last 100 of 300 steps, the mean bf16 loss is within 2% of the mean fp32 loss (the runs
# diverge step by step by rounding, so only averages compare), and both learned the same amount.
TRACK_STEPS, TRACK_TAIL, TRACK_RTOL = 300, 100, 0.02


def train_losses(model, data, autocast: bool) -> list[float]:
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    memory, losses = model.init_memory(data.shape[0]), []
    for step in range(TRACK_STEPS):
        t = (step * 8) % (data.shape[1] - 9)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            out = model(data[:, t : t + 8], memory=memory, targets=data[:, t + 1 : t + 9])
        opt.zero_grad(set_to_none=True)
        (out.loss + out.aux_loss).backward()
        opt.step()
        memory = out.memory
        losses.append(float(out.loss.detach()))
    return losses


@pytest.mark.slow
def test_bf16_training_tracks_fp32_loss_over_hundreds_of_steps():
    torch.manual_seed(0)
    base = CompressiveTransformerLM(tiny_config(d_model=32, n_heads=4, d_ff=64)).train()
    pattern = torch.randint(0, 32, (2, 37))
    data = pattern.repeat(1, 8)  # a periodic stream: learnable within the memory span
    fp32 = train_losses(copy.deepcopy(base), data, autocast=False)
    low = train_losses(copy.deepcopy(base), data, autocast=True)
    tail32 = sum(fp32[-TRACK_TAIL:]) / TRACK_TAIL
    tail16 = sum(low[-TRACK_TAIL:]) / TRACK_TAIL
    assert tail32 < 0.5 * fp32[0] and tail16 < 0.5 * low[0]  # both learned
    assert abs(tail16 - tail32) <= TRACK_RTOL * tail32 + 0.02, (tail16, tail32)


def test_a_run_resumed_in_another_precision_says_so_and_can_keep_its_own(tmp_path, monkeypatch):
    """amp = "auto" resolves per machine: a run begun in bf16 and resumed where "auto" means fp32 warns in one line
    naming the override that keeps bf16, and that override is accepted on resume."""
    from compressive_transformer.runs.checkpoint import list_checkpoints, load_checkpoint
    from compressive_transformer.runs.rundir import build_config
    from compressive_transformer.training.workflows import train_run

    cfg = build_config(None, ["train.steps=4", "train.checkpoint_every=2", "train.val_every=0", "train.progress=false"])
    begun = tmp_path / "begun"
    with monkeypatch.context() as m:
        m.setattr(precision, "cpu_bf16_flags", lambda: ["avx512_bf16"])
        train_run(cfg, begun, max_steps=2, log=lambda s: None)
    shutil.copytree(begun, tmp_path / "copy", ignore=shutil.ignore_patterns(".lock"))
    lines: list[str] = []
    train_run(None, begun, resume=True, log=lines.append)
    warning = [line for line in lines if line.startswith("warning:") and "precision" in line]
    assert len(warning) == 1 and "trained in bf16 and continues in fp32" in warning[0]
    assert "--set train.amp=bf16" in warning[0]
    lines.clear()
    train_run(None, tmp_path / "copy", resume=True, overrides=["train.amp=bf16"], log=lines.append)
    assert not [line for line in lines if line.startswith("warning:") and "precision" in line]
    state = load_checkpoint(list_checkpoints(tmp_path / "copy")[-1], model=build_model(cfg.model))
    assert state.extra["precision"] == "bf16"
