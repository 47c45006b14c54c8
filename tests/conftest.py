import os
import shutil
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
torch.set_num_threads(1)

from cli_helpers import FAST  # noqa: E402

from compressive_transformer import CompressiveTransformerLM, ModelConfig, cli  # noqa: E402

# The real corpora (enwik8/enwik8-prefix, wikitext-103, wikitext-2, pg19-sample) for the tests that need them: the
# directory named by $CT_TEST_DATA, by default ../shared/data beside the checkout. Those tests skip without it.
TEST_DATA_ENV = "CT_TEST_DATA"
TEST_DATA = Path(os.environ.get(TEST_DATA_ENV) or Path(__file__).resolve().parents[1].parent / "shared" / "data")


def missing_data_reason(path: Path) -> str:
    """The skip reason of a test whose real corpus ``path`` is absent: where it was looked for, how to point at it."""
    return f"real corpus not found at {path}: set {TEST_DATA_ENV}=/path/to/corpora (default ../shared/data)"


def tiny_config(**overrides) -> ModelConfig:
    base = dict(
        vocab_size=32,
        d_model=16,
        n_layers=2,
        n_heads=2,
        d_ff=32,
        seg_len=8,
        mem_len=8,
        cmem_len=4,
        compression_rate=2,
        compression="conv",
        compression_loss="attention",
        dropout=0.0,
    )
    base.update(overrides)
    return ModelConfig.from_raw(base)  # the flat keys of the earlier layout read into their sections


def with_keys(cfg: ModelConfig, **keys) -> ModelConfig:
    """``cfg`` with ``keys`` (flat keys of the earlier layout, or sections as tables) laid over it."""
    from compressive_transformer.core.config import to_dict, upgrade_model_table
    from compressive_transformer.core.config_base import merge_tables

    base = to_dict(cfg)
    if "kind" not in keys:
        base.pop("kind")  # named again from the sections the merged table holds (``model.scales`` makes it QL)
    return ModelConfig.from_raw(merge_tables(base, upgrade_model_table(keys)))


def tiny_model(seed: int = 0, **overrides) -> CompressiveTransformerLM:
    torch.manual_seed(seed)
    model = CompressiveTransformerLM(tiny_config(**overrides)).double()
    return model.eval()


def eager_and_compiled_steps(model: CompressiveTransformerLM, device: torch.device | str = "cpu", steps: int = 3):
    """Training steps of ``model`` and of ``compile_model(model)`` (what ``train.compile = true`` runs) side by side,
    each carrying its own memory from empty through full and compressed: per step, (eager, compiled) tuples of
    (logits, aux loss, the gradients of every parameter that has one)."""
    from compressive_transformer.training.step import compile_model

    compiled = compile_model(model)
    memories = [model.init_memory(2), model.init_memory(2)]
    for _ in range(steps):
        tokens = torch.randint(0, model.cfg.vocab_size, (2, 8), device=device)
        outs = []
        for i, fn in enumerate((model, compiled)):
            model.zero_grad(set_to_none=True)
            out = fn(tokens, memory=memories[i], targets=tokens)
            (out.loss + out.aux_loss).backward()
            memories[i] = out.memory
            grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
            outs.append((out.logits.detach(), out.aux_loss.detach(), grads))
        yield outs[0], outs[1]


def explain_training_step(model, forward=None, amp: torch.dtype | None = None):
    """``torch._dynamo.explain`` of a training step's forward, task loss and compression loss over full memories (the
    steady state a captured step runs in); ``forward``: what runs the model (default the model itself), under
    autocast to ``amp`` where given."""
    forward = model if forward is None else forward
    tokens = torch.randint(0, model.cfg.vocab_size, (2, 8))
    memory = model.init_memory(2)
    with torch.no_grad():
        for _ in range(3):
            memory = model(tokens, memory=memory, targets=tokens).memory

    def step(tokens, memory):
        with torch.autocast("cpu", dtype=amp, enabled=amp is not None):
            out = forward(tokens, memory=memory, targets=tokens)
        return out.loss + out.aux_loss, out.memory

    return torch._dynamo.explain(step)(tokens, memory)


