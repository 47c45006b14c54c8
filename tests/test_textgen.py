"""Text generation from the command line: a memory saved and restored continues a document exactly as one
uninterrupted generation would, the memory equals the one evaluation builds over the same tokens, stop strings
cut the text, output streams as it is produced."""

from __future__ import annotations

import io
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from compressive_transformer import cli, load_run
from compressive_transformer.inference.generate import SamplingConfig, generate
from compressive_transformer.inference.textgen import StreamPrinter, generate_text, load_memory, save_memory
from compressive_transformer.runs.presets import TINY_TOML
from compressive_transformer.runs.rundir import config_from_text
from compressive_transformer.training.workflows import train_run

torch.set_num_threads(1)
PROMPT = "def main(argv):\n    parser = argparse.ArgumentParser()\n"  # 56 bytes: the memory fills and compresses


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("textgen")
    cfg = config_from_text(TINY_TOML, ["train.steps=6", "train.progress=false", "train.val_batches=1"])
    train_run(cfg, root / "run", log=lambda s: None)
    return root / "run"


def test_saved_memory_continues_exactly_like_one_generation(run_dir: Path, tmp_path: Path) -> None:
    run = load_run(run_dir, device="cpu")
    ids = run.encode(PROMPT)
    whole = generate(run.model, ids, max_new_tokens=40, sampling=SamplingConfig(temperature=0), keep_logits=True)
    first = generate(
        run.model, ids, max_new_tokens=15, sampling=SamplingConfig(temperature=0), keep_logits=True, return_memory=True
    )
    path = save_memory(tmp_path / "doc.safetensors", run, first.memory, first.next_logits)
    memory, logits = load_memory(path, run)
    rest = generate(
        run.model,
        [],
        max_new_tokens=25,
        sampling=SamplingConfig(temperature=0),
        keep_logits=True,
        memory=memory,
        next_logits=logits,
    )
    assert first.tokens + rest.tokens == whole.tokens
    for a, b in zip(first.logits + rest.logits, whole.logits):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)

    # the saved state is the memory model.forward builds over the same tokens cut the same way (the prompt in
    # segments, then one token per step): what a segment attends to depends on where segments start
    seg = run.config.model.seg_len
    pieces = [ids[i : i + seg] for i in range(0, len(ids), seg)] + [[t] for t in first.tokens]
    state = run.model.init_memory(1)
    for piece in pieces:
        state = run.model(torch.tensor([piece]), memory=state).memory
    for got, want in zip(memory.layers, state.layers):
        assert torch.equal(got.mem_mask, want.mem_mask) and torch.equal(got.cmem_mask, want.cmem_mask)
        torch.testing.assert_close(got.mem[got.mem_mask], want.mem[want.mem_mask], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(got.cmem[got.cmem_mask], want.cmem[want.cmem_mask], rtol=1e-5, atol=1e-5)


def run_cli(capsys: pytest.CaptureFixture, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_memory_files_stops_and_prompt_files(run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    greedy = ["--temperature", "0", "--device", "cpu"]
    run = load_run(run_dir, device="cpu")
    tokens = generate(run.model, run.encode(PROMPT), max_new_tokens=30, sampling=SamplingConfig(temperature=0)).tokens
    code, whole, _ = run_cli(capsys, "generate", str(run_dir), "--prompt", PROMPT, "--max-tokens", "30", *greedy)
    assert code == 0 and whole == PROMPT + run.decode(tokens) + "\n"
    mem = tmp_path / "doc.safetensors"
    code, part1, err = run_cli(
        capsys, "generate", str(run_dir), "--prompt", PROMPT, "--max-tokens", "10", "--save-memory", str(mem), *greedy
    )
    assert code == 0 and mem.is_file() and "--load-memory" in err and part1 == PROMPT + run.decode(tokens[:10]) + "\n"
    code, part2, _ = run_cli(capsys, "generate", str(run_dir), "--load-memory", str(mem), "--max-tokens", "20", *greedy)
    assert code == 0 and part2 == run.decode(tokens[10:]) + "\n"  # the same tokens one generation of 30 draws

    code, _, err = run_cli(capsys, "generate", str(run_dir), "--prompt", "x", "--save-memory", str(mem))
    assert code == 2 and "exists" in err and len(err.strip().splitlines()) == 1  # a file the user made is kept
    code, _, err = run_cli(capsys, "generate", str(run_dir), "--load-memory", str(mem), "--mem-len", "99")
    assert code == 2 and "--mem-len" in err

    continuation = run.decode(tokens)
    stop = next(
        continuation[i : i + 2]
        for i in range(3, len(continuation))
        if continuation[i : i + 2].isascii() and continuation[i : i + 2].isprintable()
    )
    code, out, _ = run_cli(
        capsys,
        "generate",
        str(run_dir),
        "--prompt",
        PROMPT,
        "--max-tokens",
        "30",
        "--stop",
        stop,
        "--stop",
        "\x00",
        *greedy,
    )
    assert code == 0 and out == PROMPT + continuation[: continuation.index(stop)] + "\n"

    prompts = tmp_path / "prompts.txt"
    prompts.write_text("import os\n\nclass A:\\n    pass\n")
    code, out, _ = run_cli(
        capsys,
        "generate",
        str(run_dir),
        "--prompts-file",
        str(prompts),
        "--max-tokens",
        "5",
        "--mem-len",
        "8",
        "--cmem-len",
        "4",
        *greedy,
    )
    assert code == 0 and out.startswith("import os") and "\nclass A:\n    pass" in out


def test_streaming_holds_back_partial_characters_and_possible_stops() -> None:
    fake = SimpleNamespace(decode=lambda ids: bytes(ids).decode("utf-8", errors="replace"))
    out = io.StringIO()
    printer = StreamPrinter(fake, out, stop=["END"])  # type: ignore[arg-type]
    seen = []
    for b in "café E".encode():
        assert printer(b)
        seen.append(out.getvalue())
    assert "\ufffd" not in "".join(seen) and out.getvalue() == "café"  # " E" may begin "END": held back
    assert printer(ord("N")) and not printer(ord("D"))
    assert out.getvalue() == "café " and printer.text == "café " and printer.stopped


def test_generate_text_returns_what_it_streams(run_dir: Path) -> None:
    run = load_run(run_dir)
    out = io.StringIO()
    result = generate_text(run, "import ", max_tokens=20, sampling=SamplingConfig(temperature=0), stream=out)
    assert out.getvalue() == result.text and len(result.generation.tokens) == 20


def test_a_word_level_continuation_does_not_run_into_its_prompt() -> None:
    """Words are joined by spaces: the continuation of "This License" starts with one, whatever word comes."""
    from compressive_transformer.core.models import build_model
    from compressive_transformer.data.tokenizers import ByteTokenizer, WordTokenizer
    from compressive_transformer.inference.textgen import joining_text
    from compressive_transformer.runs.loading import Run

    words = WordTokenizer.train(["This License is machine-readable and this License is free <eos>"])
    assert joining_text(words.decode, 0, 1) == " " and joining_text(ByteTokenizer().decode, 65, 66) == ""
    assert joining_text(ByteTokenizer().decode, 0xC3, 0xA9) == ""  # one character, é, in two bytes
    cfg = config_from_text(TINY_TOML, ["data.tokenizer=words", f"model.vocab_size={len(words.vocab)}"])
    torch.manual_seed(0)
    run = Run(config=cfg, tokenizer=words, model=build_model(cfg.model).eval())
    for prompt, starts in (("This License", " "), ("This License ", "")):
        out = io.StringIO()
        text = generate_text(run, prompt, max_tokens=3, sampling=SamplingConfig(temperature=0), stream=out).text
        assert text == out.getvalue() and text.startswith(starts) and not text.startswith(starts + " "), repr(text)
