"""Text generation for people: streaming to a terminal as tokens are drawn, stop strings, several prompts, and the
memory saved to a safetensors file so a long document can be continued in a later call exactly where it stopped."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Callable, Sequence

import safetensors.torch
import torch

from compressive_transformer.core.config import ConfigError, to_dict
from compressive_transformer.core.fileio import create_file, read_utf8, replace_file
from compressive_transformer.core.memory import MemoryState
from compressive_transformer.core.modality import TEXT, binary_reason, require_modality
from compressive_transformer.inference.generate import (
    Generation,
    SamplingConfig,
    check_sampling,
    clean_prompt,
    generate,
)
from compressive_transformer.runs.checkpoint import non_finite
from compressive_transformer.runs.loading import Run
from compressive_transformer.runs.precision import generation_amp

MEMORY_FORMAT = "compressive-transformer-memory-v1"


def model_fingerprint(run: Run) -> str:
    """A hash of the model config: a memory file fits only a model of this shape (see :func:`weights_fingerprint`
    for the weights themselves)."""
    return hashlib.sha256(json.dumps(to_dict(run.config.model), sort_keys=True).encode()).hexdigest()[:16]


def weights_fingerprint(model: torch.nn.Module) -> str:
    """A hash of every weight of ``model`` (names, dtypes, shapes and bytes): a memory holds what these weights made
    of a text, and continues it only in them, not in another run of the same config."""
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        t = t.detach().cpu().contiguous()
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)};".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())  # raw bytes: bfloat16 has no numpy type
    return h.hexdigest()[:16]


def save_memory(
    path: str | Path, run: Run, memory: MemoryState, next_logits: torch.Tensor, *, replace: bool = False
) -> Path:
    """Write the memory state and the next token's logits to ``path`` (safetensors) with the fingerprints of the
    model and its weights; returns the file written. A new file is created exclusively (a name taken meanwhile gets
    the next free one); ``replace`` (the memory file a generation continued) replaces it atomically."""
    tensors = {k: v.detach().cpu().clone() for k, v in memory.to_tensors().items()}  # layers may share mask tensors
    tensors["next_logits"] = next_logits.detach().float().cpu().contiguous()
    meta = {
        "format": MEMORY_FORMAT,
        "model": model_fingerprint(run),
        "weights": weights_fingerprint(run.model),
        "checkpoint": str(run.checkpoint),
    }

    def write(tmp: Path) -> None:
        safetensors.torch.save_file(tensors, str(tmp), metadata=meta)

    if replace:
        return replace_file(Path(path), write)
    return create_file(Path(path), write, what="--save-memory")


def load_memory(path: str | Path, run: Run) -> tuple[MemoryState, torch.Tensor]:
    """The memory state and next-token logits saved by :func:`save_memory`, on the run's device, after checking that
    they were made by this model's weights."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"--load-memory: {path} does not exist; write one with --save-memory")
    try:
        with safetensors.safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in f.keys()}
    except Exception as e:  # safetensors raises its own error types for a damaged file
        raise ConfigError(f"--load-memory: {path} is not a memory file ({e}); write one with --save-memory") from None
    if meta.get("format") != MEMORY_FORMAT or "next_logits" not in tensors:
        raise ConfigError(f"--load-memory: {path} is not a memory file written by --save-memory")
    if meta.get("model") != model_fingerprint(run):
        raise ConfigError(f"--load-memory: {path} was written by another model; continue it with the run that wrote it")
    if "weights" not in meta:
        raise ConfigError(
            f"--load-memory: {path} does not name the weights that wrote it (an older memory file); "
            "write it again with --save-memory"
        )
    if meta["weights"] != weights_fingerprint(run.model):
        wrote = f" ({meta['checkpoint']})" if meta.get("checkpoint") not in (None, "None") else ""
        raise ConfigError(
            f"--load-memory: {path} was written by other weights{wrote} than {run.checkpoint or 'this model'}'s; "
            "continue it with the run and checkpoint that wrote it"
        )
    bad = non_finite(tensors)
    if bad is not None:
        raise ConfigError(f"--load-memory: {path} holds non-finite values in {bad}; it cannot be continued")
    logits = tensors.pop("next_logits")
    return MemoryState.from_tensors(tensors).to(run.device), logits.to(run.device)


def memory_lengths(memory: MemoryState) -> tuple[int, int]:
    layer = memory.layers[0]
    return layer.mem_len, int(layer.cmem.size(1)) if layer.cmem is not None else 0


def joining_text(decode: Callable[[list[int]], str], before: int, token: int) -> str:
    """What the tokenizer writes between ``before`` and ``token`` when it decodes them together (a space for a
    word-level tokenizer, nothing for bytes or subwords): the continuation, decoded on its own, starts with it, so
    it never runs into its prompt."""
    a, b, both = decode([before]), decode([token]), decode([before, token])
    if both.startswith(a) and both.endswith(b) and len(both) > len(a) + len(b):
        return both[len(a) : len(both) - len(b)]
    return ""


