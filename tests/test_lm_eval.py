"""Runs of this library through the real lm-evaluation-harness, offline: a local task directory (YAMLs and a few KB of
JSON lines written here) for rolling perplexity, multiple choice and generation. The rolling numbers are those of
``evaluate --text`` on the same documents (every model kind, every tokenizer kind); a trained model answers the
multiple-choice and generation tasks right, so the plumbing is not random. Skips when the extra is not installed."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

for _var in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
    os.environ[_var] = "1"  # before the harness imports datasets, which reads them once

import pytest  # noqa: E402

lm_eval = pytest.importorskip("lm_eval")

from cli_helpers import assert_one_line_error, cli_run  # noqa: E402
from harness_helpers import KINDS, sentences, train_tiny  # noqa: E402
from lm_eval.tasks import TaskManager  # noqa: E402

from compressive_transformer import evaluate_text, load_run  # noqa: E402
from compressive_transformer.core.config import ConfigError  # noqa: E402
from compressive_transformer.harness.model import HarnessModel  # noqa: E402

ROLLING_DOCS = [
    "the cat sat on the mat. a dog ran in the park.\nnaïve café, the end.",
    "a dog ran in the park. " * 12 + "the cat sat on the mat.",
    "the mat",
]
CAT, DOG = "the cat sat on the", "a dog ran in the"
# contexts longer than a 16-token segment: the answer depends on the sentence's start, read through memory
QUESTIONS = [
    {"context": " ".join(s.split()[: -1]), "choices": ["mat.", "park."], "answer": int(s.endswith("park.")),
     "word": s.split()[-1].rstrip(".")}
    for s in (
        f"{CAT} mat. {DOG} park. {CAT} mat.",
        f"{DOG} park. {DOG} park. {CAT} mat. {DOG} park.",
        f"{CAT} mat. {CAT} mat. {CAT} mat. {DOG} park. {DOG} park.",
        f"{DOG} park. {CAT} mat. {CAT} mat.",
        f"{CAT} mat.",
        f"{DOG} park.",
    )
]  # fmt: skip


def write_tasks(root: Path) -> Path:
    """A task directory for ``--include_path``: three YAMLs over JSON-lines files read by the ``json`` builder."""
    root.mkdir(parents=True, exist_ok=True)
    with open(root / "rolling.jsonl", "w", encoding="utf-8") as f:
        f.writelines(json.dumps({"text": d}) + "\n" for d in ROLLING_DOCS)
    with open(root / "choice.jsonl", "w", encoding="utf-8") as f:
        f.writelines(json.dumps(q) + "\n" for q in QUESTIONS)
    data = "dataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {}\ntest_split: test\n"
    (root / "rolling.yaml").write_text(
        "task: ct_rolling\n"
        + data.format(root / "rolling.jsonl")
        + "output_type: loglikelihood_rolling\ndoc_to_text: ''\ndoc_to_target: '{{text}}'\nmetric_list:\n"
        "  - metric: word_perplexity\n  - metric: byte_perplexity\n  - metric: bits_per_byte\n"
    )
    (root / "choice.yaml").write_text(
        "task: ct_choice\n"
        + data.format(root / "choice.jsonl")
        + "output_type: multiple_choice\ndoc_to_text: '{{context}}'\ndoc_to_choice: '{{choices}}'\n"
        "doc_to_target: answer\nmetric_list:\n  - metric: acc\n"
    )
    (root / "generate.yaml").write_text(
        "task: ct_generate\n"
        + data.format(root / "choice.jsonl")
        + "output_type: generate_until\ndoc_to_text: '{{context}}'\ndoc_to_target: '{{word}}'\n"
        "generation_kwargs:\n  until: ['.']\n  max_gen_toks: 5\n  do_sample: false\n"
        "metric_list:\n  - metric: exact_match\n    regexes_to_ignore: [' ']\n"
    )
    return root


@pytest.fixture(autouse=True)
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args, **kwargs):
        raise AssertionError("the harness tests must not touch the network")

    monkeypatch.setattr(socket.socket, "connect", refuse)


@pytest.fixture(scope="module")
def tasks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tasks(tmp_path_factory.mktemp("tasks"))


@pytest.fixture(scope="module")
def task_manager(tasks: Path) -> TaskManager:
    return TaskManager(include_path=str(tasks), include_defaults=False)


@pytest.fixture(scope="module")
def word_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Words, trained until it knows which word ends which sentence (a few seconds)."""
    root = tmp_path_factory.mktemp("words")
    return train_tiny(root, "model.vocab_size=16", "train.lr=3e-3", tokenizer="words", steps=100, docs=sentences(12))


