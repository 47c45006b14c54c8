"""The best policy a run keeps (``<run>/best``) and `rl evaluate`: the best full window is the one kept, with the
weights of that update; a better window replaces it whatever its update; evaluation plays the same number of
episodes in every environment, reproducibly, without touching the caller's random state."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import deque
from pathlib import Path

import pytest
import torch

pytest.importorskip("gymnasium")
pytest.importorskip("torchrl")

from compressive_transformer.agents.acting import Episodes  # noqa: E402
from compressive_transformer.agents.best import BEST_DIR, keep_if_best, read_best  # noqa: E402
from compressive_transformer.agents.config import load_rl_config  # noqa: E402
from compressive_transformer.agents.evaluate import evaluate_agent  # noqa: E402
from compressive_transformer.agents.train import train_agent  # noqa: E402
from compressive_transformer.cli import main  # noqa: E402
from compressive_transformer.core.config import ConfigError  # noqa: E402
from compressive_transformer.runs.checkpoint import list_checkpoints, load_weights  # noqa: E402
from compressive_transformer.runs.metrics import read_metrics  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TINY = [  # 3 environments, 4 steps an unroll, a window of 3 episodes, a metrics line (a chance for a best) each update
    "train.n_envs=3",
    "train.unroll=4",
    "train.env_steps=240",
    "train.log_every=1",
    "train.checkpoint_every=10",
    "train.window=3",
    "env.delay=1",
    "env.show_steps=1",
    "model.d_model=16",
    "model.d_ff=16",
    "model.mem_len=4",
    "model.cmem_len=2",
]


def _config(*extra: str):
    return load_rl_config(ROOT / "configs/agents/nonmatching.toml", [*TINY, *extra])


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.set_num_threads(1)
    run_dir = tmp_path_factory.mktemp("best") / "run"
    train_agent(_config(), run_dir, progress=False)
    return run_dir


def _expected_best(records: list[dict]) -> dict:
    """The first metrics line with the highest (success rate, mean return) among those whose window was full."""
    full = [r for r in records if r["episodes"] >= 3]
    top = max((r["success_rate"], r["mean_return"]) for r in full)
    return next(r for r in full if (r["success_rate"], r["mean_return"]) == top)


def test_the_best_full_window_is_kept_with_the_weights_of_its_update(run: Path, tmp_path: Path) -> None:
    records = read_metrics(run)
    want = _expected_best(records)
    best = read_best(run)
    assert best is not None and [p.name for p in list_checkpoints(run / BEST_DIR)] == [best.path.name]
    assert (best.step, best.env_steps, best.window) == (want["step"], want["env_steps"], 3)
    assert (best.success_rate, best.mean_return) == (want["success_rate"], want["mean_return"])
    assert best.step < records[-1]["step"]  # else the weights check below would only compare the final ones
    # the same run stopped at that update (in-process acting replays exactly) ends with the kept weights
    short = tmp_path / "short"
    train_agent(_config(f"train.env_steps={best.env_steps}"), short, progress=False)
    final = list_checkpoints(short)[-1] / "model.safetensors"
    assert (best.path / "model.safetensors").read_bytes() == final.read_bytes()


def test_only_a_full_window_that_does_better_replaces_the_best(tmp_path: Path) -> None:
    model = torch.nn.Linear(2, 2)
    episodes = Episodes(deque(maxlen=4))

    def offer(step: int, returns: list[float], best):
        episodes.returns.clear()
        episodes.add(returns)
        with torch.no_grad():
            model.weight.fill_(step)
        return keep_if_best(tmp_path, step, 10 * step, model, episodes, "", best)

    assert offer(5, [1.0, 1.0, 1.0], None) is None  # 3 of a window of 4: not yet a window
    best = offer(6, [1.0, 0.0, 0.0, 0.0], None)
    assert best is not None and (best.step, best.success_rate) == (6, 0.25)
    assert offer(7, [0.0, 0.0, 1.0, 0.0], best) == best  # as good: the earlier stays
    assert offer(8, [0.0, 0.0, 0.0, 0.0], best) == best
    better = offer(9, [1.0, 0.5, 0.0, 0.0], best)  # the same success rate, a higher mean return
    assert better is not None and better.step == 9
    resumed = offer(3, [1.0, 1.0, 1.0, 0.0], better)  # a resumed run's better window at an earlier update
    assert resumed is not None and resumed.step == 3 and read_best(tmp_path) == resumed
    assert [p.name for p in list_checkpoints(tmp_path / BEST_DIR)] == ["step-00000003"]
    reloaded = torch.nn.Linear(2, 2)
    load_weights(resumed.path, reloaded)
    assert torch.equal(reloaded.weight, torch.full((2, 2), 3.0))


def test_evaluation_plays_every_environment_alike_and_reproducibly(run: Path) -> None:
    torch.manual_seed(11)
    torch.set_num_threads(2)
    before = torch.get_rng_state()
    a = evaluate_agent(run, episodes=7, n_envs=3, progress=False)
    assert torch.equal(torch.get_rng_state(), before)  # the caller's random state is untouched
    assert torch.get_num_threads() == 2  # the run's train.threads while it played, the caller's after
    assert a.episodes == 9 and 0 <= a.successes <= 9  # 7 rounded up to 3 per environment
    assert a.success_rate == a.successes / 9 and a.interval[0] <= a.success_rate <= a.interval[1]
    assert a.checkpoint == list_checkpoints(run)[-1] and a.step == read_metrics(run)[-1]["step"]
    assert evaluate_agent(run, episodes=7, n_envs=3, progress=False) == a
    best = evaluate_agent(run, best=True, episodes=7, n_envs=3, progress=False)
    assert best.checkpoint == read_best(run).path and best.step == read_best(run).step


def test_evaluation_errors_are_one_line(run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    none_yet = tmp_path / "none"
    sets = [a for s in [*TINY, "train.env_steps=12", "train.window=200"] for a in ("--set", s)]
    args = ["rl", "train", str(ROOT / "configs/agents/nonmatching.toml"), *sets, "--no-progress"]
    assert main([*args, "--run-dir", str(none_yet)]) == 0
    assert read_best(none_yet) is None  # no window of 200 episodes in 12 steps, and the command says so
    assert "no best policy kept yet: fewer than train.window episodes have ended" in capsys.readouterr().out
    with pytest.raises(ConfigError, match="holds no best policy yet"):
        evaluate_agent(none_yet, best=True)
    with pytest.raises(ConfigError, match="does not hold an agent run"):
        evaluate_agent(tmp_path)
    with pytest.raises(ConfigError, match="--episodes 0: give at least 1"):
        evaluate_agent(run, episodes=0)


@pytest.mark.slow
def test_rl_evaluate_in_a_fresh_process(run: Path, tmp_path: Path) -> None:
    out = tmp_path / "eval.json"
    cmd = [sys.executable, "-m", "compressive_transformer.cli", "rl", "evaluate", str(run), "--best"]
    done = subprocess.run(
        [*cmd, "--episodes", "6", "--no-progress", "--json", str(out)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    best = read_best(run)
    assert f"6 episodes with the weights of update {best.step}" in done.stdout
    result = json.loads(out.read_text())
    assert result["episodes"] == 6 and result["checkpoint"] == str(best.path)
    bad = subprocess.run([*cmd[:-2], str(tmp_path / "nothing")], capture_output=True, text=True, timeout=300)
    assert bad.returncode != 0 and bad.stderr.strip().count("\n") == 0 and "does not hold an agent run" in bad.stderr


def test_a_best_folder_linked_out_of_the_run_is_never_pruned(tmp_path: Path) -> None:
    run_dir, outside = tmp_path / "run", tmp_path / "theirs"
    (outside / "step-00000001").mkdir(parents=True)
    (outside / "step-00000001" / "mine.txt").write_text("keep")
    (run_dir / BEST_DIR).mkdir(parents=True)
    (run_dir / BEST_DIR / "checkpoints").symlink_to(outside)
    episodes = Episodes(deque([1.0, 1.0], maxlen=2))
    with pytest.raises(ConfigError, match="is a link that leads out of"):
        keep_if_best(run_dir, 3, 30, torch.nn.Linear(2, 2), episodes, "", None)
    (run_dir / BEST_DIR / "checkpoints").unlink()
    (run_dir / BEST_DIR).rmdir()
    (run_dir / BEST_DIR).symlink_to(outside.parent)
    with pytest.raises(ConfigError, match="is a link that leads out of"):
        keep_if_best(run_dir, 3, 30, torch.nn.Linear(2, 2), episodes, "", None)
    assert [p.name for p in outside.iterdir()] == ["step-00000001"]
    assert (outside / "step-00000001" / "mine.txt").read_text() == "keep"


def test_rl_evaluate_checks_its_json_file_and_seed_before_playing(
    run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = (run / "config.toml").read_text()
    for target in (run / "config.toml", tmp_path):
        assert main(["rl", "evaluate", str(run), "--episodes", "1", "--no-progress", "--json", str(target)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "--json: " in err and "give a new file name" in err, err
        assert "checkpoints are untouched" not in err
    assert (run / "config.toml").read_text() == config
    for seed in ("-1", str(2**70)):
        assert main(["rl", "evaluate", str(run), "--episodes", "1", "--no-progress", "--seed", seed]) == 2
        err = capsys.readouterr().err
        assert err == f"error: --seed: {seed} is out of range; give a whole number from 0 to 4294967295\n"
    with pytest.raises(ConfigError, match="--seed -1: give a whole number from 0 to 4294967295"):
        evaluate_agent(run, seed=-1)  # the library checks it too
    out = tmp_path / "eval.json"
    args = ["rl", "evaluate", str(run), "--episodes", "1", "--envs", "1", "--no-progress", "--json", str(out)]
    assert main(args) == 0
    assert capsys.readouterr().out.strip().endswith(f"wrote {out}")
    assert json.loads(out.read_text())["episodes"] == 1


def test_rl_train_says_how_to_go_on(run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import shutil

    from compressive_transformer.commands.interrupted import interrupted_message

    assert interrupted_message("rl", run).endswith(f"compressive-transformer rl train --run-dir {run} --resume`")
    copy = tmp_path / "copy"
    shutil.copytree(run, copy, ignore=shutil.ignore_patterns(".lock"))
    assert main(["rl", "train", "--run-dir", str(copy), "--resume", "--set", "model.d_model=32"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "model.d_model: 16 in the run, 32 now" in err, err
    (read_best(copy).path / "model.safetensors").write_bytes(b"damaged")
    sets = ["--set", "train.env_steps=252", "--no-progress"]
    assert main(["rl", "train", "--run-dir", str(copy), "--resume", *sets]) == 0
    assert "warning: the best policy is unusable" in capsys.readouterr().err


def test_text_commands_and_agent_commands_point_at_each_other(run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["evaluate", str(run)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"evaluate it with `rl evaluate {run}`" in err, err
    assert main(["rl", "train", str(ROOT / "configs/text-cpu.toml"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "this is a text or audio config, not an agent's" in err, err
    assert "compressive-transformer train --config FILE" in err
