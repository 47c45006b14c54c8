"""Trainer: the paper's optimisation recipe around any :class:`~.models.MemoryModel`, with exact resume.

One *step* is one optimizer update. It consumes ``train.accumulation_at(step)`` batches (the paper reduces the update
frequency late in training instead of lowering the learning rate), each a segment of every stream, with the model
memory carried from batch to batch and emptied per row at document boundaries. The loss of a batch is the task loss
plus the auxiliary compression loss; the model routes the latter's gradient to the compressor only.

Everything that decides the next step is checkpointed (weights, optimizer, RNG, data position, memory), so a
resumed run continues bit for bit on CPU.
"""

from __future__ import annotations

import math
import os
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from tqdm.auto import tqdm

from compressive_transformer.core.config import ConfigError, RunConfig
from compressive_transformer.core.dtypes import amp_dtype, autocast
from compressive_transformer.core.memory import MemoryState, is_row_tensor
from compressive_transformer.core.modality import run_modality, token_unit
from compressive_transformer.core.models import IGNORE_INDEX, build_model
from compressive_transformer.data import StreamBatcher
from compressive_transformer.inference.evaluate import EvalResult, evaluate
from compressive_transformer.runs import cputime
from compressive_transformer.runs.checkpoint import (
    Checkpoint,
    CheckpointError,
    NonFiniteWeights,
    list_checkpoints,
    load_checkpoint,
    report_fallback,
    save_checkpoint,
)
from compressive_transformer.runs.failures import VALIDATION_REMEDY, evaluation_sizes, sizes_to_lower
from compressive_transformer.runs.init_from import copied_names, freeze
from compressive_transformer.runs.machine import resolve_device, set_threads
from compressive_transformer.runs.metrics import MetricsLogger, read_metrics
from compressive_transformer.runs.precision import (
    PRECISION_NAMES,
    describe,
    inference_amp,
    resolve_amp,
)
from compressive_transformer.runs.toml_writer import config_text
from compressive_transformer.training.captured import make_capturable
from compressive_transformer.training.distributed import (
    all_reduce_sum,
    gather_rows,
    init_distributed,
    local_device,
    with_every_parameter,
)
from compressive_transformer.training.schedule import learning_rate
from compressive_transformer.training.step import adam, build_optimizer, compile_model, training_step  # noqa: F401
from compressive_transformer.training.update import apply_update, set_learning_rate


class TrainingError(RuntimeError):
    """Training cannot go on (the loss diverged); the message says what to change."""


def loss_bound(cfg: RunConfig) -> float:
    """The task loss above which training counts as diverged: ``train.divergence_factor`` times the loss of a
    uniform guess, ln(vocab). A fresh model starts near ln(vocab); a loss several times that has left the region any
    learning run passes through (inf when the factor is 0 or the model has no vocabulary)."""
    factor, vocab = cfg.train.divergence_factor, cfg.model.vocab_size
    return factor * math.log(vocab) if factor > 0 and vocab > 1 else math.inf


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


class ThroughputWatch:
    """Notices when training runs far below its own recent rate (another process took the cores, a thread count
    too high for a shared machine) and says so once per slow spell, at most once every ``interval`` seconds: a spell
    that starts sooner is reported, with the rate of that moment, once the interval has passed and it goes on."""

    def __init__(self, *, ratio: float = 0.4, warmup: int = 2, interval: float = 60.0) -> None:
        self.ratio, self.warmup, self.interval = ratio, warmup, interval
        self.best, self.seen, self.slow = 0.0, 0, False
        self.last_warning = -math.inf

    def check(self, tokens_per_s: float, now: float | None = None) -> str | None:
        now = time.monotonic() if now is None else now
        self.seen += 1
        if self.seen <= self.warmup:  # the first windows include start-up costs
            self.best = max(self.best, tokens_per_s) if self.seen == self.warmup else 0.0
            return None
        if tokens_per_s >= self.ratio * self.best:
            self.slow = False
            self.best = max(self.best, tokens_per_s)
            return None
        if self.slow or now - self.last_warning < self.interval:
            return None
        self.slow, self.last_warning = True, now
        return (
            f"warning: {tokens_per_s:,.0f} tokens/s, down from {self.best:,.0f}; is another process using the cores? "
            "(train.num_threads = 1 holds up best on a shared machine)"
        )


def memory_fill(memory: MemoryState) -> tuple[float, float]:
    """Mean fraction of valid slots in (memory, compressed memory) over layers and rows."""
    mem, cmem = [], []
    for layer in memory.layers:
        if layer.mem_len > 0:
            mem.append(float(layer.mem_mask.float().sum(1).mean()) / layer.mem_len)
        if layer.cmem_len > 0:
            cmem.append(float(layer.cmem_mask.float().mean()))
    return (sum(mem) / len(mem) if mem else 0.0, sum(cmem) / len(cmem) if cmem else 0.0)


