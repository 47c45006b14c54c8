"""Loading data never runs code. A pickle whose unpickling would create a marker file is planted in every file the
library reads from a run directory, a checkpoint, a token cache, an export, an imported Transformer-XL checkpoint,
a study's or a task's results and a memory file (where a checkpoint lists it, its manifest is updated to match, as an
attacker would): the marker never appears, and a command that needs the file stops in one line."""

from __future__ import annotations

import base64
import json
import pickle
import shutil
from pathlib import Path

import pytest
import torch
from cli_helpers import assert_one_line_error, cli_run

from compressive_transformer.analysis.report import summarize_run
from compressive_transformer.core.config import ConfigError
from compressive_transformer.experiments.long_range_results import locked_results
from compressive_transformer.experiments.study import read_result
from compressive_transformer.runs.checkpoint import RESUME_FILES, list_checkpoints
from compressive_transformer.runs.integrity import write_manifest

torch.set_num_threads(1)


class Payload:
    """Unpickling this creates ``marker`` (through ``exec``, which any unpickler that resolves globals would call)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (exec, (f"open({str(self.marker)!r}, 'w').close()",))


@pytest.fixture
def marker(tmp_path: Path) -> Path:
    return tmp_path / "code-ran"


def plant(path: Path, marker: Path, *, torch_save: bool = False) -> None:
    """Replace ``path`` with a code-running pickle (raw, or in torch.save's zip layout); a checkpoint's manifest is
    rewritten to match, so integrity checks pass and only the loader stands between the file and the user."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_dir():
        shutil.rmtree(path)
    if torch_save:
        torch.save({"weight": Payload(marker)}, path)
    else:
        path.write_bytes(pickle.dumps({"weight": Payload(marker)}))
    manifest = path.parent / "manifest.json"
    if manifest.is_file() and path.name != "manifest.json":
        extra = {k: v for k, v in json.loads(manifest.read_text()).items() if k not in ("version", "files")}
        write_manifest(path.parent, extra)


def check(code: int, err: str, marker: Path, *, must_fail: bool) -> None:
    assert not marker.exists(), "a planted pickle ran"
    if must_fail or code != 0:
        assert_one_line_error(code, err)


# ---------------------------------------------------------------------------------------------------------------
# a text run: its checkpoint files and its own files, under every command that reads them

CHECKPOINT_FILES = list(RESUME_FILES)  # every file of a checkpoint but its manifest


@pytest.mark.parametrize("name", CHECKPOINT_FILES)
def test_text_checkpoint_files(name: str, finished_run_copy: Path, marker: Path, capsys: pytest.CaptureFixture) -> None:
    run_dir = finished_run_copy
    newest = list_checkpoints(run_dir)[-1]
    for ckpt in list_checkpoints(run_dir):  # every checkpoint: no fallback to a clean one
        plant(ckpt / name, marker)
    code, _, err = cli_run(capsys, "train", "--run-dir", str(run_dir), "--resume")
    check(code, err, marker, must_fail=True)
    assert newest.is_dir()
    code, _, err = cli_run(capsys, "evaluate", str(run_dir), "--split", "test")
    check(code, err, marker, must_fail=name == "model.safetensors")


def test_a_checkpoint_manifest(finished_run_copy: Path, marker: Path, capsys: pytest.CaptureFixture) -> None:
    for ckpt in list_checkpoints(finished_run_copy):
        plant(ckpt / "manifest.json", marker)
    code, _, err = cli_run(capsys, "evaluate", str(finished_run_copy), "--split", "test")
    check(code, err, marker, must_fail=True)


RUN_FILES = {  # file of the run -> the commands that read it
    "config.toml": [["evaluate", "{run}", "--split", "test"], ["train", "--run-dir", "{run}", "--resume"]],
    "tokenizer/tokenizer.json": [["evaluate", "{run}", "--split", "test"], ["generate", "{run}", "--prompt", "ab"]],
    "metrics.jsonl": [["train", "--run-dir", "{run}", "--resume"]],
}


@pytest.mark.parametrize("name", list(RUN_FILES))
def test_text_run_files(name: str, finished_run_copy: Path, marker: Path, capsys: pytest.CaptureFixture) -> None:
    plant(finished_run_copy / name, marker)
    for argv in RUN_FILES[name]:
        code, _, err = cli_run(capsys, *(a.format(run=finished_run_copy) for a in argv))
        check(code, err, marker, must_fail=name != "metrics.jsonl")


def test_token_cache_and_results(finished_run_copy: Path, marker: Path, capsys: pytest.CaptureFixture) -> None:
    cache = finished_run_copy / ".cache"
    for path in [p for p in cache.rglob("*") if p.is_file()]:
        plant(path, marker)
    plant(finished_run_copy / "eval_test.json", marker)
    code, out, err = cli_run(capsys, "evaluate", str(finished_run_copy), "--split", "test")
    check(code, err, marker, must_fail=False)
    assert code == 0, "a damaged cache is rebuilt"
    plant(finished_run_copy / "eval_test.json", marker)
    assert "test" not in summarize_run(finished_run_copy)["eval"]
    assert not marker.exists()


def test_export_directory_and_memory_file(
    finished_run_copy: Path, tmp_path: Path, marker: Path, capsys: pytest.CaptureFixture
) -> None:
    export = tmp_path / "export"
    assert cli_run(capsys, "export", str(finished_run_copy), str(export))[0] == 0
    memory = tmp_path / "memory.safetensors"
    plant(memory, marker)
    code, _, err = cli_run(capsys, "generate", str(finished_run_copy), "--load-memory", str(memory))
    check(code, err, marker, must_fail=True)
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        target = tmp_path / f"export-{name}"
        shutil.copytree(export, target)
        plant(target / name, marker)
        code, _, err = cli_run(capsys, "generate", str(target), "--prompt", "ab", "--max-tokens", "2")
        check(code, err, marker, must_fail=True)


# ---------------------------------------------------------------------------------------------------------------
# an agent run: the environments' state (once a pickle inside state.json) and every other file


def test_an_agent_checkpoint_whose_environments_are_a_pickle(
    agent_run_copy: Path, marker: Path, capsys: pytest.CaptureFixture
) -> None:
    """The format an earlier version wrote: base64 of a pickle of the environments, inside state.json."""
    for ckpt in list_checkpoints(agent_run_copy):
        state = json.loads((ckpt / "state.json").read_text())
        pairs = state["data"]["__dict__"]
        envs = next(p for p in pairs if p[0] == "envs")
        envs[1] = base64.b64encode(pickle.dumps([Payload(marker)])).decode("ascii")
        (ckpt / "state.json").write_text(json.dumps(state))
        write_manifest(ckpt, {"step": state["step"]})
    code, _, err = cli_run(capsys, "rl", "train", "--run-dir", str(agent_run_copy), "--resume", "--no-progress")
    check(code, err, marker, must_fail=True)
    assert "pickle" in err


@pytest.mark.parametrize("name", [*CHECKPOINT_FILES, "manifest.json"])
def test_agent_checkpoint_files(name: str, agent_run_copy: Path, marker: Path, capsys: pytest.CaptureFixture) -> None:
    for ckpt in list_checkpoints(agent_run_copy):
        plant(ckpt / name, marker)
    code, _, err = cli_run(capsys, "rl", "train", "--run-dir", str(agent_run_copy), "--resume", "--no-progress")
    check(code, err, marker, must_fail=True)


def test_agent_run_config(agent_run_copy: Path, marker: Path, capsys: pytest.CaptureFixture) -> None:
    plant(agent_run_copy / "config.toml", marker)
    code, _, err = cli_run(capsys, "rl", "train", "--run-dir", str(agent_run_copy), "--resume", "--no-progress")
    check(code, err, marker, must_fail=True)


@pytest.fixture(scope="module")
def agent_run_with_best(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny agent run whose window (2 episodes) fills, so it keeps a best policy (``<run>/best``)."""
    from conftest import AGENT_TINY

    from compressive_transformer import cli

    pytest.importorskip("gymnasium")
    run_dir = tmp_path_factory.mktemp("agent-best") / "run"
    sets = [a for s in [*AGENT_TINY, "train.window=2", "train.log_every=1"] for a in ("--set", s)]
    assert (
        cli.main(["rl", "train", "configs/agents/nonmatching.toml", *sets, "--no-progress", "--run-dir", str(run_dir)])
        == 0
    )
    return run_dir


@pytest.mark.parametrize("name", ["model.safetensors", "state.json", "config.toml", "manifest.json"])
def test_agent_best_policy_files(
    name: str, agent_run_with_best: Path, tmp_path: Path, marker: Path, capsys: pytest.CaptureFixture
) -> None:
    run = tmp_path / "run"
    shutil.copytree(agent_run_with_best, run)
    (best,) = list_checkpoints(run / "best")
    plant(best / name, marker)
    code, _, err = cli_run(capsys, "rl", "evaluate", str(run), "--best", "--episodes", "2", "--no-progress")
    check(code, err, marker, must_fail=name != "config.toml")  # the weights' config is the run's, not this copy
    code, _, err = cli_run(capsys, "rl", "train", "--run-dir", str(run), "--resume", "--no-progress")
    check(code, err, marker, must_fail=False)  # a best whose record does not parse is said and passed over
    if name in ("state.json", "manifest.json"):  # resuming reads the best's record: it is a side copy
        assert code == 0 and err.strip().startswith("warning: the best policy is unusable"), err


# ---------------------------------------------------------------------------------------------------------------
# an imported Transformer-XL checkpoint, results files


@pytest.mark.parametrize(
    "name,torch_save",
    [
        ("config.json", False),
        ("model.safetensors", False),
        ("pytorch_model.bin", True),
        ("pytorch_model.bin", False),
        ("vocab.txt", False),
        ("vocab.pkl", False),
        ("vocab.bin", True),
    ],
)
def test_transfo_xl_sources(
    name: str, torch_save: bool, tmp_path: Path, marker: Path, capsys: pytest.CaptureFixture
) -> None:
    from test_import_transfo_xl import write_checkpoint

    src = write_checkpoint(tmp_path / "src")
    (src / "vocab.pkl").unlink()  # its own payload is the importer's test; this one plants one file at a time
    (src / "vocab.txt").write_text("\n".join(["<eos>", "<unk>"] + [f"w{i}" for i in range(38)]) + "\n")
    if name.startswith("pytorch_model"):
        (src / "model.safetensors").unlink()
    if name in ("vocab.pkl", "vocab.bin"):
        (src / "vocab.txt").unlink()
    plant(src / name, marker, torch_save=torch_save)
    code, _, err = cli_run(capsys, "import", "transfo-xl", str(src), str(tmp_path / "out"))
    check(code, err, marker, must_fail=True)


def test_results_files(tmp_path: Path, marker: Path) -> None:
    result = tmp_path / "results" / "txl" / "seed-0.json"
    plant(result, marker)
    assert read_result(result) is None  # not a result: the study runs that cell again
    plant(tmp_path / "long" / "results.json", marker)
    with pytest.raises(ConfigError) as e:
        with locked_results(tmp_path / "long"):
            pass
    assert "\n" not in str(e.value)
    assert not marker.exists()


def test_the_pickle_would_run_if_unpickled(tmp_path: Path, marker: Path) -> None:
    """The payload is real: plain ``pickle.load`` runs it (so the tests above would see it run)."""
    plant(tmp_path / "x.pkl", marker)
    pickle.loads((tmp_path / "x.pkl").read_bytes())
    assert marker.exists()
