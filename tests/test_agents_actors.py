"""Actor processes (``train.actors = N``): the learner's batch, weights reaching the actors, metrics with the policy
lag, resume, one actor in lockstep equal to the in-process actors, bad values, no process left behind."""

from __future__ import annotations

import math
import multiprocessing
from pathlib import Path

import pytest
import torch

pytest.importorskip("gymnasium")
pytest.importorskip("torchrl")

from compressive_transformer.agents import train as train_module  # noqa: E402
from compressive_transformer.agents.acting import start_actors  # noqa: E402
from compressive_transformer.agents.actors import ActorPool, actor_seeds  # noqa: E402
from compressive_transformer.agents.config import load_rl_config  # noqa: E402
from compressive_transformer.agents.train import train_agent  # noqa: E402
from compressive_transformer.cli import main  # noqa: E402
from compressive_transformer.runs.checkpoint import list_checkpoints  # noqa: E402
from compressive_transformer.runs.metrics import read_metrics  # noqa: E402

TINY = [
    "train.n_envs=4",
    "train.unroll=4",
    "train.env_steps=128",  # 8 updates
    "train.log_every=2",
    "train.checkpoint_every=4",
    "env.delay=4",
    "env.show_steps=3",
    "model.d_model=16",
    "model.d_ff=16",
    "model.mem_len=4",
    "model.cmem_len=2",
]


def _cfg(*extra: str):
    return load_rl_config(Path("configs/agents/nonmatching.toml"), [*TINY, *extra])


def _no_actor_left() -> bool:
    return not multiprocessing.active_children()


@pytest.mark.slow
def test_actor_mode_trains_reports_the_policy_lag_and_resumes(tmp_path: Path) -> None:
    torch.set_num_threads(1)
    summary = train_agent(_cfg("train.actors=2"), tmp_path / "run", progress=False)
    assert summary.updates == 8 and summary.env_steps == 128 and summary.episodes == 16  # episodes of 8 steps
    records = read_metrics(tmp_path / "run")
    assert [r["step"] for r in records] == [2, 4, 6, 8]
    assert all(math.isfinite(r["loss"]) and r["policy_lag"] >= 0 for r in records)
    assert _no_actor_left()

    longer = load_rl_config(tmp_path / "run" / "config.toml", ["train.env_steps=192"])
    resumed = train_agent(longer, tmp_path / "run", resume=True, progress=False)  # actors restart, the learner goes on
    assert resumed.updates == 12 and resumed.episodes == 24
    assert read_metrics(tmp_path / "run")[:4] == records
    assert [r["step"] for r in read_metrics(tmp_path / "run")] == [2, 4, 6, 8, 10, 12]
    assert _no_actor_left()


@pytest.mark.slow
def test_one_actor_in_lockstep_equals_the_in_process_actors(tmp_path: Path) -> None:
    """The actor process seeds its environments and sampling as the in-process actors do, and in lockstep it acts
    with the weights of the update before, as they do: the same updates, to the bit."""
    torch.set_num_threads(1)
    train_agent(_cfg(), tmp_path / "local", progress=False)
    train_agent(_cfg("train.actors=1", "train.actors_lockstep=true"), tmp_path / "actor", progress=False)
    local, actor = read_metrics(tmp_path / "local"), read_metrics(tmp_path / "actor")
    assert all(r.pop("policy_lag") == 0.0 for r in actor)
    assert actor == local
    a, b = (list_checkpoints(tmp_path / d)[-1] / "model.safetensors" for d in ("local", "actor"))
    assert a.read_bytes() == b.read_bytes()


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["transformer", "lstm"])
def test_the_learner_batch_holds_every_actor_and_published_weights_reach_them(kind: str) -> None:
    torch.set_num_threads(1)
    cfg = _cfg("train.actors=2", f'core.kind="{kind}"')
    envs, agent, _ = start_actors(cfg, 1, 0)
    envs.close()
    pool = ActorPool(cfg, agent, 0)
    try:
        first = pool.next()
        roll, T, B = first.roll, cfg.train.unroll, cfg.train.n_envs
        assert roll.obs.shape[:2] == (T + 1, B) and roll.actions.shape == (T, B) and first.versions == [0, 0]
        if kind == "transformer":  # every step's recorded memory holds a row per environment of every actor
            assert len(roll.reads) == T + 1 and all(layer.mem.shape[0] == B for layer in roll.reads[0].layers)
        else:
            assert first.start[0].shape == (B, cfg.core.lstm_hidden)
        with torch.no_grad():  # weights that always choose action 0
            agent.policy.weight.zero_()
            agent.policy.bias.copy_(torch.tensor([30.0, -30.0]))
        pool.publish(agent, 1)
        assert set(pool.next().versions) <= {0, 1}  # may have started before the update was published
        after = pool.next()  # started after it: acts with it
        assert after.versions == [1, 1]
        assert bool((after.roll.actions == 0).all()) and float(after.roll.behaviour_logp.min()) > -1e-6
    finally:
        pool.close()
    assert _no_actor_left()


@pytest.mark.slow
@pytest.mark.parametrize("error", [RuntimeError("learner fails"), KeyboardInterrupt()])
def test_no_actor_outlives_a_failing_learner(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: BaseException
) -> None:
    torch.set_num_threads(1)
    learn, calls = train_module._learn, []

    def failing(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise error
        return learn(*args, **kwargs)

    monkeypatch.setattr(train_module, "_learn", failing)
    with pytest.raises(type(error)):
        train_agent(_cfg("train.actors=1"), tmp_path / "run", progress=False)
    assert _no_actor_left()


def test_actor_seeds_continue_the_in_process_numbering_and_differ_after_a_resume() -> None:
    assert actor_seeds(7, 0, 4, 0) == (7, 7)  # the first actor at a run's start: the run's seeds
    assert actor_seeds(7, 1, 4, 0)[1] == 11  # its environments continue the in-process numbering
    starts = {actor_seeds(7, i, 4, v) for i in range(3) for v in (0, 10, 20)}
    assert len(starts) == 9  # restarted actors see new episodes, not the run's first ones again


def test_bad_actor_counts_are_one_line_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for value, message in [("-1", "train.actors: must be >= 0"), ("3", "train.actors: must divide train.n_envs = 16")]:
        assert main(["rl", "train", "--set", f"train.actors={value}", "--run-dir", str(tmp_path / "r")]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"error: {message}") and "\n" not in err
    assert not (tmp_path / "r").exists()