@pytest.fixture(autouse=True, scope="session")
def fp32_unless_asked():
    """``amp = "auto"`` resolves to fp32 on every test CPU (tests compare against fp32 references); a test that wants
    bf16 asks for it, or patches ``cpu_bf16_flags`` itself. Session-wide, so module fixtures (reference runs) see it
    too; subprocesses do not, so tests that train in one pin ``train.amp = "none"``. Yields the real function."""
    import compressive_transformer.runs.precision as precision

    real = precision.cpu_bf16_flags
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(precision, "cpu_bf16_flags", lambda: [])
        yield real


@pytest.fixture(scope="session")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished 6-step run of the tiny config (checkpoints at 2, 4, 6; cli_helpers.FAST), never changed by a test:
    tests that damage, resume or extend a run take :func:`finished_run_copy`."""
    run_dir = tmp_path_factory.mktemp("finished") / "run"
    assert cli.main(["train", "--run-dir", str(run_dir), *FAST]) == 0
    return run_dir


@pytest.fixture
def finished_run_copy(finished_run: Path, tmp_path: Path) -> Path:
    """A private copy of :func:`finished_run` (without its lock file)."""
    return private_copy(finished_run, tmp_path / "run")


def private_copy(run_dir: Path, copy: Path) -> Path:
    """``run_dir`` copied to ``copy`` without its lock file (a test's own run to damage, resume or extend)."""
    shutil.copytree(run_dir, copy, ignore=shutil.ignore_patterns(".lock"))
    return copy


# a tiny agent run of configs/agents/nonmatching.toml: 8 updates of 2 environments x 4 steps, checkpoints at 4 and 8
AGENT_TINY = [
    "train.n_envs=2",
    "train.unroll=4",
    "train.env_steps=64",
    "train.log_every=2",
    "train.checkpoint_every=4",
    "env.delay=4",
    "model.d_model=16",
    "model.d_ff=16",
    "model.mem_len=4",
    "model.cmem_len=2",
]


@pytest.fixture(scope="session")
def agent_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished :data:`AGENT_TINY` agent run (needs the [rl] extra), never changed by a test: tests that damage or
    resume it take :func:`agent_run_copy`."""
    pytest.importorskip("gymnasium")
    pytest.importorskip("torchrl")
    run_dir = tmp_path_factory.mktemp("agent") / "run"
    sets = [a for s in AGENT_TINY for a in ("--set", s)]
    assert (
        cli.main(["rl", "train", "configs/agents/nonmatching.toml", *sets, "--no-progress", "--run-dir", str(run_dir)])
        == 0
    )
    return run_dir


@pytest.fixture
def agent_run_copy(agent_run: Path, tmp_path: Path) -> Path:
    """A private copy of :func:`agent_run` (without its lock file)."""
    return private_copy(agent_run, tmp_path / "agent")


def pin_source(monkeypatch: pytest.MonkeyPatch, name: str, **changes) -> None:
    """Point download source ``name`` elsewhere for one test (a local server, a size or checksum to fail on), in the
    corpus format that owns it."""
    import dataclasses

    from compressive_transformer.core.registry import FORMATS

    (owner,) = [fmt for fmt in FORMATS.values() if name in fmt.sources]
    monkeypatch.setitem(owner.sources, name, dataclasses.replace(owner.sources[name], **changes))


@pytest.fixture
def recorded(monkeypatch):
    """CUDA graphs recorded on the CPU (:class:`~compressive_transformer.core.graphs.RecordedGraph` stands in for the
    capture), and the trainer allowed to capture there."""
    import compressive_transformer.core.graphs as graphs

    monkeypatch.setattr(graphs, "DEFAULT_GRAPH", graphs.RecordedGraph)
    monkeypatch.setattr("compressive_transformer.training.step.capture_reason", lambda *a: None)


def clamped_table(rows: torch.Tensor, nearest: int, clamp: int) -> torch.Tensor:
    """A positional table (H, n_rows, dh), row m at distance nearest + n_rows - 1 - m, as ``clamp_len`` makes it:
    every row beyond distance ``clamp`` repeats that distance's row (clamp 0: unchanged)."""
    if clamp <= 0:
        return rows
    n_rows = rows.shape[1]
    dist = torch.arange(nearest + n_rows - 1, nearest - 1, -1)
    return rows[:, (nearest + n_rows - 1 - dist.clamp(max=clamp)).clamp(0, n_rows - 1)]
