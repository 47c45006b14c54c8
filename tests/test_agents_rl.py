"""Agents with the [rl] extra: V-trace against a hand-computed case, the environments, training, exact resume, CLI."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import pytest
import torch

pytest.importorskip("gymnasium")
pytest.importorskip("torchrl")

from compressive_transformer.agents.actor_critic import Rollout, vtrace_targets  # noqa: E402
from compressive_transformer.agents.config import load_rl_config  # noqa: E402
from compressive_transformer.agents.envs import (  # noqa: E402
    NonmatchingEnv,
    env_state,
    make_env,
    make_vector_env,
    restore_env_state,
)
from compressive_transformer.agents.train import train_agent  # noqa: E402
from compressive_transformer.cli import main  # noqa: E402
from compressive_transformer.core.config import ConfigError
from compressive_transformer.runs.checkpoint import list_checkpoints
from compressive_transformer.runs.metrics import read_metrics


def _roll(rewards: list[float], done: list[bool]) -> Rollout:
    T = len(rewards)
    return Rollout(
        obs=torch.zeros(T + 1, 1, 1),
        first=torch.zeros(T + 1, 1, dtype=torch.bool),
        actions=torch.zeros(T, 1, dtype=torch.long),
        behaviour_logp=torch.zeros(T, 1),
        rewards=torch.tensor(rewards).unsqueeze(1),
        done=torch.tensor(done).unsqueeze(1),
    )


def test_vtrace_matches_a_hand_computed_case() -> None:
    """gamma 0.9; importance ratios 2, 0.5, 1 (clipped to 1, 0.5, 1); values 0.5, 0.2, 0.1 and bootstrap 0.3.
    deltas: 1(1 + .9*.2 - .5) = .68, .5(0 + .9*.1 - .2) = -.055, 1(2 + .9*.3 - .1) = 2.17;
    v - V: 2.17, -.055 + .9*.5*2.17 = .9215, .68 + .9*1*.9215 = 1.50935;
    advantages: 1(1 + .9*1.1215 - .5), .5(0 + .9*2.27 - .2), 1(2 + .9*.3 - .1)."""
    roll = _roll([1.0, 0.0, 2.0], [False, False, False])
    target_logp = torch.log(torch.tensor([[2.0], [0.5], [1.0]]))
    values = torch.tensor([[0.5], [0.2], [0.1], [0.3]])
    adv, vs = vtrace_targets(target_logp, roll.behaviour_logp, values, roll, gamma=0.9)
    torch.testing.assert_close(vs[:, 0], torch.tensor([2.00935, 1.1215, 2.27]))
    torch.testing.assert_close(adv[:, 0], torch.tensor([1.50935, 0.9215, 2.17]))


def test_vtrace_does_not_bootstrap_across_an_episode_end() -> None:
    roll = _roll([1.0, 0.0], [True, False])  # the episode ends with the first step; the second starts another
    values = torch.tensor([[0.5], [7.0], [0.0]])
    adv, vs = vtrace_targets(torch.zeros(2, 1), roll.behaviour_logp, values, roll, gamma=0.9)
    assert vs[0, 0].item() == pytest.approx(1.0)  # the reward only: nothing of the next episode's 7.0
    assert adv[0, 0].item() == pytest.approx(0.5)


def test_nonmatching_episode() -> None:
    from gymnasium.utils.env_checker import check_env

    env = NonmatchingEnv(n_objects=3, delay=5, show_steps=2, n_distractors=2)
    check_env(env, skip_render_check=True)
    K = 3
    for seed in range(6):
        obs, _ = env.reset(seed=seed)
        shown = int(obs[3 : 3 + K].argmax())
        assert obs[0] == 1 and obs[3 : 3 + K].sum() == 1
        for t in range(env.show_steps + env.delay - 1):
            obs, r, term, trunc, _ = env.step(0)
            assert r == 0 and not term and not trunc
            assert obs[3 : 3 + K].sum() == (t + 1 < env.show_steps)  # the object only in the show phase
        obs, *_ = env.step(0)  # the choice: the shown object and a new one, nothing else
        presented = obs[3 + K : 3 + 2 * K]
        assert obs[2] == 1 and obs[3 : 3 + K].sum() == 0 and presented.sum() == 2 and presented[shown] == 1
        new = int(next(i for i in range(K) if presented[i] and i != shown))
        _, r, term, _, _ = env.step(new if seed % 2 else shown)
        assert term and r == (1.0 if seed % 2 else 0.0)
        assert env.episode_length == env.show_steps + env.delay + 1


def test_minigrid_memory_gives_flat_float_observations() -> None:
    pytest.importorskip("minigrid")
    cfg = load_rl_config(Path("configs/agents/minigrid-memory.toml"))
    env = make_env(cfg.env)
    obs, _ = env.reset(seed=0)
    assert obs.dtype.name == "float32" and obs.ndim == 1 and obs.max() <= 1.0
    assert env.observation_space.contains(obs)
    envs = make_vector_env(cfg.env, 2)
    obs, _ = envs.reset(seed=0)
    obs, *_ = envs.step(envs.action_space.sample())
    assert obs.dtype.name == "float32" and obs.shape == (2, env.observation_space.shape[0])
    restore_env_state(envs, env_state(envs))  # the environments go into a checkpoint


TINY = [
    "train.n_envs=3",
    "train.unroll=4",
    "train.env_steps=96",  # 8 updates
    "train.log_every=2",
    "train.checkpoint_every=4",
    "env.delay=4",
    "env.show_steps=3",
    "model.d_model=16",
    "model.d_ff=16",
    "model.mem_len=4",
    "model.cmem_len=2",
]


@pytest.mark.parametrize("kind", ["transformer", "lstm"])
def test_training_resumes_exactly(tmp_path: Path, kind: str) -> None:
    torch.set_num_threads(1)
    cfg = load_rl_config(Path("configs/agents/nonmatching.toml"), [*TINY, f"core.kind={kind!r}".replace("'", '"')])
    full = tmp_path / "full"
    summary = train_agent(cfg, full, progress=False)
    assert summary.updates == 8 and summary.env_steps == 96
    records = read_metrics(full)
    assert [r["step"] for r in records] == [2, 4, 6, 8]
    assert all(math.isfinite(r["loss"]) for r in records)

    cut = tmp_path / "cut"  # the same run killed after its checkpoint at update 4
    shutil.copytree(full, cut)
    shutil.rmtree(list_checkpoints(cut)[-1])
    resumed = train_agent(None, cut, resume=True, progress=False)
    assert resumed.updates == 8
    assert read_metrics(cut) == records
    a, b = (list_checkpoints(d)[-1] / "model.safetensors" for d in (full, cut))
    assert a.read_bytes() == b.read_bytes()

    early = tmp_path / "early"  # killed before its first checkpoint: nothing to resume, so it starts again
    shutil.copytree(full, early)
    shutil.rmtree(early / "checkpoints")
    with pytest.raises(ConfigError, match="holds no checkpoint"):
        train_agent(None, early, resume=True, progress=False)
    train_agent(cfg, early, progress=False)
    assert read_metrics(early) == records
    with pytest.raises(ConfigError, match="already holds a run"):
        train_agent(cfg, early, progress=False)

    longer = tmp_path / "longer"  # a finished run continued to more steps equals the longer run from the start
    shutil.copytree(full, longer)
    train_agent(load_rl_config(longer / "config.toml", ["train.env_steps=144"]), longer, resume=True, progress=False)
    train_agent(load_rl_config(full / "config.toml", ["train.env_steps=144"]), tmp_path / "long", progress=False)
    assert read_metrics(longer) == read_metrics(tmp_path / "long")
    with pytest.raises(ConfigError, match=r"train.gamma: 0.99 in the run, 0.9 now\); only train.env_steps, train.lr"):
        train_agent(load_rl_config(longer / "config.toml", ["train.gamma=0.9"]), longer, resume=True, progress=False)


def test_cli_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["rl", "train", "--set", "train.bogus=1", "--run-dir", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: train.bogus: unknown key") and "\n" not in err
    assert main(["rl", "train", "--resume"]) == 2
    assert "--run-dir" in capsys.readouterr().err
    assert main(["rl", "train", "--resume", "--run-dir", str(tmp_path / "none")]) == 2
    assert "holds no checkpoint" in capsys.readouterr().err
    assert main(["rl", "train", "--set", "core.embed_dim=8", "--run-dir", str(tmp_path / "r")]) == 2
    assert "model.input_dim" in capsys.readouterr().err
    assert main(["rl", "train", "--set", "model.dropout=0.1", "--run-dir", str(tmp_path / "r")]) == 2
    assert "dropout" in capsys.readouterr().err
    for seg_len in (1, 4):  # 1: refused for the agent's reason, not for the model's segment-length rule
        ql = ["--set", "model.scales=[1, 1]", "--set", f"model.seg_len={seg_len}", "--set", "model.cmem_len=0"]
        assert main(["rl", "train", *ql, "--run-dir", str(tmp_path / "r")]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("error: model.ql: an agent core cannot be a Transformer-QL") and "\n" not in err
        assert "one observation at a time" in err
    assert not (tmp_path / "r").exists()


def test_resume_refuses_fewer_environment_steps_than_trained(
    agent_run_copy: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`rl train --resume --set train.env_steps=N` below the steps trained exited 0 and rewrote the run's
    config.toml to N (text runs refuse fewer steps in one line)."""
    run = agent_run_copy
    before = (run / "config.toml").read_text()
    code = main(["rl", "train", "--resume", "--run-dir", str(run), "--set", "train.env_steps=32", "--no-progress"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err, err
    assert err.startswith("error: --set train.env_steps=32: this run has already trained 64 environment steps"), err
    assert (run / "config.toml").read_text() == before


def test_an_agent_too_large_for_memory_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    """`--set model.n_layers=1000000000` built layers until the machine ran out of memory."""
    from cli_helpers import assert_one_line_error, cli_capped

    run = tmp_path / "r"
    layers = ["--set", "model.n_layers=1000000000"]
    done = cli_capped("rl", "train", "configs/agents/nonmatching.toml", *layers, "--run-dir", str(run))
    assert_one_line_error(done.returncode, done.stderr, "model: ", "lower the sizes")
    assert not run.exists()
