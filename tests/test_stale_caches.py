"""No inference cache outlives the weights it was derived from, whoever wrote them and however.

The model holds no cache: the positional projections W_r R and the keys/values of memory are recomputed from the
weights in every forward. The decoder, which owns such state for generation, is told of writes to the weights it was
made from (:class:`~compressive_transformer.core.models.weight_watch.WriteWatch`) and refuses to continue after one.
The optimizer the trainer really uses is ``Adam(fused=True)``, whose CPU step writes parameters without bumping
``Tensor._version``: every test here runs it, and every optimizer option the trainer offers.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compressive_transformer.core.config import ModelConfig
from compressive_transformer.core.models import build_model
from compressive_transformer.core.models.decode import Decoder
from compressive_transformer.data import build_tokenizer, load_corpus, read_documents
from compressive_transformer.inference.evaluate import evaluate
from compressive_transformer.inference.generate import SamplingConfig, generate
from compressive_transformer.runs.checkpoint import list_checkpoints, load_weights
from compressive_transformer.runs.metrics import read_metrics
from compressive_transformer.runs.presets import TINY_TOML
from compressive_transformer.runs.rundir import config_from_text, read_run_config
from compressive_transformer.training.trainer import adam
from compressive_transformer.training.workflows import train_run

torch.set_num_threads(1)

KINDS = {
    "compressive": dict(compression="conv", compression_loss="attention"),
    "transformer-xl": dict(cmem_len=0),
    "transformer-ql": dict(scales=(1, 1), cmem_len=0, compression="mean_pool", compression_loss="none"),
}


def small(kind: str) -> ModelConfig:
    base = dict(vocab_size=40, d_model=32, n_layers=2, n_heads=2, d_ff=64, seg_len=8, mem_len=8, cmem_len=4)
    base.update(compression_rate=2, dropout=0.0)
    base.update(KINDS[kind])
    return ModelConfig.from_raw(base)


OPTIMIZERS = {
    "adam-fused": lambda p: torch.optim.Adam(p, lr=1e-2, fused=True),
    "adam-foreach": lambda p: torch.optim.Adam(p, lr=1e-2, foreach=True),
    "adam-for-loop": lambda p: torch.optim.Adam(p, lr=1e-2, foreach=False),
    "trainer": lambda p: adam(p, lr=1e-2),  # what the trainer builds (fused where this torch has it)
    "sgd": lambda p: torch.optim.SGD(p, lr=1e-1),
}


def train_step(model: torch.nn.Module, opt: torch.optim.Optimizer, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, model.cfg.vocab_size, (2, model.cfg.seg_len), generator=g)
    model.train()
    opt.zero_grad()
    out = model(x, model.init_memory(2), targets=x)
    (out.loss + (out.aux_loss if out.aux_loss is not None else 0.0)).backward()
    opt.step()
    model.eval()


@torch.no_grad()
def stream_logits(model: torch.nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    """Logits of ``tokens`` (B, n * seg_len), segment by segment with memory carried (the KV cache in use)."""
    memory, out = model.init_memory(tokens.shape[0]), []
    for seg in tokens.split(model.cfg.seg_len, dim=1):
        o = model(seg, memory)
        memory = o.memory
        out.append(o.logits)
    return torch.cat(out, dim=1)


def fresh_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A model that never ran: the same config, the weights loaded through the state dict."""
    other = build_model(model.cfg)
    other.load_state_dict(model.state_dict())
    return other.eval()


