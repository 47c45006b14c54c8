"""What a new user runs into: a command without its output directory, Ctrl-C while a run is set up, a kill between
the final checkpoint and the final validation, a full disk, running out of memory, a vocabulary the tokenizer
cannot have, bad memory arguments, a binary file given as text, and a kill while a result file is written. Each ends
in one line that says what happened and what to do, and nothing a resume trusts is ever left torn."""

from __future__ import annotations

import contextlib
import errno
import io
import json
from pathlib import Path
from typing import Any, Iterator

import pytest
import safetensors
import torch
from cli_helpers import FAST, assert_one_line_error, cli_run
from conftest import tiny_config

from compressive_transformer import cli
from compressive_transformer.commands.interrupted import interrupted_message
from compressive_transformer.core.config import to_dict
from compressive_transformer.core.fileio import write_text_atomic
from compressive_transformer.core.models import build_model
from compressive_transformer.experiments import ablation, compare, long_range
from compressive_transformer.experiments.long_range import PRESETS
from compressive_transformer.experiments.long_range_results import locked_results
from compressive_transformer.inference import text_eval
from compressive_transformer.inference import workflows as run_module
from compressive_transformer.runs.checkpoint import list_checkpoints
from compressive_transformer.runs.metrics import METRICS_FILE, MetricsLogger, read_metrics
from compressive_transformer.training.trainer import Trainer

torch.set_num_threads(1)


@pytest.fixture
def finished(finished_run: Path) -> Path:
    return finished_run


@pytest.fixture
def run_copy(finished_run_copy: Path) -> Path:
    return finished_run_copy


# ---------------------------------------------------------------------------------------------------------------
# output directories: never a traceback, never the source tree


def test_seeded_long_range_without_out_is_one_line(capsys: pytest.CaptureFixture) -> None:
    code, _, err = cli_run(capsys, "task", "long-range", "--preset", "quick", "--seeds", "0,1")
    assert_one_line_error(code, err, "--out")


