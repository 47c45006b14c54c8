"""The lm-evaluation-harness model of any run directory or export of this library, registered as
``compressive-transformer``. Importing this module registers it (it needs the ``[lm-eval]`` extra); the
``compressive-transformer lm-eval`` command does that and then runs the harness.

No tokenizer of this library has an end-of-text token (documents are separated by memory resets, never by a marker),
so there is nothing to condition a document's first token on: by default it is not scored, exactly as ``evaluate``
scores text, and a loglikelihood request with an empty context is refused. ``prefix=TEXT`` names text to read
before every document and every empty context (e.g. ``prefix=\\n``); its tokens are never scored.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any, Sequence

import torch
from lm_eval.api.model import LM
from lm_eval.api.registry import register_model
from lm_eval.utils import simple_parse_args_string
from tqdm.auto import tqdm

from compressive_transformer.core.config import ConfigError
from compressive_transformer.core.modality import TEXT, require_modality
from compressive_transformer.harness.scoring import continuation_loglikelihoods, encode_pair, rolling_loglikelihoods
from compressive_transformer.inference.generate import SamplingConfig
from compressive_transformer.inference.textgen import generate_text
from compressive_transformer.runs.loading import Run, load_run

MODEL_NAME = "compressive-transformer"
# the harness's (and Hugging Face's) precision names -> this library's eval.amp values
PRECISIONS = {
    "auto": "auto",
    "float32": "none",
    "fp32": "none",
    "none": "none",
    "bfloat16": "bf16",
    "bf16": "bf16",
    "float16": "fp16",
    "fp16": "fp16",
    "half": "fp16",
}
GEN_KEYS = ("until", "max_gen_toks", "do_sample", "temperature", "top_k", "top_p")
log = logging.getLogger(__name__)


def _int(name: str, value: Any) -> int | None:
    """A whole number given as an int, a string of one, or a float with no fraction (the harness turns some
    options into floats); anything else is a one-line error."""
    if value is None or value == "":
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, (int, str)) and not isinstance(value, bool):
        try:
            return int(value)
        except ValueError:
            pass
    raise ConfigError(f"--model_args {name}={value!r}: must be an integer")


def _available(device: str | None) -> str | None:
    """The harness passes ``cuda:0`` unless told otherwise; like its own models, fall back to the CPU where there is
    no CUDA (with a warning) rather than refuse."""
    if device is not None and str(device).startswith("cuda") and not torch.cuda.is_available():
        log.warning("device %s: CUDA is not available; using the CPU", device)
        return "cpu"
    return device


def _unescape(text: str) -> str:
    """``\\n`` and ``\\t`` as typed in ``--model_args`` (a comma-separated string) mean newline and tab."""
    return text.replace("\\n", "\n").replace("\\t", "\t")


def with_eval_settings(
    run: Run, *, seg_len: int | None, mem_len: int | None, cmem_len: int | None, precision: str | None
) -> Run:
    """``run`` with its evaluation lengths and precision replaced where given (the run directory is not touched)."""
    changes: dict[str, Any] = {k: v for k, v in (("seg_len", seg_len), ("mem_len", mem_len), ("cmem_len", cmem_len))}
    changes = {k: v for k, v in changes.items() if v is not None}
    if precision is not None:
        key = str(precision).lower()
        if key not in PRECISIONS:
            raise ConfigError(f"--model_args dtype={precision!r}: unknown; use one of {', '.join(PRECISIONS)}")
        changes["amp"] = PRECISIONS[key]
    if not changes:
        return run
    config = dataclasses.replace(run.config, eval=dataclasses.replace(run.config.eval, **changes))
    return dataclasses.replace(run, config=config)


@register_model(MODEL_NAME)
class HarnessModel(LM):
    """A trained run in the harness. ``run``: a run directory, an ``export`` directory or a loaded
    :class:`~compressive_transformer.loading.Run` (``pretrained`` is accepted as another name for it);
    ``checkpoint``, ``device``, ``threads`` as in ``load_run``; ``seg_len``/``mem_len``/``cmem_len``: the lengths
    documents are read with (default: the run's evaluation lengths); ``dtype``: auto, float32, bfloat16 or float16
    (default: the run's ``eval.amp``); ``batch_size``: rows per loglikelihood batch; ``prefix``: text read before
    every document and empty context; ``max_gen_toks`` and ``seed``: generation defaults."""

    def __init__(
        self,
        run: str | Path | Run | None = None,
        *,
        pretrained: str | Path | Run | None = None,
        checkpoint: str | None = None,
        device: str | None = None,
        threads: int | str | None = None,
        batch_size: int | str | None = None,
        max_batch_size: int | str | None = None,
        dtype: str | None = None,
        seg_len: int | str | None = None,
        mem_len: int | str | None = None,
        cmem_len: int | str | None = None,
        prefix: str = "",
        max_gen_toks: int | str = 256,
        seed: int | str = 1234,
        **unknown: Any,
    ) -> None:
        super().__init__()
        if unknown:
            name = next(iter(unknown))
            raise ConfigError(
                f"--model_args {name}: unknown; use run, checkpoint, device, threads, batch_size, dtype, seg_len, "
                "mem_len, cmem_len, prefix, max_gen_toks or seed"
            )
        device = _available(device)
        source = run if run is not None else pretrained
        if source is None:
            raise ConfigError("--model_args: give run=RUN_DIR (a run directory or an export directory)")
        if isinstance(source, Run):
            loaded = source
            if device is not None:
                loaded.model.to(device)
        else:
            loaded = load_run(Path(source), device=device, checkpoint=checkpoint, threads=_int("threads", threads))
        require_modality(loaded.modality, TEXT, "lm-eval's tasks", "the harness scores text; give a text run")
        self.run = with_eval_settings(
            loaded,
            seg_len=_int("seg_len", seg_len),
            mem_len=_int("mem_len", mem_len),
            cmem_len=_int("cmem_len", cmem_len),
            precision=dtype,
        )
        self._device = self.run.device
        auto = batch_size is None or str(batch_size).startswith("auto")  # no probing: memory bounds the batch
        self.batch_size = self.run.config.eval.batch_size if auto else _int("batch_size", batch_size)
        if self.batch_size is None or self.batch_size < 1:
            raise ConfigError(
                f"batch_size {self.batch_size}: must be a positive integer (--batch_size N or --model_args batch_size=N)"
            )
        self.prefix_ids = self.encode(_unescape(str(prefix))) if prefix != "" else []
        if prefix != "" and not self.prefix_ids:
            raise ConfigError(
                f"--model_args prefix={prefix!r}: is no token at all for this run's {self.run.tokenizer.kind!r} "
                "tokenizer (words ignore whitespace); give text it reads, e.g. prefix=<eos> for WikiText words"
            )
        self.max_gen_toks = _int("max_gen_toks", max_gen_toks) or 256
        self.seed = _int("seed", seed)

    @classmethod
    def create_from_arg_string(cls, arg_string: str, additional_config: dict | None = None) -> "HarnessModel":
        """The harness's constructor from ``--model_args``: its own ``--batch_size``/``--device`` come as
        ``additional_config`` and would collide with the same keys in ``--model_args``; those win (they are this
        model's documented arguments, and the harness passes its defaults whether or not they were given)."""
        return cls.create_from_arg_obj(simple_parse_args_string(arg_string or ""), additional_config)

    @classmethod
    def create_from_arg_obj(cls, arg_dict: dict[str, Any], additional_config: dict | None = None) -> "HarnessModel":
        extra = {k: v for k, v in (additional_config or {}).items() if v is not None and k not in arg_dict}
        return cls(**arg_dict, **extra)

    # -- tokens ---------------------------------------------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        return [int(i) for i in self.run.encode(text)]

    @property
    def tokenizer_name(self) -> str:
        return f"{MODEL_NAME}-{self.run.tokenizer.kind}-{self.run.tokenizer.fingerprint[:12]}"

    def _empty_context(self, what: str) -> list[int]:
        """What an empty context is read as: the prefix, which must then exist."""
        if not self.prefix_ids:
            raise ConfigError(
                f"{what}: the context is empty and this model has no end-of-text token to start from; "
                "pass prefix=TEXT in --model_args (e.g. prefix=\\n; prefix=<eos> for a word-level WikiText run)"
            )
        return list(self.prefix_ids)

    # -- the harness's three requests --------------------------------------------------------------------------------

    def loglikelihood_rolling(self, requests: Sequence[Any], disable_tqdm: bool = False) -> list[float]:
        """Each document streamed once with memory carried, every token (after the first, or all after a prefix)
        scored exactly once; ``batch_size`` documents at a time."""
        texts = [req.args[0] for req in requests]
        out: list[float] = []
        bar = tqdm(total=len(texts), desc="rolling loglikelihood", disable=disable_tqdm)
        step = self.batch_size * 4  # progress every few batches; batches are formed by length inside each chunk
        for start in range(0, len(texts), step):
            chunk = texts[start : start + step]
            docs = [self.encode(t) for t in chunk]
            out.extend(rolling_loglikelihoods(self.run, docs, prefix=self.prefix_ids, batch_size=self.batch_size))
            bar.update(len(chunk))
        bar.close()
        for text, ll in zip(texts, out):
            self.cache_hook.add_partial("loglikelihood_rolling", (text,), ll)
        return out

    def loglikelihood(self, requests: Sequence[Any], disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        """Continuation after context, batched; a context longer than a segment is read through memory."""
        pairs = []
        for req in requests:
            context, continuation = req.args
            if context:
                pairs.append(encode_pair(self.encode, context, continuation))
            else:
                pairs.append((self._empty_context("loglikelihood"), self.encode(continuation)))
        results: list[tuple[float, bool]] = []
        bar = tqdm(total=len(pairs), desc="loglikelihood", disable=disable_tqdm)
        step = self.batch_size * 8  # progress every few batches; batches are formed by length inside each chunk
        for start in range(0, len(pairs), step):
            results.extend(
                continuation_loglikelihoods(self.run, pairs[start : start + step], batch_size=self.batch_size)
            )
            bar.update(min(step, len(pairs) - start))
        bar.close()
        for req, result in zip(requests, results):
            self.cache_hook.add_partial("loglikelihood", req.args, result)
        return results

    def generate_until(self, requests: Sequence[Any], disable_tqdm: bool = False) -> list[str]:
        """The library's decoder, one request at a time: memory carried through the prompt, stop strings, at most
        ``max_gen_toks`` tokens, greedy unless the task asks to sample (``do_sample`` with its temperature)."""
        out = []
        for req in tqdm(requests, desc="generate_until", disable=disable_tqdm):
            context, gen_kwargs = req.args
            text = self._generate(context, dict(gen_kwargs or {}))
            self.cache_hook.add_partial("generate_until", req.args, text)
            out.append(text)
        return out

    def _generate(self, context: str, kwargs: dict[str, Any]) -> str:
        ignored = sorted(set(kwargs) - set(GEN_KEYS))
        if ignored:
            log.warning("generate_until: ignoring %s (not options of this library's decoder)", ", ".join(ignored))
        until = kwargs.get("until") or []
        until = [until] if isinstance(until, str) else list(until)
        sample = bool(kwargs.get("do_sample", False))
        temperature = float(kwargs.get("temperature", 1.0) if sample else 0.0)
        prompt = context
        if not self.encode(context):
            prompt = self.run.decode(self._empty_context("generate_until")) + context
        result = generate_text(
            self.run,
            prompt,
            max_tokens=_int("max_gen_toks", kwargs.get("max_gen_toks")) or self.max_gen_toks,
            sampling=SamplingConfig(
                temperature=temperature,
                top_k=int(kwargs.get("top_k", 0) or 0) if sample and temperature > 0 else 0,
                top_p=float(kwargs.get("top_p", 1.0) or 1.0) if sample and temperature > 0 else 1.0,
            ),
            seed=self.seed,
            mem_len=self.run.mem_len,
            cmem_len=self.run.cmem_len,
            stop=until,
        )
        return result.text  # a word-level continuation starts with the space that separates it from the context


__all__ = ["MODEL_NAME", "HarnessModel", "with_eval_settings"]