@pytest.mark.parametrize("opt_name", sorted(OPTIMIZERS))
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_evaluation_after_an_optimizer_step_equals_a_fresh_model(kind: str, opt_name: str) -> None:
    torch.manual_seed(0)
    model = build_model(small(kind)).eval()
    tokens = torch.randint(0, 40, (2, 4 * model.cfg.seg_len))
    stream_logits(model, tokens)  # fills the caches with the first weights
    opt = OPTIMIZERS[opt_name](model.parameters())
    for step in range(2):
        train_step(model, opt, step)
        torch.testing.assert_close(stream_logits(model, tokens), stream_logits(fresh_copy(model), tokens))


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_memory_carried_across_a_weight_update_is_projected_with_the_new_weights(kind: str) -> None:
    """The memory's key/value cache is the old weights' projection: after an update the model must project anew."""
    torch.manual_seed(1)
    model = build_model(small(kind)).eval()
    tokens = torch.randint(0, 40, (2, 3 * model.cfg.seg_len))
    with torch.no_grad():
        memory = model(tokens[:, :8], model.init_memory(2)).memory
    train_step(model, OPTIMIZERS["adam-fused"](model.parameters()), 0)
    fresh = fresh_copy(model)
    state = copy.deepcopy(memory)
    with torch.no_grad():
        got = model(tokens[:, 8:16], memory).logits
        want = fresh(tokens[:, 8:16], state).logits  # a model that never ran has no cache of its own to use
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("opt_name", sorted(OPTIMIZERS))
def test_a_decoder_made_before_an_optimizer_step_refuses_to_continue(opt_name: str) -> None:
    torch.manual_seed(2)
    model = build_model(small("compressive")).eval()
    opt = OPTIMIZERS[opt_name](model.parameters())
    decoder = Decoder(model, model.init_memory(1))
    decoder.step(torch.tensor([3]))
    train_step(model, opt, 0)
    with pytest.raises(RuntimeError, match="weights changed while decoding"):
        decoder.step(torch.tensor([4]))
    # its memory can still be taken and continued by a new decoder, which projects with the new weights
    again = Decoder(model, decoder.memory())
    with torch.no_grad():
        want = model(torch.tensor([[4]]), decoder.memory()).logits[:, -1]
    torch.testing.assert_close(again.step(torch.tensor([4])), want)


def test_a_decoder_refuses_after_a_load_and_after_a_declared_hand_write() -> None:
    torch.manual_seed(3)
    model = build_model(small("compressive")).eval()
    decoder = Decoder(model, model.init_memory(1))
    model.load_state_dict(build_model(small("compressive")).state_dict())
    with pytest.raises(RuntimeError, match="weights changed"):
        decoder.step(torch.tensor([1]))
    decoder = Decoder(model, model.init_memory(1))
    with torch.no_grad():
        next(model.parameters()).data.mul_(2.0)
    model.weights_changed()
    with pytest.raises(RuntimeError, match="weights changed"):
        decoder.step(torch.tensor([1]))


def test_an_unrelated_optimizer_step_leaves_a_decoder_alone() -> None:
    torch.manual_seed(4)
    model = build_model(small("compressive")).eval()
    other = build_model(small("transformer-xl"))
    decoder = Decoder(model, model.init_memory(1))
    train_step(other, OPTIMIZERS["adam-fused"](other.parameters()), 0)
    decoder.step(torch.tensor([1]))  # no refusal: none of the model's weights was written


# ------------------------------------------------------------------------------------------------------------
# the trainer, as a user runs it


def _tiny(tmp_path: Path, *overrides: str):
    cfg = config_from_text(
        TINY_TOML,
        [
            "train.progress=false",
            "train.val_batches=3",
            "train.steps=6",
            "train.val_every=2",
            "train.checkpoint_every=2",
            "train.keep_checkpoints=5",
            "train.log_every=1",
            "train.accumulate=[[0, 1]]",
            "train.amp=none",
            "train.lr=1e-2",  # weights that move visibly between validations
            "train.warmup_steps=1",
            *overrides,
        ],
    )
    return cfg


@pytest.mark.parametrize("model_kind", ["compressive", "transformer-xl"])
def test_in_training_validation_equals_evaluating_the_saved_checkpoint_fresh(tmp_path: Path, model_kind: str) -> None:
    extra = ["model.cmem_len=0"] if model_kind == "transformer-xl" else []
    cfg = _tiny(tmp_path, *extra)
    run = tmp_path / "run"
    train_run(cfg, run, log=lambda s: None)
    logged = {r["step"]: r["val_loss"] for r in read_metrics(run) if "val_loss" in r}
    assert sorted(logged) == [2, 4, 6]
    saved = read_run_config(run)
    tok = build_tokenizer(saved.data, read_documents(saved.data, "train"))
    val = load_corpus(saved.data, "validation", tok, tmp_path / "cache")
    for ckpt in list_checkpoints(run):
        step = int(ckpt.name.split("-")[1])
        model = build_model(saved.model)
        load_weights(ckpt, model)
        model.eval()
        result = evaluate(
            model,
            val,
            batch_size=saved.eval.batch_size,
            seg_len=saved.eval.seg_len or saved.model.seg_len,
            mem_len=saved.eval.mem_len,
            cmem_len=saved.eval.cmem_len,
            max_batches=saved.train.val_batches,
        )
        assert result.loss == logged[step], step  # bit-equal: the same operations on the same weights