def per_unit(record: dict[str, Any], cfg: RunConfig) -> dict[str, float]:
    """A training record's loss per sample for an audio run (``nats_per_sample``, ``bits_per_sample``), as its
    validation and evaluation records report it; nothing for text."""
    unit = token_unit(run_modality(cfg))
    return {f"nats_per_{unit}": record["loss"], f"bits_per_{unit}": record["bits_per_token"]} if unit else {}


@dataclass
class TrainSummary:
    step: int
    last_loss: float | None
    validation: EvalResult | None
    checkpoint: Path | None
    losses: list[float] = field(default_factory=list)  # task loss of every update run by this call


class Trainer:
    """Owns the model, optimizer, data stream and memory of one run directory. No argparse here: the CLI and
    tests build a :class:`RunConfig` and the corpora, then call :meth:`train`."""

    def __init__(
        self,
        cfg: RunConfig,
        *,
        train_corpus: Any,
        run_dir: str | Path,
        val_corpus: Any = None,
        log: Callable[[str], None] = print,
        init_source: torch.nn.Module | None = None,
    ) -> None:
        """``init_source``: a model whose weights start this run (``train.init_from``; not on resume)."""
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.val_corpus = val_corpus
        self.config_toml = config_text(cfg)  # stored in every checkpoint, so a checkpoint names its config
        self.log = log
        t = cfg.train
        self.device = local_device(resolve_device(t.device))
        set_threads(t.num_threads, log if self.device.type == "cpu" and os.environ.get("RANK", "0") == "0" else None)
        self.dist = init_distributed(self.device)  # one process unless launched by torchrun
        self.rows = self.dist.rows(t.batch_size)  # the streams (and memories) this process owns
        seed_everything(t.seed)
        self.model = build_model(cfg.model).to(self.device)  # unwrapped: what checkpoints hold; same on every rank
        copied = copied_names(self.run_dir, t, self.model, init_source, log if self.dist.is_main else None)
        freeze(self.model, t.freeze, copied)  # before DDP, which then expects no gradient for them
        if self.dist.active:
            torch.manual_seed(t.seed + self.dist.rank)  # each rank its own dropout masks
        self.amp = resolve_amp(t.amp, self.device)  # "auto" decided once, for this device
        self.amp_dtype = amp_dtype(self.amp)
        step = training_step(self.model, t, self.device, self.amp, distributed=self.dist.active)
        self.forward, self.optimizer, self.low_precision = step.forward, step.optimizer, step.low_precision
        self.captured = step.captured
        if step.eager_reason is not None and self.dist.is_main:
            log(f"train.cuda_graphs: training eagerly: {step.eager_reason}")
        self.eval_amp = inference_amp(cfg, self.device)
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=self.amp == "fp16")
        if self.dist.is_main:
            log(describe(t.amp, self.device))
        self.batcher = StreamBatcher(
            train_corpus,
            batch_size=t.batch_size,
            seg_len=cfg.model.seg_len,
            shuffle=t.shuffle,
            seed=t.seed,
            repeat=True,
            piece_len=t.piece_len,
        )
        self.batches = iter(self.batcher)
        self.memory = self.model.init_memory(self.rows.stop - self.rows.start, device=self.device)
        self.step = 0
        self.tokens_seen = 0
        self.last_checkpoint: Path | None = None
        self.max_loss = loss_bound(cfg)
        self.metrics = MetricsLogger(self.run_dir, enabled=self.dist.is_main)

    # ----------------------------------------------------------------------------------------------------------
    # checkpoints

    def save(self) -> Path:
        """Write a checkpoint (the main process only, with every rank's memory rows gathered, so it resumes on any
        number of processes). Every rank must call it."""
        tensors = self.memory.to_tensors()
        rows = {k: v for k, v in tensors.items() if is_row_tensor(k)}
        memory = tensors | gather_rows(rows, self.dist)
        if not self.dist.is_main:
            return self.last_checkpoint
        try:
            self.last_checkpoint = self._save(memory)
        except NonFiniteWeights as e:
            raise self._diverged("a weight", "non-finite") from e
        return self.last_checkpoint

    def _save(self, memory: dict[str, torch.Tensor]) -> Path:
        return save_checkpoint(
            self.run_dir,
            self.step,
            model=self.model,
            optimizer=self.optimizer,
            memory=memory,
            data_state=self.batcher.state_dict(),
            config_toml=self.config_toml,
            extra={"tokens_seen": self.tokens_seen, "scaler": self.scaler.state_dict(), "precision": self.amp},
            keep=self.cfg.train.keep_checkpoints,
        )

    def resume(self, path: str | Path | None = None) -> int:
        """Continue from checkpoint ``path`` (default: the run's newest that verifies, reporting newer ones that do
        not; with no checkpoint at all, step 0 of a fresh start, which is what a run killed before its first
        checkpoint had). Returns the step it resumes at."""
        if path is not None:
            ckpt = load_checkpoint(path, model=self.model, optimizer=self.optimizer)
        else:
            ckpt = self._load_newest_good()
            if ckpt is None:
                self.metrics.truncate_after(0)
                return 0
        path = ckpt.path
        if self.low_precision is not None:  # the weights were loaded: their copies made again
            self.low_precision.refresh()
        if self.captured is not None:  # the loaded groups hold plain learning rates
            make_capturable(self.optimizer)
        self.step = ckpt.step
        self.tokens_seen = int(ckpt.extra.get("tokens_seen", 0))
        if ckpt.extra.get("scaler"):
            self.scaler.load_state_dict(ckpt.extra["scaler"])
        was = ckpt.extra.get("precision", self.amp)
        if was != self.amp and self.dist.is_main:  # e.g. amp = "auto" resumed on a machine without fast bf16
            self.log(
                f"warning: {path} was trained in {PRECISION_NAMES.get(was, was)} and continues in "
                f"{PRECISION_NAMES[self.amp]} on this machine; resume with --set train.amp={was} to keep its precision"
            )
        if ckpt.memory is not None:
            try:
                self.memory = MemoryState.from_tensors(ckpt.memory).select_rows(self.rows).to(self.device)
            except (KeyError, ValueError, RuntimeError) as e:
                raise CheckpointError(
                    f"checkpoint {path}: memory.safetensors does not hold a model memory ({e!r})"
                ) from None
        try:
            self.batcher.load_state_dict(ckpt.data_state)
        except ConfigError as e:  # the data position names the corpus's shape; the key to change is data.path
            detail = str(e).removeprefix("data position: ").split(";")[0]
            raise ConfigError(
                f"data.path: {self.cfg.data.path or self.cfg.data.format} is not the data this run was trained on "
                f"({detail}); data.path may change on resume only to where the same data moved: point it there, "
                "or start a new run on the new data"
            ) from None
        except (KeyError, TypeError, ValueError, IndexError) as e:
            raise CheckpointError(f"checkpoint {path}: state.json holds no valid data position ({e!r})") from None
        self.batches = iter(self.batcher)
        self.last_checkpoint = path
        self.metrics.truncate_after(self.step)
        return self.step

    def _load_newest_good(self) -> Checkpoint | None:
        """Load the newest checkpoint that verifies and loads, falling back past damaged ones (each reported in one
        line). None when the run has no checkpoint; a :class:`CheckpointError` when none of them loads."""
        failures: list[CheckpointError] = []
        for path in reversed(list_checkpoints(self.run_dir)):
            try:
                ckpt = load_checkpoint(path, model=self.model, optimizer=self.optimizer)
            except CheckpointError as e:
                failures.append(e)
                continue
            report_fallback(failures, self.log if self.dist.is_main else None)
            return ckpt
        if failures:
            raise CheckpointError(
                f"{failures[0]}; no older checkpoint of {self.run_dir} loads either; move its checkpoints/ aside to start again from step 0"
            )
        return None

    # ----------------------------------------------------------------------------------------------------------
    # one update

    def _diverged(self, what: str, value: float | str) -> TrainingError:
        where = (
            f"--resume continues from {self.last_checkpoint}"
            if self.last_checkpoint
            else "--resume starts again from step 0"
        )
        return TrainingError(
            f"{what} became {value} at step {self.step + 1}; training stopped ({where}); "
            f"resume with a lower train.lr (e.g. --resume --set train.lr=...), a higher train.warmup_steps or a tighter train.grad_clip"
        )

    def train_step(self) -> dict[str, Any]:
        """One optimizer update over ``accumulation_at(step)`` batches; returns its metrics."""
        t = self.cfg.train
        n_batches = t.accumulation_at(self.step)
        lr = learning_rate(t, self.step)
        set_learning_rate(self.optimizer, lr)
        self.model.train()
        if self.captured is not None and n_batches == 1:
            return self._captured_step(lr)
        loss_sum, aux_sum, tokens = 0.0, 0.0, 0
        aux_layers = torch.zeros(self.cfg.model.n_layers)
        for _ in range(n_batches):
            batch = next(self.batches)  # the global batch; this process keeps its rows
            r = self.rows
            tokens += batch.num_tokens
            if bool(batch.reset[r].any()):
                self.memory = self.memory.reset(batch.reset[r].to(self.device))
            with autocast(self.device, self.amp):
                out = self.forward(
                    batch.tokens[r].to(self.device),
                    memory=self.memory,
                    targets=batch.targets[r].to(self.device),
                    input_mask=batch.input_mask[r].to(self.device),
                )
            loss, aux = out.loss.float(), out.aux_loss.float()
            # Weight this process's mean by its share of the batch's targets, so that the (rank-averaged) gradient
            # is the gradient of the global mean; with one process the weight is exactly 1.
            n_local = float((batch.targets[r] != IGNORE_INDEX).sum())
            share = n_local / max(float(batch.num_targets), 1.0) * self.dist.world_size
            totals = all_reduce_sum(
                torch.tensor([float(loss.detach()) * share, float(aux.detach())], dtype=torch.float64), self.dist
            )
            loss_value = float(totals[0]) / self.dist.world_size
            aux_value = float(totals[1]) / self.dist.world_size
            self._check_losses(loss_value, aux_value)
            total = (loss * share + aux) / n_batches
            if self.dist.active:  # a parameter this step leaves unused would stall DDP's gradient reduction
                total = with_every_parameter(total, self.model)
            if total.requires_grad:  # with train.freeze, a segment may reach no trainable parameter
                self.scaler.scale(total).backward()
            self.memory = out.memory
            loss_sum += loss_value
            aux_sum += aux_value
            aux_layers += all_reduce_sum(out.aux_losses.float().cpu(), self.dist) / self.dist.world_size
        params = [p for g in self.optimizer.param_groups for p in g["params"]]
        max_norm = t.grad_clip if t.grad_clip > 0 else float("inf")
        norm = apply_update(self.optimizer, params, max_norm=max_norm, scaler=self.scaler, weights=self.low_precision)
        grad_norm = float(norm)
        self.optimizer.zero_grad(set_to_none=True)
        if not math.isfinite(grad_norm) and self.amp_dtype is not torch.float16:  # fp16's scaler skips such steps
            raise self._diverged("the gradient norm", grad_norm)  # the update was skipped: the weights are intact
        return self._finish_step(
            loss_sum / n_batches, aux_sum / n_batches, aux_layers, lr, grad_norm, tokens, n_batches
        )

    def _check_losses(self, loss: float, aux: float) -> None:
        if not math.isfinite(loss):
            raise self._diverged("the loss", loss)
        if loss > self.max_loss:
            bound = f"{self.cfg.train.divergence_factor:g} x ln(vocab) = {self.max_loss:.3g}, train.divergence_factor"
            raise self._diverged("the loss", f"{loss:.4g} (above {bound})")
        if not math.isfinite(aux):
            raise self._diverged("the compression loss", aux)

    def _finish_step(
        self, loss: float, aux: float, aux_layers: torch.Tensor, lr: float, grad_norm: float, tokens: int, n: int
    ) -> dict[str, Any]:
        """Count the update and return its metrics (aux_layers: the per-layer compression losses summed over the n
        batches of the update)."""
        self.step += 1
        self.tokens_seen += tokens
        mem_fill, cmem_fill = memory_fill(self.memory)
        return {
            "step": self.step,
            "loss": loss,
            "bits_per_token": loss / math.log(2),
            "ppl": math.exp(min(loss, 700.0)),
            "aux_loss": aux,
            "aux_losses": [float(x) / n for x in aux_layers],
            "lr": lr,
            "grad_norm": grad_norm,
            "accumulate": n,
            "tokens": self.tokens_seen,
            "mem_fill": mem_fill,
            "cmem_fill": cmem_fill,
        }

    def _captured_step(self, lr: float) -> dict[str, Any]:
        """One update through :class:`~.captured.CapturedUpdate` (one batch, one process): the same update as
        :meth:`train_step`'s, with one read of its results from the device."""
        batch = next(self.batches)
        if bool(batch.reset.any()):
            self.memory = self.memory.reset(batch.reset.to(self.device))
        on = lambda x: x.to(self.device, non_blocking=True)  # noqa: E731
        (stats, aux_layers), self.memory = self.captured(
            on(batch.tokens), on(batch.targets), on(batch.input_mask), self.memory
        )
        loss, aux, grad_norm = stats.tolist()
        self._check_losses(loss, aux)
        if not math.isfinite(grad_norm):
            raise self._diverged("the gradient norm", grad_norm)
        return self._finish_step(loss, aux, aux_layers.cpu(), lr, grad_norm, batch.num_tokens, 1)

    # ----------------------------------------------------------------------------------------------------------
    # loop

    def validate(self) -> EvalResult | None:
        """Streaming evaluation on the validation corpus (capped at ``train.val_batches`` batches). It runs under a
        forked RNG, so validating or not never changes the training trajectory."""
        if self.val_corpus is None or not self.dist.is_main:
            return None
        e = self.cfg.eval
        with torch.random.fork_rng(devices=[self.device] if self.device.type == "cuda" else []):
            return evaluate(
                self.model,
                self.val_corpus,
                split="validation",
                batch_size=e.batch_size,
                seg_len=e.lengths(self.cfg.model).seg_len,
                mem_len=e.mem_len,
                cmem_len=e.cmem_len,
                max_batches=self.cfg.train.val_batches,
                device=self.device,
                amp_dtype=amp_dtype(self.eval_amp),
            )

    def _log_validation(self) -> EvalResult | None:
        with sizes_to_lower("validating", evaluation_sizes(self.cfg), VALIDATION_REMEDY):
            result = self.validate()
        if result is not None:
            record = {
                "step": self.step,
                "val_loss": result.loss,
                "val_bits_per_token": result.bits_per_token,
                "val_ppl": result.ppl,
            }
            if result.bits_per_char is not None:  # only a complete pass over the split has per-character units
                record |= {"val_bits_per_char": result.bits_per_char, "val_bits_per_byte": result.bits_per_byte}
            record |= result.per_unit("val_")  # audio: val_nats_per_sample, val_bits_per_sample
            self.metrics.log(record | {"val_tokens": result.tokens})
        return result

    def _final_validation_missing(self) -> bool:
        step = self.cfg.train.steps
        if self.step != step or self.val_corpus is None or not self.dist.is_main:
            return False
        return not any(r.get("step") == step and "val_loss" in r for r in read_metrics(self.run_dir))

    def train(self, *, max_steps: int | None = None) -> TrainSummary:
        """Run until ``train.steps`` updates (or ``max_steps`` more of them), validating and checkpointing on the way."""
        t = self.cfg.train
        end = t.steps if max_steps is None else min(t.steps, self.step + max_steps)
        summary = TrainSummary(step=self.step, last_loss=None, validation=None, checkpoint=self.last_checkpoint)
        if self.step >= t.steps:
            if self._final_validation_missing():  # killed between the final checkpoint and its validation
                self.log(f"the run finished its {t.steps} steps; writing its final validation, which is missing")
                summary.validation = self._log_validation()
                self.metrics.close()
            else:
                self.log(f"the run already finished its {t.steps} steps; nothing to do")
            return summary
        self._throughput = ThroughputWatch()
        bar = tqdm(
            total=t.steps,
            initial=self.step,
            desc="train",
            unit="step",
            disable=not (t.progress and self.dist.is_main),
            dynamic_ncols=True,
        )
        window_start, window_tokens = time.perf_counter(), 0
        clock = cputime.Clock(self.run_dir, self.step) if self.dist.is_main else None
        try:
            while self.step < end:
                before = self.tokens_seen
                record = self.train_step()
                window_tokens += self.tokens_seen - before
                summary.losses.append(record["loss"])
                summary.last_loss = record["loss"]
                bar.update(1)
                bar.set_postfix(
                    loss=f"{record['loss']:.3f}",
                    bits_per_token=f"{record['bits_per_token']:.3f}",
                    lr=f"{record['lr']:.2e}",
                )
                if self.step % t.log_every == 0 or self.step == t.steps:
                    now = time.perf_counter()
                    record["tokens_per_s"] = window_tokens / max(now - window_start, 1e-9)
                    window_start, window_tokens = now, 0
                    slow = self._throughput.check(record["tokens_per_s"])
                    if slow:
                        (bar.write if not bar.disable else self.log)(slow)
                    self.metrics.log(record | per_unit(record, self.cfg))
                if t.val_every and self.step % t.val_every == 0 and self.step < t.steps:
                    result = self._log_validation()
                    if result is not None:
                        (bar.write if not bar.disable else self.log)(f"step {self.step}: {result.summary()}")
                if (t.checkpoint_every and self.step % t.checkpoint_every == 0) or self.step == t.steps:
                    if clock is not None:
                        clock.lap(self.step)  # before the checkpoint: a kill between them only repeats the lap
                    self.save()
            if self.step == t.steps:
                summary.validation = self._log_validation()
        finally:
            bar.close()
            self.metrics.close()
        summary.step = self.step
        summary.checkpoint = self.last_checkpoint
        return summary