@pytest.mark.parametrize("entry", [long_range.run_long_range, ablation.run_seeded], ids=["long_range", "seeded"])
def test_library_calls_need_an_output_directory(entry: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without one they used to write into benchmarks/ of whatever directory they ran in (the repository's)."""

    def never(*args: Any, **kwargs: Any) -> dict:
        raise AssertionError("trained without an output directory")

    monkeypatch.setattr(long_range, "run_one", never)
    monkeypatch.setattr(ablation, "run_one", never)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(TypeError, match="out_dir"):
        entry("quick", tasks=("passkey",), models=("txl",), log=lambda _: None)
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------------------------------------------------------
# Ctrl-C while a run is set up: the advice matches what was left


def test_ctrl_c_during_setup_gives_advice_that_works(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    run_dir = tmp_path / "run"

    def interrupted(self: Trainer, *args: Any, **kwargs: Any) -> None:
        assert (run_dir / "config.toml").is_file()  # after config.toml appeared, before the first step
        raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setattr(Trainer, "__init__", interrupted)
        code, _, err = cli_run(capsys, "train", "--run-dir", str(run_dir), *FAST)
    assert code == 130 and len(err.strip().splitlines()) == 1, err
    assert not run_dir.exists(), "a run interrupted while it was set up is removed"
    assert "--resume" not in err and "nothing was kept" in err and "start it again" in err, err
    assert cli.main(["train", "--run-dir", str(run_dir), *FAST]) == 0, "the advice works"


def test_ctrl_c_after_setup_advises_resume_of_that_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    run_dir = tmp_path / "run"
    with monkeypatch.context() as m:
        m.setattr(Trainer, "train_step", lambda self: (_ for _ in ()).throw(KeyboardInterrupt()))
        code, _, err = cli_run(capsys, "train", "--run-dir", str(run_dir), *FAST)
    assert code == 130 and f"train --run-dir {run_dir} --resume" in err, err
    code, out, err = cli_run(capsys, "train", "--run-dir", str(run_dir), "--resume")
    assert code == 0 and "at step 0" in out, err


def test_ctrl_c_in_other_commands_promises_no_resume(run_copy: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.setattr(run_module, "evaluate", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt()))
    code, _, err = cli_run(capsys, "evaluate", str(run_copy))
    assert code == 130 and "interrupted" in err and "--resume" not in err, err


def test_ctrl_c_advice_follows_what_the_directory_holds(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    assert "nothing was kept" in interrupted_message("train", run_dir)
    run_dir.mkdir()
    (run_dir / ".lock").touch()
    assert "nothing was kept" in interrupted_message("train", run_dir), "a lock alone is no run"
    (run_dir / "tokenizer").mkdir()  # a removal interrupted half-way
    assert "holds no complete run: delete it" in interrupted_message("train", run_dir)
    (run_dir / "config.toml").touch()
    assert f"--run-dir {run_dir} --resume" in interrupted_message("train", run_dir)
    assert "rerun the same command" in interrupted_message("study")
    assert "rerun the same command" in interrupted_message("task", seeded=True)
    assert interrupted_message("task") == interrupted_message("evaluate") == "interrupted"


# ---------------------------------------------------------------------------------------------------------------
# a kill between the final checkpoint and the final validation


def test_resuming_a_finished_run_writes_its_missing_final_validation(
    tmp_path: Path, finished: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    run_dir = tmp_path / "run"
    steps = 6

    def killed_at_the_end(self: Trainer) -> None:
        if self.step == steps:
            raise KeyboardInterrupt
        return real(self)

    real = Trainer._log_validation
    with monkeypatch.context() as m:
        m.setattr(Trainer, "_log_validation", killed_at_the_end)
        assert cli.main(["train", "--run-dir", str(run_dir), *FAST]) == 130
    final = lambda d: [r for r in read_metrics(d) if r["step"] == steps and "val_loss" in r]  # noqa: E731
    assert list_checkpoints(run_dir)[-1].name == f"step-{steps:08d}" and final(run_dir) == []
    code, out, err = cli_run(capsys, "train", "--run-dir", str(run_dir), "--resume")
    assert code == 0, err
    assert "nothing to do" not in out and "validation" in out, out
    assert final(run_dir) == final(finished), "the record an uninterrupted run writes"
    code, out, _ = cli_run(capsys, "train", "--run-dir", str(run_dir), "--resume")
    assert code == 0 and "nothing to do" in out and len(final(run_dir)) == 1


# ---------------------------------------------------------------------------------------------------------------
# a full disk while a checkpoint is written


NO_SPACE = [
    safetensors.SafetensorError(
        'Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "No space left on device" })'
    ),
    OSError(errno.ENOSPC, "No space left on device"),
]


@pytest.mark.parametrize("error", NO_SPACE, ids=["safetensors", "oserror"])
def test_disk_full_at_a_checkpoint_is_one_line_and_the_run_resumes(
    error: Exception,
    tmp_path: Path,
    finished: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
) -> None:
    run_dir = tmp_path / "run"
    real = safetensors.torch.save_model

    def full_at_step_4(model: torch.nn.Module, filename: str, *args: Any, **kwargs: Any) -> None:
        if "step-00000004" in filename:
            raise error
        return real(model, filename, *args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(safetensors.torch, "save_model", full_at_step_4)
        code, _, err = cli_run(capsys, "train", "--run-dir", str(run_dir), *FAST)
    assert_one_line_error(code, err, "step 4", "No space left on device", "step-00000002", "--resume")
    assert [p.name for p in list_checkpoints(run_dir)] == ["step-00000002"]
    assert not list((run_dir / "checkpoints").glob(".tmp-*")), "no half-written checkpoint left"
    code, out, err = cli_run(capsys, "train", "--run-dir", str(run_dir), "--resume")
    assert code == 0 and "at step 2" in out, err
    assert (list_checkpoints(run_dir)[-1] / "model.safetensors").read_bytes() == (
        list_checkpoints(finished)[-1] / "model.safetensors"
    ).read_bytes()


# ---------------------------------------------------------------------------------------------------------------
# out of memory at sizes the budget check accepts


CPU_OOM = RuntimeError(
    "[enforce fail at alloc_cpu.cpp:118] data. DefaultCPUAllocator: can't allocate memory: you tried to allocate "
    "68719476736 bytes. Error code 12 (Cannot allocate memory)"
)
OUT_OF_MEMORY = [CPU_OOM, torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 64.00 GiB"), MemoryError()]


def _raise(error: BaseException) -> Any:
    def fail(*args: Any, **kwargs: Any) -> None:
        raise error

    return fail


@pytest.mark.parametrize("error", OUT_OF_MEMORY, ids=["cpu", "cuda", "python"])
def test_out_of_memory_in_training_names_the_sizes(
    error: BaseException, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.setattr(Trainer, "train_step", _raise(error))
    code, _, err = cli_run(capsys, "train", "--run-dir", str(tmp_path / "run"), *FAST)
    assert_one_line_error(
        code,
        err,
        "out of memory",
        "train.batch_size = 4",
        "model.seg_len = 16",
        "model.memory.mem_len",
        "model.memory.cmem_len",
    )


def test_the_advice_after_out_of_memory_before_the_first_checkpoint_works_in_the_same_run_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """The run directory kept its config.toml and tokenizer, and starting it again with lower sizes (the advice)
    in the same --run-dir was refused ("choose another --run-dir")."""
    run_dir = tmp_path / "run"
    with monkeypatch.context() as m:
        m.setattr(Trainer, "train_step", _raise(CPU_OOM))
        code, _, err = cli_run(capsys, "train", "--run-dir", str(run_dir), *FAST)
    assert_one_line_error(code, err, "out of memory", "in the same --run-dir while it has no checkpoint")
    assert (run_dir / "config.toml").is_file() and not list_checkpoints(run_dir)
    code, out, err = cli_run(capsys, "train", "--run-dir", str(run_dir), *FAST, "--set", "train.batch_size=2")
    assert code == 0, err
    assert "stopped before its first checkpoint" in out
    assert "batch_size = 2" in (run_dir / "config.toml").read_text()
    code, _, err = cli_run(capsys, "train", "--run-dir", str(run_dir), *FAST)  # now it holds checkpoints: refused
    assert_one_line_error(code, err, "already holds a run", "--resume")


def test_out_of_memory_in_validation_names_the_eval_sizes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.setattr(Trainer, "validate", _raise(CPU_OOM))
    code, _, err = cli_run(capsys, "train", "--run-dir", str(tmp_path / "run"), *FAST)
    assert_one_line_error(code, err, "out of memory", "validating", "eval.batch_size", "eval.seg_len")


def test_out_of_memory_in_evaluation_names_the_eval_sizes(
    run_copy: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.setattr(run_module, "evaluate", _raise(CPU_OOM))
    code, _, err = cli_run(capsys, "evaluate", str(run_copy), "--set", "eval.seg_len=32")
    assert_one_line_error(code, err, "out of memory", "eval.batch_size = 4", "eval.seg_len = 32")
    text = tmp_path / "notes.txt"
    text.write_text("some text to score " * 20)
    monkeypatch.setattr(text_eval, "evaluate", _raise(CPU_OOM))
    code, _, err = cli_run(capsys, "evaluate", str(run_copy), "--text", str(text))
    assert_one_line_error(code, err, "out of memory", "eval.batch_size", "eval.seg_len")


def test_other_runtime_errors_are_not_called_out_of_memory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Trainer, "train_step", _raise(RuntimeError("a bug")))
    with pytest.raises(RuntimeError, match="a bug"):
        cli.main(["train", "--run-dir", str(tmp_path / "run"), *FAST])


# ---------------------------------------------------------------------------------------------------------------
# a vocabulary the tokenizer cannot have


def test_a_byte_run_with_another_vocabulary_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    run_dir = tmp_path / "run"
    code, _, err = cli_run(capsys, "train", "--run-dir", str(run_dir), *FAST, "--set", "model.vocab_size=100")
    assert_one_line_error(code, err, "model.vocab_size", "100", "256")
    assert not run_dir.exists()


def test_a_learned_vocabulary_of_another_size_is_said(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    run_dir = tmp_path / "run"
    code, out, err = cli_run(
        capsys,
        "train",
        "--run-dir",
        str(run_dir),
        *FAST,
        "--set",
        "data.tokenizer=words",
        "--set",
        "model.vocab_size=7",
    )
    assert code == 0, err
    note = [line for line in out.splitlines() if "model.vocab_size" in line]
    assert len(note) == 1 and "7" in note[0] and "words" in note[0], out


# ---------------------------------------------------------------------------------------------------------------
# memory arguments


@pytest.mark.parametrize("kind", ["ct", "ql"])
@pytest.mark.parametrize("batch_size", [-1, -8])
def test_init_memory_with_a_bad_batch_size_is_a_value_error(kind: str, batch_size: Any) -> None:
    cfg = (
        tiny_config()
        if kind == "ct"
        else tiny_config(
            scales=(1, 1),
            output_layers=0,
            n_layers=2,
            cmem_len=0,
            compression="max_pool",
            compression_loss="none",
        )
    )
    with pytest.raises(ValueError, match="batch_size"):
        build_model(cfg).init_memory(batch_size)


@pytest.mark.parametrize(
    "rows", [torch.tensor([True, False, True]), torch.tensor([True]), [0, 5], torch.tensor([-3])], ids=str
)
def test_reset_with_rows_of_another_batch_is_a_value_error(rows: Any) -> None:
    memory = build_model(tiny_config()).init_memory(2)
    with pytest.raises(ValueError, match="rows"):
        memory.reset(rows)


def test_reset_with_good_rows_still_works() -> None:
    memory = build_model(tiny_config()).init_memory(3)
    for rows in (torch.tensor([True, False, True]), [0, 2], torch.tensor([1]), [-1]):
        memory.reset(rows)


# ---------------------------------------------------------------------------------------------------------------
# a binary file given as text


def test_evaluating_a_binary_file_as_text_is_refused_unless_asked(
    run_copy: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    binary = tmp_path / "program"
    binary.write_bytes(b"\x7fELF\x02\x01\x01" + bytes(range(256)) * 8)
    code, _, err = cli_run(capsys, "evaluate", str(run_copy), "--text", str(binary))
    assert_one_line_error(code, err, str(binary), "not text", "--allow-binary")
    assert not list(run_copy.glob("eval_text-*.json"))
    code, _, err = cli_run(capsys, "evaluate", str(run_copy), "--text", str(binary), "--allow-binary")
    assert code == 0, err


def test_text_with_a_few_bytes_that_are_not_utf8_is_still_text(run_copy: Path, tmp_path: Path, capsys) -> None:
    latin1 = tmp_path / "café.txt"
    latin1.write_bytes("Un café, une crème brûlée et la forêt. ".encode("latin-1") * 20)
    code, _, err = cli_run(capsys, "evaluate", str(run_copy), "--text", str(latin1))
    assert code == 0, err


@pytest.mark.parametrize(
    "data,binary",
    [
        (b"plain text\n" * 10, False),
        ("naïve façade — ünïcode\n".encode() * 10, False),
        ("une forêt\n".encode("latin-1") * 10, False),
        (b"text\x00with a NUL", True),
        (b"\x01\x02\x03 valid UTF-8 but control characters" * 4, True),
        ("\x01\x02\x03 valid UTF-8 but control characters", True),
        ("plain text as str\n", False),
        (bytes(range(128, 256)) * 4, True),
        ("text".encode("utf-16"), True),
        (b"", False),
    ],
)
def test_binary_detection(data: str | bytes, binary: bool) -> None:
    assert (text_eval.binary_reason(data) is not None) == binary


# ---------------------------------------------------------------------------------------------------------------
# a kill mid-write never leaves a torn result file


class _TornFile:
    """A file opened for writing that writes half of what it is given, then fails (a kill in the middle)."""

    def __init__(self, f: Any) -> None:
        self._f = f

    def write(self, data: Any) -> int:
        self._f.write(data[: len(data) // 2])
        self._f.flush()
        raise OSError(errno.EIO, "killed mid-write")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._f, name)

    def __enter__(self) -> "_TornFile":
        return self

    def __exit__(self, *exc: Any) -> None:
        self._f.close()


@contextlib.contextmanager
def torn_writes(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every file opened for writing while active is torn (``Path.write_text``, ``open`` and ``os.fdopen`` all go
    through ``io.open``)."""
    real = io.open

    def opening(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        f = real(file, mode, *args, **kwargs)
        return _TornFile(f) if any(c in mode for c in "wax") else f

    with monkeypatch.context() as m:
        m.setattr(io, "open", opening)
        yield


def _intact(path: Path, old: str) -> None:
    assert path.read_text(encoding="utf-8") == old, f"{path} was torn"
    assert [p.name for p in path.parent.iterdir() if "tmp" in p.name] == [], "a temporary file was left"


def test_atomic_writes_leave_the_permissions_a_plain_write_would(tmp_path: Path) -> None:
    plain, atomic = tmp_path / "plain.json", tmp_path / "atomic.json"
    plain.write_text("{}")
    write_text_atomic(atomic, "{}")
    assert atomic.stat().st_mode == plain.stat().st_mode, "not mkstemp's 0600"
    atomic.chmod(0o640)
    write_text_atomic(atomic, "[]")
    assert atomic.stat().st_mode & 0o777 == 0o640, "a replaced file keeps its mode"


def test_the_seeded_summary_is_never_torn(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ablation.run_seeded("quick", tmp_path, models=("txl",), seeds=(0,), log=lambda _: None)
    old = {name: (tmp_path / name).read_text() for name in ("seeds.json", "seeds.md")}
    with torn_writes(monkeypatch), pytest.raises(OSError, match="mid-write"):
        ablation.run_seeded("quick", tmp_path, models=("txl",), seeds=(0,), log=lambda _: None, command="again")
    for name, text in old.items():
        _intact(tmp_path / name, text)


def test_a_cell_record_is_never_torn(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cell, run = ablation.plan_cells(PRESETS["quick"], tasks=("passkey",), models=("txl",), seeds=(0,), budget=1)[0]
    record = {"task": "passkey", "train": to_dict(run.train), "task_config": to_dict(run.task)}
    monkeypatch.setattr(ablation, "run_one", lambda run: record)
    ablation.run_cell(cell, run, tmp_path)
    old = cell.path(tmp_path).read_text()
    with torn_writes(monkeypatch), pytest.raises(OSError, match="mid-write"):
        ablation.run_cell(cell, run, tmp_path)
    _intact(cell.path(tmp_path), old)


def test_a_task_result_is_never_torn(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _, run = ablation.plan_cells(PRESETS["quick"], tasks=("passkey",), models=("txl",), seeds=(0,), budget=1)[0]
    (tmp_path / "result.json").write_text('{"an": "earlier result"}\n')
    monkeypatch.setattr(long_range, "run_one", lambda run, log: {"task": "passkey"})
    with torn_writes(monkeypatch), pytest.raises(OSError, match="mid-write"):
        long_range.run_task(run, tmp_path, log=lambda _: None)
    _intact(tmp_path / "result.json", '{"an": "earlier result"}\n')


def test_the_long_range_results_are_never_torn(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with locked_results(tmp_path) as results:
        results["runs"] = [{"task": "passkey", "name": "txl"}]
    old = (tmp_path / "results.json").read_text()
    with torn_writes(monkeypatch), pytest.raises(OSError, match="mid-write"):
        with locked_results(tmp_path) as results:
            results["runs"] = []
    _intact(tmp_path / "results.json", old)


def test_compare_results_are_never_torn(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    row = {"variant": "a", "model": "Transformer-XL", "n_s/n_m/n_cm": "16/16/-", "window": 32, "context_avg": 24.0}
    row |= {"split": "test", "eval_complete": True, "eval_tokens": 100, "bits_per_token": 1.5, "bits_per_char": 1.5}
    rows: list[dict[str, Any]] = [row | {"ppl": 2.8, "tokens_per_s": 1000.0, "parameters": 10}]
    compare.write_results(tmp_path, rows)
    old = {name: (tmp_path / name).read_text() for name in ("results.json", "results.md")}
    with torn_writes(monkeypatch), pytest.raises(OSError, match="mid-write"):
        compare.write_results(tmp_path, rows + rows)
    for name, text in old.items():
        _intact(tmp_path / name, text)


def test_resume_never_tears_the_metrics(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    logger = MetricsLogger(tmp_path, tensorboard=False)
    for step in range(1, 5):
        logger.log({"step": step, "loss": 1.0 / step})
    old = (tmp_path / METRICS_FILE).read_text()
    with torn_writes(monkeypatch), pytest.raises(OSError, match="mid-write"):
        MetricsLogger(tmp_path, tensorboard=False).truncate_after(2)
    _intact(tmp_path / METRICS_FILE, old)
    assert [json.loads(line)["step"] for line in old.splitlines()] == [1, 2, 3, 4]


def test_no_result_is_written_in_place() -> None:
    """Every module writes the files a reader or a resume trusts through ``fileio.write_text_atomic`` (or into a
    temporary directory renamed whole): no ``write_text``, ``json.dump`` or ``open(..., "w")`` on a final path."""
    import compressive_transformer

    root = Path(compressive_transformer.__file__).parent
    # writes into a temporary directory that is renamed into place as a whole, or into an mkstemp file
    whole_directory = {"runs/checkpoint.py", "runs/integrity.py", "runs/export.py", "core/fileio.py"}
    offenders = []
    for path in sorted(root.rglob("*.py")):
        name = path.relative_to(root).as_posix()
        if name in whole_directory:
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            code = line.split("#", 1)[0]
            if ".write_text(" in code or "json.dump(" in code or ', "w"' in code or ", 'w'" in code:
                offenders.append(f"{name}:{number}: {line.strip()}")
    assert offenders == []


def test_resume_refuses_a_vocabulary_override_it_would_drop(run_copy: Path, capsys) -> None:
    """A run's vocabulary is its tokenizer's: --resume --set model.vocab_size=N would be replaced silently."""

    def files() -> list[tuple[str, bytes]]:
        return sorted((str(p), p.read_bytes()) for p in run_copy.rglob("*") if p.is_file() and p.name != ".lock")

    before = files()
    code, _, err = cli_run(capsys, "train", "--run-dir", str(run_copy), "--resume", "--set", "model.vocab_size=300")
    assert_one_line_error(code, err, "model.vocab_size = 300", "256 ids", "drop the override")
    assert files() == before
    # the size the run has is not a change: the override is accepted (here, a finished run has nothing to do)
    code, _, err = cli_run(capsys, "train", "--run-dir", str(run_copy), "--resume", "--set", "model.vocab_size=256")
    assert "vocab_size" not in err, err