def test_train_then_evaluate_and_generate_in_process_equals_a_reload(tmp_path: Path) -> None:
    from compressive_transformer.training.trainer import Trainer

    cfg = _tiny(tmp_path, "train.val_every=0")
    tok = build_tokenizer(cfg.data, read_documents(cfg.data, "train"))
    val = load_corpus(cfg.data, "validation", tok, tmp_path / "cache")
    trainer = Trainer(
        cfg,
        train_corpus=load_corpus(cfg.data, "train", tok, tmp_path / "cache"),
        val_corpus=None,
        run_dir=tmp_path / "run",
        log=lambda s: None,
    )
    model = trainer.model
    prompt = tok.encode("The ")
    kwargs = dict(batch_size=4, seg_len=cfg.model.seg_len, max_batches=3)
    for _ in range(3):  # evaluate, generate, train a step, again: every round must match a reload
        model.eval()
        in_process = evaluate(model, val, **kwargs)
        text = generate(model, prompt, max_new_tokens=24, sampling=SamplingConfig(temperature=0), seed=0).tokens
        trainer.save()
        reloaded = build_model(trainer.cfg.model)
        load_weights(list_checkpoints(tmp_path / "run")[-1], reloaded)
        reloaded.eval()
        assert evaluate(reloaded, val, **kwargs).loss == in_process.loss
        assert (
            generate(reloaded, prompt, max_new_tokens=24, sampling=SamplingConfig(temperature=0), seed=0).tokens == text
        )
        trainer.train_step()


# ------------------------------------------------------------------------------------------------------------
# any order of the things a user does


OPS = st.lists(st.sampled_from(["train", "eval", "generate", "load", "hand-write"]), min_size=1, max_size=7)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=OPS, kind=st.sampled_from(sorted(KINDS)))
def test_any_sequence_of_steps_evaluations_generations_and_loads_matches_a_fresh_model(ops: list[str], kind: str):
    torch.manual_seed(5)
    model = build_model(small(kind)).eval()
    opt = OPTIMIZERS["adam-fused"](model.parameters())
    tokens = torch.randint(0, 40, (2, 3 * model.cfg.seg_len))
    donor = build_model(small(kind))
    for i, op in enumerate(ops):
        if op == "train":
            train_step(model, opt, i)
        elif op == "load":
            with torch.no_grad():
                for p in donor.parameters():
                    p.add_(0.01)
            model.load_state_dict(donor.state_dict())
        elif op == "hand-write":
            with torch.no_grad():
                for p in model.parameters():
                    p.data.mul_(0.99)
            model.weights_changed()
        elif op == "eval":
            torch.testing.assert_close(stream_logits(model, tokens), stream_logits(fresh_copy(model), tokens))
        else:
            got = generate(model, [1, 2, 3], max_new_tokens=6, sampling=SamplingConfig(temperature=0), seed=0).tokens
            assert (
                got
                == generate(
                    fresh_copy(model), [1, 2, 3], max_new_tokens=6, sampling=SamplingConfig(temperature=0), seed=0
                ).tokens
            )
    torch.testing.assert_close(stream_logits(model, tokens), stream_logits(fresh_copy(model), tokens))


@pytest.mark.slow
def test_the_compiled_decoder_reads_the_weights_as_inputs_not_constants() -> None:
    """A compiled graph is made once per process and reused by later decoders: it must see updated weights."""
    torch.manual_seed(6)
    model = build_model(small("compressive")).eval()

    def run(compile: bool) -> torch.Tensor:
        decoder = Decoder(model, model.init_memory(1), compile=compile)
        return torch.stack([decoder.step(torch.tensor([t])) for t in (1, 2, 3, 4)])

    before = run(True)
    torch.testing.assert_close(before, run(False))
    train_step(model, OPTIMIZERS["adam-fused"](model.parameters()), 0)
    after = run(True)
    assert not torch.allclose(after, before)
    torch.testing.assert_close(after, run(False))