class StreamPrinter:
    """Writes the decoded continuation as it grows. Text that could still turn out to be the start of a stop
    string, or an incomplete UTF-8 character, is held back until it is known. ``before``: the prompt's last token,
    when the continuation may need the tokenizer's joining text (see :func:`joining_text`)."""

    def __init__(self, run: Run, out: IO[str] | None, stop: Sequence[str], before: int | None = None) -> None:
        self.run, self.out, self.stop = run, out, [s for s in stop if s]
        self.hold = max((len(s) for s in self.stop), default=1) - 1
        self.ids: list[int] = []
        self.printed = 0
        self.text = ""
        self.stopped = False
        self.before, self.prefix = before, ""

    def __call__(self, token: int) -> bool:
        """Take one token; False once a stop string has appeared (generation should end)."""
        if not self.ids and self.before is not None:
            self.prefix = joining_text(self.run.decode, self.before, token)
        self.ids.append(token)
        self.text = self.prefix + self.run.decode(self.ids)
        hits = [i for i in (self.text.find(s) for s in self.stop) if i >= 0]
        if hits:
            self.text, self.stopped = self.text[: min(hits)], True
            self.flush()
            return False
        safe = len(self.text) - self.hold
        while safe > self.printed and self.text[safe - 1] == "\ufffd":  # a character still missing bytes
            safe -= 1
        self._write(safe)
        return True

    def _write(self, upto: int) -> None:
        if upto > self.printed:
            if self.out is not None:
                self.out.write(self.text[self.printed : upto])
                self.out.flush()
            self.printed = upto

    def flush(self) -> None:
        self._write(len(self.text))


@dataclass
class TextGeneration:
    text: str  # the continuation, cut before a stop string
    stopped: bool  # a stop string ended it
    generation: Generation


def generate_text(
    run: Run,
    prompt: str,
    *,
    max_tokens: int = 200,
    sampling: SamplingConfig | None = None,
    seed: int | None = None,
    compile: bool | None = None,
    mem_len: int | None = None,
    cmem_len: int | None = None,
    stop: Sequence[str] = (),
    stream: IO[str] | None = None,
    memory: tuple[MemoryState, torch.Tensor] | None = None,
    return_memory: bool = False,
) -> TextGeneration:
    """Continue ``prompt``, streaming the text to ``stream`` as it is produced and ending at the first ``stop``
    string, each token drawn as ``sampling`` says (default temperature 1). ``memory`` (from :func:`load_memory`)
    continues an earlier generation; the prompt may then be empty. Bytes of ``prompt`` that are not UTF-8 become
    U+FFFD."""
    require_modality(run.modality, TEXT, "the prompt", "continue an audio run with generate_audio (--prime FILE)")
    check_sampling(max_tokens=max_tokens)
    prompt = clean_prompt(prompt)
    ids = run.encode(prompt) if prompt else []
    if memory is None and not ids:
        raise ConfigError("--prompt: is empty after tokenization; give some text to continue")
    state, logits = memory if memory is not None else (None, None)
    if state is not None:
        have = memory_lengths(state)
        for flag, want, got in (("--mem-len", mem_len, have[0]), ("--cmem-len", cmem_len, have[1])):
            if want is not None and want != got:
                raise ConfigError(
                    f"{flag}: the loaded memory holds {got} slots, not {want}; drop {flag} when continuing"
                )
    before = ids[-1] if len(ids) and not prompt[-1:].isspace() else None  # a prompt ending in a space keeps it
    printer = StreamPrinter(run, stream, stop, before=before)
    out = generate(
        run.model,
        ids,
        max_new_tokens=max_tokens,
        sampling=sampling,
        seed=seed,
        compile=compile,
        mem_len=mem_len,
        cmem_len=cmem_len,
        memory=state,
        next_logits=logits,
        on_token=printer,
        return_memory=return_memory,
        amp=generation_amp(run.config, next(run.model.parameters()).device),
    )
    printer.flush()
    return TextGeneration(text=printer.text, stopped=printer.stopped, generation=out)


def read_prompts(path: str | Path) -> list[str]:
    """One prompt per non-empty line (``\\n`` inside a line stands for a newline)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"--prompts-file: {path} does not exist; give a text file with one prompt per line")
    remedy = "give a text file with one prompt per line"
    text = read_utf8(path, "--prompts-file", remedy)
    reason = binary_reason(text)
    if reason:
        raise ConfigError(f"--prompts-file: {path} is not text ({reason}); {remedy}")
    prompts = [line.replace("\\n", "\n") for line in text.splitlines() if line.strip()]
    if not prompts:
        raise ConfigError(f"--prompts-file: {path} has no prompts; write one per line")
    return prompts


__all__ = [
    "StreamPrinter",
    "joining_text",
    "TextGeneration",
    "generate_text",
    "load_memory",
    "save_memory",
    "read_prompts",
    "model_fingerprint",
    "weights_fingerprint",
]
