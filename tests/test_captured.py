"""Steps replayed as CUDA graphs over static buffers (core/graphs.py): the training update (train.cuda_graphs) and
the decoder's step. Without a GPU, :class:`RecordedGraph` stands in for the capture, so everything around it (keys,
static buffers handed from replay to replay, resets copied in, eager steps between graphs, the optimizer's tensor
learning rates and their checkpoints) runs here against the eager path."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from conftest import tiny_model
from test_train import tiny, trainer

from compressive_transformer.core.graphs import StaticGraphs, key_of, tensors_of
from compressive_transformer.core.models.decode import Decoder


@dataclasses.dataclass(frozen=True)
class Counter:
    total: torch.Tensor
    phase: int  # a Python int the work depends on, as a memory's fill


def test_static_graphs_run_eagerly_once_then_replay_over_the_same_buffers(recorded):
    calls = []

    def fn(inputs, state):
        calls.append(state.phase)
        (x,) = inputs
        return x * 2, Counter(state.total + x * (state.phase + 1), (state.phase + 1) % 2)

    g = StaticGraphs(fn)
    state, want = Counter(torch.zeros(3), 0), Counter(torch.zeros(3), 0)
    buffers = []
    for step in range(8):
        x = torch.full((3,), float(step))
        out, state = g((x,), state)
        want = fn((x,), want)[1]
        assert torch.equal(out, x * 2) and torch.equal(state.total, want.total) and state.phase == want.phase
        buffers.append(state.total.data_ptr())
    assert len(g.graphs) == 2  # one per phase
    assert len(set(buffers[4:])) == 1  # replays hand the state along in one static buffer, no copies


def test_a_state_from_elsewhere_is_copied_into_the_static_buffers(recorded):
    g = StaticGraphs(lambda inputs, s: (s.total.sum(), Counter(s.total + inputs[0], s.phase)))
    state = Counter(torch.zeros(2), 0)
    for _ in range(3):
        _, state = g((torch.ones(2),), state)
    _, after = g((torch.ones(2),), Counter(torch.tensor([10.0, 20.0]), 0))  # e.g. a memory reset
    assert after.total.tolist() == [11.0, 21.0]
    assert key_of(after) == key_of(state)


def test_captured_training_equals_eager_training(tmp_path: Path, recorded):
    """Steps through memory filling, steady state, document resets and a switch to accumulated batches (eager)."""
    overrides = ("train.accumulate=[[0, 1], [9, 2]]", "model.dropout=0.0")
    eager = trainer(tiny(*overrides), tmp_path / "eager")
    captured = trainer(tiny(*overrides, "train.cuda_graphs=true"), tmp_path / "captured")
    assert eager.captured is None and captured.captured is not None
    a = [eager.train_step() for _ in range(11)]
    b = [captured.train_step() for _ in range(11)]
    assert len(captured.captured.graphs.graphs) >= 1  # the steady state was replayed
    for x, y in zip(a, b):
        assert x.keys() == y.keys() and x["step"] == y["step"] and x["accumulate"] == y["accumulate"]
        for key in ("loss", "aux_loss", "grad_norm", "mem_fill", "cmem_fill"):
            assert y[key] == pytest.approx(x[key], rel=1e-5, abs=1e-7), key
    for (name, p), q in zip(eager.model.named_parameters(), captured.model.parameters()):
        torch.testing.assert_close(q, p, rtol=1e-5, atol=1e-6, msg=name)
    for x, y in zip(tensors_of(eager.memory), tensors_of(captured.memory)):
        torch.testing.assert_close(y, x, rtol=1e-5, atol=1e-6)


def test_a_captured_run_checkpoints_plain_learning_rates_and_resumes(tmp_path: Path, recorded):
    cfg = tiny("train.cuda_graphs=true", "train.accumulate=[[0, 1]]")
    whole = trainer(cfg, tmp_path / "whole")
    losses = [whole.train_step()["loss"] for _ in range(8)]
    part = trainer(cfg, tmp_path / "part")
    for _ in range(5):
        part.train_step()
    part.save()
    resumed = trainer(cfg, tmp_path / "part")
    assert resumed.resume() == 5
    assert isinstance(resumed.optimizer.param_groups[0]["lr"], torch.Tensor)  # capturable again after loading
    more = [resumed.train_step()["loss"] for _ in range(3)]
    assert more == pytest.approx(losses[5:], rel=1e-6)


def test_cuda_graphs_on_the_cpu_train_eagerly_and_say_so(tmp_path: Path):
    import test_train

    lines: list[str] = []
    cfg = tiny("train.cuda_graphs=true")
    tok = test_train.build_tokenizer(cfg.data, test_train.read_documents(cfg.data, "train"))
    corpus = test_train.load_corpus(cfg.data, "train", tok, tmp_path / ".cache")
    t = test_train.Trainer(cfg, train_corpus=corpus, run_dir=tmp_path, log=lines.append)
    assert t.captured is None
    notices = [line for line in lines if line.startswith("train.cuda_graphs")]
    assert len(notices) == 1 and "CUDA graphs need a CUDA device" in notices[0]


@pytest.mark.slow
def test_compiled_and_captured_training_equals_eager_training(tmp_path: Path, recorded):
    """train.compile with train.cuda_graphs: the compiled step (inductor without CUDA graphs of its own) captured as
    the update; the same losses, weights and memories as eager training, through memory filling into steady state."""
    overrides = ("train.accumulate=[[0, 1]]", "model.dropout=0.0")
    eager = trainer(tiny(*overrides), tmp_path / "eager")
    both = trainer(tiny(*overrides, "train.cuda_graphs=true", "train.compile=true"), tmp_path / "both")
    assert both.captured is not None and both.captured.model is both.forward and both.forward is not both.model
    a = [eager.train_step() for _ in range(6)]
    b = [both.train_step() for _ in range(6)]
    assert len(both.captured.graphs.graphs) >= 1  # the steady state was replayed
    for x, y in zip(a, b):
        for key in ("loss", "aux_loss", "grad_norm"):
            assert y[key] == pytest.approx(x[key], rel=1e-4, abs=1e-6), key
    for (name, p), q in zip(eager.model.named_parameters(), both.model.parameters()):
        torch.testing.assert_close(q, p, rtol=1e-4, atol=1e-5, msg=name)
    for x, y in zip(tensors_of(eager.memory), tensors_of(both.memory)):
        torch.testing.assert_close(y, x, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("variant", [dict(), dict(cmem_len=0), dict(compression="most_used", compression_loss="none")])
def test_the_graphed_decoder_equals_the_eager_decoder(variant, recorded):
    model = tiny_model(**variant)
    tokens = torch.randint(0, 32, (2, 40))
    with torch.no_grad():
        memory = model(tokens[:, :8]).memory
    eager, graphed = Decoder(model, memory), Decoder(model, memory, cuda_graphs=True)
    for t in range(8, 40):
        torch.testing.assert_close(graphed.step(tokens[:, t]), eager.step(tokens[:, t]), rtol=1e-10, atol=1e-10)
    held = graphed.memory()
    graphed.step(tokens[:, 0])
    for x, y in zip(tensors_of(held), tensors_of(eager.memory())):  # memory() is a copy the next step leaves alone
        torch.testing.assert_close(x, y, rtol=1e-10, atol=1e-10)
    assert 1 <= len(graphed._graphs.graphs) <= 2  # a token evicts or it does not


@pytest.mark.slow
def test_the_compiled_and_graphed_decoder_equals_the_eager_decoder(recorded):
    """What ``generate`` runs on a GPU: the compiled step replayed as graphs (one for the tokens that evict, one for
    those that do not), its ring positions arriving as index tensors."""
    model = tiny_model(compression_extra_width=1).float()
    tokens = torch.randint(0, 32, (2, 40))
    with torch.no_grad():
        memory = model(tokens[:, :8]).memory
    eager, fast = Decoder(model, memory), Decoder(model, memory, compile=True, cuda_graphs=True)
    for t in range(8, 40):
        torch.testing.assert_close(fast.step(tokens[:, t]), eager.step(tokens[:, t]), rtol=1e-5, atol=1e-5)
    assert 1 <= len(fast._graphs.graphs) <= 2