RUNS = {  # every model kind and every tokenizer kind, each at least once
    "compressive-bytes": (KINDS["compressive"], "bytes"),
    "xl-bpe": (KINDS["xl"] + ("data.vocab_size=300", "model.vocab_size=300"), "bpe"),
    "ql-words": (KINDS["ql"] + ("model.vocab_size=40",), "words"),
    "compressive-pretrained": (("model.vocab_size=300",), "pretrained"),
}


@pytest.fixture(scope="module")
def bpe_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return train_tiny(tmp_path_factory.mktemp("bpe"), *RUNS["xl-bpe"][0], tokenizer="bpe", docs=sentences(3))


def evaluate_harness(model: HarnessModel, task_manager: TaskManager, *tasks: str) -> dict:
    return lm_eval.simple_evaluate(model=model, tasks=list(tasks), task_manager=task_manager, log_samples=True)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(RUNS))
def test_rolling_perplexity_equals_evaluate_text(
    name: str, bpe_run: Path, task_manager: TaskManager, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    overrides, tokenizer = RUNS[name]
    if tokenizer == "pretrained":
        overrides = (*overrides, f"data.tokenizer_file={bpe_run / 'tokenizer' / 'tokenizer.json'}")
    run_dir = (
        bpe_run
        if name == "xl-bpe"
        else train_tiny(tmp_path / "run", *overrides, tokenizer=tokenizer, docs=sentences(3))
    )
    out = evaluate_harness(HarnessModel(run=str(run_dir), batch_size=2), task_manager, "ct_rolling")
    harness = out["results"]["ct_rolling"]
    per_doc = [s["resps"][0][0] for s in sorted(out["samples"]["ct_rolling"], key=lambda s: s["doc_id"])]

    files = []
    for i, doc in enumerate(ROLLING_DOCS):
        files.append(tmp_path / f"doc{i}.txt")
        files[-1].write_text(doc, encoding="utf-8")
    code, _, err = cli_run(
        capsys, "evaluate", str(run_dir), "--text", *map(str, files), "--out", str(tmp_path / "e.json")
    )
    assert code == 0, err
    own = json.loads((tmp_path / "e.json").read_text())
    assert -sum(per_doc) == pytest.approx(own["loss"] * own["tokens"], rel=1e-5)
    assert harness["bits_per_byte,none"] == pytest.approx(own["bits_per_byte"], rel=1e-5)
    if own["word_ppl"] is not None:  # the documents neither start nor end with whitespace: same word counts
        assert harness["word_perplexity,none"] == pytest.approx(own["word_ppl"], rel=1e-5)
    run = load_run(run_dir)
    for doc, ll in zip(ROLLING_DOCS, per_doc):  # each document alone in one pass: the harness's number for it
        r = evaluate_text(run, doc, batch_size=1)
        assert ll == pytest.approx(-r.loss * r.tokens, rel=1e-5)


@pytest.mark.slow
def test_a_trained_model_answers_the_multiple_choice_and_generation_tasks(
    word_run: Path, task_manager: TaskManager
) -> None:
    model = HarnessModel(run=str(word_run), batch_size=3)
    out = evaluate_harness(model, task_manager, "ct_choice", "ct_generate")
    assert out["results"]["ct_choice"]["acc,none"] == 1.0  # chance is 1/2 and a model blind to context gets 1/2
    assert out["results"]["ct_generate"]["exact_match,none"] == 1.0
    generated = sorted(out["samples"]["ct_generate"], key=lambda s: s["doc_id"])
    assert [s["resps"][0][0] for s in generated] == [" " + q["word"] for q in QUESTIONS]  # stopped before "."


def test_the_command_registers_the_model_and_runs_the_harness(
    word_run: Path, tasks: Path, tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    import lm_eval.tasks

    class LocalTasksOnly(TaskManager):  # indexing the harness's thousands of built-in tasks takes half a minute
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **{**kwargs, "include_defaults": False})

    monkeypatch.setattr(lm_eval.tasks, "TaskManager", LocalTasksOnly)
    out = tmp_path / "results"
    code, stdout, err = cli_run(
        capsys, "lm-eval", str(word_run), "--tasks", "ct_choice", "--include_path", str(tasks),
        "--batch_size", "2", "--device", "cpu", "--output_path", str(out),
        "--model_args", "mem_len=32,batch_size=3,device=cpu",  # the documented keys, beside the harness's own options
    )  # fmt: skip
    assert code == 0, err
    (results,) = out.rglob("results_*.json")
    record = json.loads(results.read_text())
    assert record["results"]["ct_choice"]["acc,none"] == 1.0
    assert "mem_len" in json.dumps(record["config"]["model_args"])
    code, _, err = cli_run(capsys, "lm-eval", str(word_run), "--model", "hf", "--tasks", "ct_choice")
    assert_one_line_error(code, err, "--model")


@pytest.mark.slow
def test_offline_a_task_whose_dataset_is_on_the_hub_fails_at_once_in_one_line(
    word_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No network and no cached dataset: a note, then one error line naming the dataset and what to do; no retries,
    and nothing said about checkpoints, which the command never touches."""
    import datasets.config
    import huggingface_hub.constants
    import lm_eval.tasks

    from compressive_transformer.harness import offline

    class LocalTasksOnly(TaskManager):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **{**kwargs, "include_defaults": False})

    monkeypatch.setattr(lm_eval.tasks, "TaskManager", LocalTasksOnly)
    for variable in offline.OFFLINE_VARIABLES:
        monkeypatch.delenv(variable, raising=False)  # as on a user's machine: not offline until the probe says so
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(offline, "hub_reachable", lambda timeout=3.0: False)
    (tmp_path / "hub_task.yaml").write_text(  # the shape of the harness's own wikitext task: a dataset on the Hub
        "task: hub_task\ndataset_path: EleutherAI/no_such_dataset_here\noutput_type: loglikelihood_rolling\n"
        "test_split: test\ndoc_to_text: ''\ndoc_to_target: '{{page}}'\nmetric_list:\n  - metric: word_perplexity\n"
    )
    code, _, err = cli_run(
        capsys, "lm-eval", str(word_run), "--tasks", "hub_task", "--include_path", str(tmp_path), "--device", "cpu"
    )
    lines = err.strip().splitlines()
    assert code == 2 and "Retrying" not in err, err
    # the note, then the error: none of the harness's INFO and WARNING lines in between, which buried it
    assert len(lines) == 2 and lines[0].startswith("note: huggingface.co cannot be reached"), err
    assert lines[-1].startswith("error: lm-eval: ") and "no_such_dataset_here" in lines[-1], err
    assert "cannot be reached" in lines[-1] and "checkpoints" not in err, err


def test_model_args_set_lengths_precision_and_batch_and_bad_ones_are_refused(word_run: Path) -> None:
    model = HarnessModel.create_from_arg_string(
        f"run={word_run},mem_len=4,cmem_len=2,seg_len=8,dtype=bfloat16", {"batch_size": "5", "device": "cpu"}
    )
    e = model.run.config.eval
    assert (e.mem_len, e.cmem_len, e.seg_len, e.amp, model.batch_size) == (4, 2, 8, "bf16", 5)
    assert (model.run.mem_len, model.run.seg_len) == (4, 8)
    for args, fragment in (("foo=1", "foo"), ("dtype=float8", "dtype"), ("mem_len=x", "mem_len")):
        with pytest.raises(ConfigError, match=fragment):
            HarnessModel.create_from_arg_string(f"run={word_run},{args}")
    with pytest.raises(ConfigError, match="prefix"):
        HarnessModel.create_from_arg_string(f"run={word_run},prefix=\\n")  # whitespace: no word at all
    with pytest.raises(ConfigError, match="run=RUN_DIR"):
        HarnessModel()


def test_batch_size_and_device_in_model_args_win_over_the_harness_defaults(word_run: Path) -> None:
    """The harness passes its --batch_size/--device (defaults included) beside --model_args: the same keys in
    --model_args raised "got multiple values for keyword argument 'batch_size'"."""
    harness = {"batch_size": 1, "max_batch_size": None, "device": "cuda:0"}
    model = HarnessModel.create_from_arg_string(f"run={word_run},batch_size=2,device=cpu", harness)
    assert model.batch_size == 2 and model.run.device.type == "cpu"
    model = HarnessModel.create_from_arg_obj({"run": str(word_run), "batch_size": 4}, harness)
    assert model.batch_size == 4
    assert HarnessModel.create_from_arg_string(f"run={word_run}", {"batch_size": 5}).batch_size == 5


def test_an_empty_context_needs_a_prefix_and_a_prefix_is_read_but_never_scored(word_run: Path) -> None:
    request = SimpleNamespace(args=("", "the cat"))
    with pytest.raises(ConfigError, match="prefix="):
        HarnessModel(run=str(word_run)).loglikelihood([request], disable_tqdm=True)
    model = HarnessModel(run=str(word_run), prefix="mat.")
    ((empty, _),) = model.loglikelihood([request], disable_tqdm=True)
    ((after, _),) = model.loglikelihood([SimpleNamespace(args=("mat.", " the cat"))], disable_tqdm=True)
    assert empty == pytest.approx(after, rel=1e-6)
    (rolled,) = model.loglikelihood_rolling([SimpleNamespace(args=("the cat",))], disable_tqdm=True)
    assert rolled == pytest.approx(after, rel=1e-6)  # both tokens scored, after the prefix


def test_an_exported_model_gives_the_run_directorys_numbers(word_run: Path, tmp_path: Path) -> None:
    from compressive_transformer import export_run

    exported = export_run(word_run, tmp_path / "export")
    requests = [SimpleNamespace(args=(QUESTIONS[1]["context"], " park."))]
    rolling = [SimpleNamespace(args=(ROLLING_DOCS[0],))]
    a, b = HarnessModel(run=str(word_run)), HarnessModel(pretrained=str(exported))
    assert a.loglikelihood(requests, disable_tqdm=True) == b.loglikelihood(requests, disable_tqdm=True)
    assert a.loglikelihood_rolling(rolling, disable_tqdm=True) == b.loglikelihood_rolling(rolling, disable_tqdm=True)


def test_generation_is_greedy_unless_the_task_samples_and_stops_at_a_string_or_the_token_limit(word_run: Path) -> None:
    model = HarnessModel(run=str(word_run), seed=7)
    context = QUESTIONS[0]["context"]

    def gen(**kwargs) -> str:
        (text,) = model.generate_until([SimpleNamespace(args=(context, kwargs))], disable_tqdm=True)
        return text

    greedy = gen(until=["\n"], max_gen_toks=3)
    assert greedy.startswith(" mat.") and len(greedy.split()) == 3
    assert gen(until="\n", max_gen_toks=3, temperature=0.9) == greedy  # no do_sample: greedy, as in the harness
    assert gen(until=["."], max_gen_toks=3) == " mat"  # cut before the stop string
    sampled = [gen(until=["\n"], max_gen_toks=8, do_sample=True, temperature=1.5) for _ in range(2)]
    assert sampled[0] == sampled[1]  # seeded


def test_the_command_line_says_which_of_two_settings_wins_and_asks_for_no_device(word_run: Path) -> None:
    """`--model_args batch_size=2 --batch_size 4` ran with no word on which won; with no --device the harness's
    default cuda:0 made a CPU machine say "CUDA is not available" though the user asked for nothing."""
    from compressive_transformer.commands.lm_eval import harness_argv, model_args, setting_notes

    args = ["--tasks", "t", "--model_args", "batch_size=2,mem_len=8", "--batch_size", "4"]
    (note,) = setting_notes(args)
    assert note == (
        "note: --batch_size 4 and --model_args batch_size=2 both set the batch size; the model uses "
        "--model_args batch_size=2"
    )
    assert setting_notes(["--batch_size", "2", "--model_args", "batch_size=2"]) == []  # the same value: nothing
    assert model_args(["-a", "x=1", "y=2", "--model_args=z=3,x=4"]) == {"x": "4", "y": "2", "z": "3"}
    assert f"pretrained={word_run},device=auto" in harness_argv(word_run, ["--tasks", "t"])
    for asked in (["--device", "cpu"], ["--device=cpu"], ["--model_args", "device=cpu"]):
        assert f"pretrained={word_run}" in harness_argv(word_run, ["--tasks", "t", *asked])


def test_a_bad_batch_size_is_named_as_the_integer_it_is(word_run: Path) -> None:
    """`batch_size=-1` was reported as "--batch_size -1.0", and 2.5 was silently read as 2."""
    with pytest.raises(ConfigError, match=r"^batch_size -1: must be a positive integer") as e:
        HarnessModel.create_from_arg_string(f"run={word_run}", {"batch_size": -1.0})
    assert "-1.0" not in str(e.value)
    with pytest.raises(ConfigError, match="batch_size=2.5"):
        HarnessModel.create_from_arg_string(f"run={word_run}", {"batch_size": 2.5})
    assert HarnessModel.create_from_arg_string(f"run={word_run}", {"batch_size": 3.0}).batch_size == 3


def test_the_harness_asks_git_quietly_outside_a_repository(tmp_path: Path) -> None:
    code = (
        "import lm_eval.evaluator as e\n"
        "from compressive_transformer.commands.lm_eval import quiet_git_hash\n"
        "before = e.get_git_commit_hash\n"
        "with quiet_git_hash():\n"
        "    print(e.get_git_commit_hash())\n"
        "assert e.get_git_commit_hash is before\n"
    )
    env = {
        **os.environ,
        "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src"),
        "GIT_CEILING_DIRECTORIES": str(tmp_path),
    }
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0 and "fatal" not in done.stderr, done.stderr
    assert done.stdout.strip() == "None"
