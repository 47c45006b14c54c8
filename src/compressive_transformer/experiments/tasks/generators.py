"""Synthetic long-range tasks with exact, controlled distances: passkey retrieval, associative recall, selective copy.

They measure what a memory actually carries: each answer depends on one earlier token at a known distance, so
accuracy by distance can be set against a model's context length (:mod:`compressive_transformer.core.context`).

Conventions shared by every task:

- ``targets`` is aligned with ``tokens`` (as a :class:`~compressive_transformer.core.models.MemoryModel` expects):
  ``targets[i]`` is what the model's output at position ``i`` (having read ``tokens[: i + 1]``) must be.
  It is ``-100`` everywhere except at answer positions.
- The *distance* of an answer at position ``a`` whose information token sits at position ``p`` is ``a - p``: the
  information is the ``d``-th token back, so an output can reach it exactly when its context length (past tokens it
  depends on) is at least ``d``. ``distances`` is aligned with ``tokens`` too, ``0`` where there is no answer.

Vocabulary layout (one place for all tasks; ``vocab_size`` of a task config is what the model needs)::

    0 PAD    reserved for padding by batching code; never emitted by a task
    1 SEP    ends the part of a sequence that holds the information
    2 QUERY  passkey: the next token is the key to look up
    3 MARK   selective copy: output the next remembered token here
    [4, 4 + n_filler)                    filler / noise tokens
    [.., + n_keys)                       key tokens
    [.., + n_values)                     value tokens (also the tokens to copy)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from compressive_transformer.core.config import ConfigError, require
from compressive_transformer.core.constants import IGNORE_INDEX

PAD, SEP, QUERY, MARK = 0, 1, 2, 3
N_SPECIAL = 4


@dataclass(frozen=True)
class Vocab:
    """Token id ranges; they never overlap, so an answer can always be told apart from noise."""

    n_filler: int
    n_keys: int
    n_values: int

    @property
    def filler(self) -> range:
        return range(N_SPECIAL, N_SPECIAL + self.n_filler)

    @property
    def keys(self) -> range:
        return range(self.filler.stop, self.filler.stop + self.n_keys)

    @property
    def values(self) -> range:
        return range(self.keys.stop, self.keys.stop + self.n_values)

    @property
    def size(self) -> int:
        return self.values.stop


@dataclass(frozen=True)
class _TaskConfig:
    name: ClassVar[str] = ""
    seq_len: int = 256
    n_filler: int = 16
    n_keys: int = 32
    n_values: int = 32

    def __post_init__(self) -> None:
        p = self.name + "."
        for field in ("seq_len", "n_filler", "n_keys", "n_values"):
            value = getattr(self, field)
            require(
                isinstance(value, int) and not isinstance(value, bool), p + field, f"must be an integer, got {value!r}"
            )
        require(self.n_filler >= 1, p + "n_filler", "must be >= 1")
        require(self.n_keys >= 1, p + "n_keys", "must be >= 1")
        require(self.n_values >= 2, p + "n_values", "must be >= 2 (one value would make the answer trivial)")

    @property
    def vocab(self) -> Vocab:
        return Vocab(self.n_filler, self.n_keys, self.n_values)

    @property
    def vocab_size(self) -> int:
        return self.vocab.size


def _check_choices(values: tuple[int, ...], key: str, low: int, high: int) -> None:
    require(
        isinstance(values, tuple)
        and len(values) > 0
        and all(isinstance(v, int) and not isinstance(v, bool) for v in values),
        key,
        "must be a non-empty list of integers",
    )
    bad = [v for v in values if not low <= v <= high]
    require(not bad, key, f"{bad[0] if bad else 0} is outside [{low}, {high}] for this seq_len")


@dataclass(frozen=True)
class PasskeyConfig(_TaskConfig):
    """Filler, one ``key value`` pair, more filler, then ``QUERY key``; the output at that last ``key`` is ``value``.

    The query ends the sequence (answer at ``seq_len - 1``); the value sits ``d`` positions earlier, ``d`` drawn
    uniformly from ``distances`` per example (``2 <= d <= seq_len - 2``).
    """

    name: ClassVar[str] = "passkey"
    distances: tuple[int, ...] = (16, 64, 128, 254)

    def __post_init__(self) -> None:
        super().__post_init__()
        if isinstance(self.distances, list):
            object.__setattr__(self, "distances", tuple(self.distances))
        require(self.seq_len >= 4, "passkey.seq_len", "must be >= 4 (key, value, QUERY, key)")
        _check_choices(self.distances, "passkey.distances", 2, self.seq_len - 2)


@dataclass(frozen=True)
class AssociativeRecallConfig(_TaskConfig):
    """``k1 v1 ... kN vN``, ``gap`` filler tokens, ``SEP``, then the ``N`` keys again in a random order.

    The output at each repeated key is its value. Leading filler pads the sequence to ``seq_len``; the queries end
    it. Keys are distinct within a sequence; ``gap`` is drawn uniformly from ``gaps`` per example. The query for
    pair ``i`` at query slot ``j`` has distance ``gap + 2 * (N - i) + j``.
    """

    name: ClassVar[str] = "associative_recall"
    n_pairs: int = 8
    gaps: tuple[int, ...] = (16, 64, 128)

    def __post_init__(self) -> None:
        super().__post_init__()
        if isinstance(self.gaps, list):
            object.__setattr__(self, "gaps", tuple(self.gaps))
        p = "associative_recall."
        require(isinstance(self.n_pairs, int) and self.n_pairs >= 1, p + "n_pairs", "must be an integer >= 1")
        require(
            self.n_pairs <= self.n_keys,
            p + "n_pairs",
            f"{self.n_pairs} pairs need as many distinct keys; raise n_keys to >= {self.n_pairs}",
        )
        longest = self.seq_len - 3 * self.n_pairs - 1
        require(longest >= 0, p + "seq_len", f"must be >= 3 * n_pairs + 1 = {3 * self.n_pairs + 1}")
        _check_choices(self.gaps, p + "gaps", 0, longest)


@dataclass(frozen=True)
class SelectiveCopyConfig(_TaskConfig):
    """``n_tokens`` value tokens scattered among noise, ``gap`` noise tokens, ``SEP``, then ``n_tokens`` ``MARK``s.

    The output at the ``k``-th ``MARK`` is the ``k``-th scattered token. The scatter region is everything before
    the gap (``seq_len - n_tokens - 1 - gap`` positions); positions within it are drawn uniformly per example.
    """

    name: ClassVar[str] = "selective_copy"
    n_tokens: int = 8
    gap: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        p = "selective_copy."
        require(isinstance(self.n_tokens, int) and self.n_tokens >= 1, p + "n_tokens", "must be an integer >= 1")
        require(isinstance(self.gap, int) and self.gap >= 0, p + "gap", "must be an integer >= 0")
        require(
            self.region_len >= self.n_tokens,
            p + "seq_len",
            f"must be >= 2 * n_tokens + 1 + gap = {2 * self.n_tokens + 1 + self.gap} to fit the tokens and markers",
        )

    @property
    def region_len(self) -> int:
        return self.seq_len - self.n_tokens - 1 - self.gap


TaskConfig = PasskeyConfig | AssociativeRecallConfig | SelectiveCopyConfig
TASKS: dict[str, type] = {c.name: c for c in (PasskeyConfig, AssociativeRecallConfig, SelectiveCopyConfig)}


def task_config(name: str, **fields: Any) -> TaskConfig:
    """Build a task config by name (``passkey``, ``associative_recall``, ``selective_copy``)."""
    if name not in TASKS:
        raise ConfigError(f"task: unknown {name!r}; use one of {', '.join(TASKS)}")
    known = set(TASKS[name].__dataclass_fields__)
    unknown = sorted(set(fields) - known)
    if unknown:
        raise ConfigError(f"{name}.{unknown[0]}: unknown key; known keys are {', '.join(sorted(known))}")
    return TASKS[name](**fields)


@dataclass(frozen=True)
class Example:
    """One sequence: ``tokens``, ``targets`` (-100 but at answers) and ``distances`` (0 but at answers), all (L,)."""

    tokens: np.ndarray
    targets: np.ndarray
    distances: np.ndarray


def _draw(rng: np.random.Generator, ids: range, size: int | tuple[int, ...]) -> np.ndarray:
    return rng.integers(ids.start, ids.stop, size=size, dtype=np.int64)


def _passkey(cfg: PasskeyConfig, rng: np.random.Generator) -> Example:
    v, L = cfg.vocab, cfg.seq_len
    d = int(rng.choice(cfg.distances))
    tokens = _draw(rng, v.filler, L)
    key, value = int(_draw(rng, v.keys, ())), int(_draw(rng, v.values, ()))
    tokens[L - 1 - d - 1 : L - 1 - d + 1] = (key, value)
    tokens[L - 2 :] = (QUERY, key)
    targets = np.full(L, IGNORE_INDEX, dtype=np.int64)
    distances = np.zeros(L, dtype=np.int64)
    targets[L - 1], distances[L - 1] = value, d
    return Example(tokens, targets, distances)


def _associative_recall(cfg: AssociativeRecallConfig, rng: np.random.Generator) -> Example:
    v, L, n = cfg.vocab, cfg.seq_len, cfg.n_pairs
    gap = int(rng.choice(cfg.gaps))
    start = L - (3 * n + gap + 1)  # leading filler
    tokens = _draw(rng, v.filler, L)
    keys = rng.choice(np.arange(v.keys.start, v.keys.stop, dtype=np.int64), size=n, replace=False)
    values = _draw(rng, v.values, n)
    tokens[start : start + 2 * n : 2], tokens[start + 1 : start + 2 * n : 2] = keys, values
    tokens[L - n - 1] = SEP
    order = rng.permutation(n)  # query slot j asks for pair order[j]
    answer_pos = np.arange(L - n, L)
    tokens[answer_pos] = keys[order]
    targets = np.full(L, IGNORE_INDEX, dtype=np.int64)
    distances = np.zeros(L, dtype=np.int64)
    targets[answer_pos] = values[order]
    distances[answer_pos] = answer_pos - (start + 2 * order + 1)
    return Example(tokens, targets, distances)


def _selective_copy(cfg: SelectiveCopyConfig, rng: np.random.Generator) -> Example:
    v, L, m = cfg.vocab, cfg.seq_len, cfg.n_tokens
    tokens = _draw(rng, v.filler, L)
    where = np.sort(rng.choice(cfg.region_len, size=m, replace=False))
    data = _draw(rng, v.values, m)
    tokens[where] = data
    tokens[L - m - 1] = SEP
    answer_pos = np.arange(L - m, L)
    tokens[answer_pos] = MARK
    targets = np.full(L, IGNORE_INDEX, dtype=np.int64)
    distances = np.zeros(L, dtype=np.int64)
    targets[answer_pos] = data
    distances[answer_pos] = answer_pos - where
    return Example(tokens, targets, distances)


_MAKERS = {PasskeyConfig: _passkey, AssociativeRecallConfig: _associative_recall, SelectiveCopyConfig: _selective_copy}


def _rng(rng: np.random.Generator | int) -> np.random.Generator:
    if isinstance(rng, np.random.Generator):
        return rng
    if isinstance(rng, (int, np.integer)) and not isinstance(rng, bool):
        return np.random.default_rng(int(rng))
    raise TypeError(f"rng: expected a numpy Generator or an integer seed, got {type(rng).__name__}")


def make_example(task_cfg: TaskConfig, rng: np.random.Generator | int) -> Example:
    """One example of the task; the same generator state (or seed) gives the same example."""
    maker = _MAKERS.get(type(task_cfg))
    if maker is None:
        raise TypeError(
            f"task_cfg: expected one of {', '.join(c.__name__ for c in _MAKERS)}, got {type(task_cfg).__name__}"
        )
    return maker(task_cfg, _rng(rng))


def make_batch(
    task_cfg: TaskConfig, batch_size: int, rng: np.random.Generator | int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``batch_size`` independent examples stacked: tokens, targets, distances, each int64 (B, L)."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
        raise ConfigError(f"batch_size: must be an integer >= 1, got {batch_size!r}")
    gen = _rng(rng)
    examples = [make_example(task_cfg, gen) for _ in range(int(batch_size))]
    return tuple(np.stack([getattr(e, f) for e in examples]) for f in ("tokens", "targets", "distances"))  # type: ignore[return-value]


def accuracy_by_distance(predictions: Any, targets: Any, distances: Any) -> dict[int, float]:
    """Fraction of answers predicted exactly, per distance, sorted by distance.

    ``predictions`` are token ids shaped like ``targets``, or scores with one more (last) axis, which are
    arg-maxed; numpy arrays, CPU torch tensors and nested lists all work. Only positions with a target count.
    """
    pred, tgt, dist = np.asarray(predictions), np.asarray(targets), np.asarray(distances)
    if pred.ndim == tgt.ndim + 1:
        pred = pred.argmax(-1)
    if not pred.shape == tgt.shape == dist.shape:
        raise ValueError(
            f"predictions {pred.shape}, targets {tgt.shape} and distances {dist.shape} must have the same shape"
        )
    answer = tgt != IGNORE_INDEX
    correct, dist = (pred == tgt)[answer], dist[answer]
    return {int(d): float(correct[dist == d].mean()) for d in np.unique(dist)}


__all__ = [
    "IGNORE_INDEX",
    "PAD",
    "SEP",
    "QUERY",
    "MARK",
    "Vocab",
    "PasskeyConfig",
    "AssociativeRecallConfig",
    "SelectiveCopyConfig",
    "TaskConfig",
    "TASKS",
    "task_config",
    "Example",
    "make_example",
    "make_batch",
    "accuracy_by_distance",
]
