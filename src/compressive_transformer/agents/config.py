"""Configuration of an agent run: [env], [core], [model] (a transformer core's ModelConfig), [train]."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from compressive_transformer.core.config import (
    CompressionConfig,
    MemoryConfig,
    ModelConfig,
    apply_run_overrides,
    upgrade_model_table,
)
from compressive_transformer.core.config_base import (
    ConfigError,
    check_types,
    from_dict,
    load_toml,
    merge_tables,
    require,
    to_dict,
)

ENVS = ("nonmatching", "minigrid")
QL_REFUSAL = (
    "an agent core cannot be a Transformer-QL: its scales shift whole groups of c ** (len(scales) - 1) states, and "
    "an agent steps one observation at a time; remove [model.ql] (a Transformer-XL or Compressive Transformer core)"
)
CORES = ("transformer", "lstm")
OPTIMIZERS = ("adam", "rmsprop")
LR_SCHEDULES = ("constant", "linear")
LOSS_REDUCTIONS = ("mean", "sum")
# the learner of every agent run written before its keys existed: a saved run config without one of them means this
# learner's value, whatever the defaults are now
LEGACY_LEARNER = {"optimizer": "adam", "adam_eps": 1e-8, "lr_schedule": "constant", "loss_reduction": "mean"}


EVAL_SEED = 1_000_003  # `rl evaluate`'s environments' first seed: far from training's (train.seed + environment index)
EVAL_EPISODES = 200  # `rl evaluate`'s episodes by default


@dataclass(frozen=True)
class EnvConfig:
    name: str = "nonmatching"
    n_objects: int = 2
    delay: int = 36  # distractor steps between the object shown and the choice
    show_steps: int = 3
    n_distractors: int = 4
    minigrid_id: str = "MiniGrid-MemoryS7-v0"

    def __post_init__(self) -> None:
        check_types(self, "env")
        require(self.name in ENVS, "env.name", f"unknown {self.name!r}; use one of {', '.join(ENVS)}")
        require(self.n_objects >= 2, "env.n_objects", "must be >= 2")
        require(self.delay >= 0, "env.delay", "must be >= 0")
        require(self.show_steps >= 1, "env.show_steps", "must be >= 1")
        require(self.n_distractors >= 1, "env.n_distractors", "must be >= 1")
        require(
            bool(self.minigrid_id.strip()),
            "env.minigrid_id",
            "must name a MiniGrid environment, e.g. MiniGrid-MemoryS7-v0",
        )


@dataclass(frozen=True)
class CoreConfig:
    kind: str = "transformer"  # or "lstm", the baseline
    embed_dim: int = 32  # observation embedding (a linear layer + ReLU) the core reads
    lstm_hidden: int = 64

    def __post_init__(self) -> None:
        check_types(self, "core")
        require(self.kind in CORES, "core.kind", f"unknown {self.kind!r}; use one of {', '.join(CORES)}")
        require(self.embed_dim > 0, "core.embed_dim", "must be > 0")
        require(self.lstm_hidden > 0, "core.lstm_hidden", "must be > 0")


@dataclass(frozen=True)
class RLTrainConfig:
    """IMPALA's learner on unrolls of ``unroll`` steps from ``n_envs`` environments, V-trace targets."""

    seed: int = 0
    env_steps: int = 200_000  # total environment steps (all environments together)
    n_envs: int = 16
    unroll: int = 16
    lr: float = 5e-4
    optimizer: str = "adam"  # or "rmsprop", IMPALA's (agents.optim)
    adam_eps: float = 1e-8  # Adam's epsilon (torch's default); larger damps the steps of near-zero gradients
    rmsprop_decay: float = 0.99
    rmsprop_eps: float = 0.01  # large, as IMPALA's: a parameter's step shrinks with its gradient
    rmsprop_momentum: float = 0.0
    lr_schedule: str = "constant"  # or "linear": lr falls linearly to 0 at env_steps (IMPALA's)
    loss_reduction: str = "mean"  # or "sum" over the unroll's steps and environments (IMPALA's; vtrace_losses)
    gamma: float = 0.99
    entropy_cost: float = 0.01
    value_cost: float = 0.5
    grad_clip: float = 1.0
    rho_clip: float = 1.0
    c_clip: float = 1.0
    log_every: int = 10  # updates between metric records
    checkpoint_every: int = 200  # updates between checkpoints
    window: int = 200  # episodes the reported return and success rate average over
    threads: int = 1  # the learner's (and, with train.actors = 0, the actors') torch threads
    actors: int = 0  # 0: the actors step in the learner's process; N: N actor processes share the n_envs
    actors_lockstep: bool = False  # actor processes wait for each update's weights: no policy lag (a check)

    def __post_init__(self) -> None:
        check_types(self, "train")
        require(self.actors >= 0, "train.actors", "must be >= 0 (0: in-process actors; N: N actor processes)")
        require(
            self.actors == 0 or self.n_envs % self.actors == 0,
            "train.actors",
            f"must divide train.n_envs = {self.n_envs} (each actor process steps an equal share of the environments)",
        )
        for name in ("env_steps", "n_envs", "unroll", "log_every", "checkpoint_every", "window", "threads"):
            require(getattr(self, name) > 0, f"train.{name}", "must be > 0")
        require(
            self.checkpoint_every % self.log_every == 0,
            "train.checkpoint_every",
            f"must be a multiple of train.log_every = {self.log_every} (a checkpoint follows a metrics record)",
        )
        require(0 <= self.seed < 2**32, "train.seed", "must be in [0, 2**32) (numpy's seeds)")
        require(self.lr > 0, "train.lr", "must be > 0")
        require(
            self.optimizer in OPTIMIZERS,
            "train.optimizer",
            f"unknown {self.optimizer!r}; use one of {', '.join(OPTIMIZERS)}",
        )
        require(self.adam_eps > 0, "train.adam_eps", "must be > 0 (torch's default: 1e-8)")
        require(0.0 <= self.rmsprop_decay < 1.0, "train.rmsprop_decay", "must be in [0, 1) (IMPALA's: 0.99)")
        require(self.rmsprop_eps > 0, "train.rmsprop_eps", "must be > 0 (IMPALA's: 0.01)")
        require(0.0 <= self.rmsprop_momentum < 1.0, "train.rmsprop_momentum", "must be in [0, 1) (IMPALA's: 0)")
        require(
            self.loss_reduction in LOSS_REDUCTIONS,
            "train.loss_reduction",
            f"unknown {self.loss_reduction!r}; use one of {', '.join(LOSS_REDUCTIONS)}",
        )
        require(
            self.lr_schedule in LR_SCHEDULES,
            "train.lr_schedule",
            f"unknown {self.lr_schedule!r}; use one of {', '.join(LR_SCHEDULES)}",
        )
        require(0.0 < self.gamma <= 1.0, "train.gamma", "must be in (0, 1]")
        require(self.grad_clip > 0, "train.grad_clip", "must be > 0")
        require(self.entropy_cost >= 0, "train.entropy_cost", "must be >= 0 (0: no entropy bonus)")
        require(self.value_cost > 0, "train.value_cost", "must be > 0 (the V-trace targets need a learned value)")
        clip = "must be > 0 (V-trace's truncation of the importance weights; 1.0 is IMPALA's)"
        require(self.rho_clip > 0, "train.rho_clip", clip + "; 0 would zero the policy gradient")
        require(self.c_clip > 0, "train.c_clip", clip)


def _default_model() -> ModelConfig:
    return ModelConfig(
        vocab_size=0,
        input_dim=32,
        d_model=32,
        n_layers=2,
        n_heads=2,
        d_ff=64,
        seg_len=1,
        memory=MemoryConfig(mem_len=8, cmem_len=10),
        compression=CompressionConfig(rate=4),
        norm="pre",
        gating=True,
        dropout=0.0,
    )


@dataclass(frozen=True)
class RLConfig:
    env: EnvConfig = field(default_factory=EnvConfig)
    core: CoreConfig = field(default_factory=CoreConfig)
    model: ModelConfig = field(default_factory=_default_model)
    train: RLTrainConfig = field(default_factory=RLTrainConfig)

    def __post_init__(self) -> None:
        if self.core.kind == "transformer":
            require(not self.model.is_ql, "model.ql", QL_REFUSAL)
            require(
                self.model.input_dim == self.core.embed_dim,
                "model.input_dim",
                f"the core reads embeddings of core.embed_dim = {self.core.embed_dim}; set the same input_dim",
            )
            require(self.model.vocab_size == 0, "model.vocab_size", "an agent core has no token head; set 0")
            require(
                self.model.dropout == 0.0 and self.model.attn_dropout == 0.0,
                "model.dropout",
                "actors and learner must compute the same function; set dropout = attn_dropout = 0",
            )

    @classmethod
    def from_raw(cls, raw: Mapping[str, Any]) -> "RLConfig":
        sections = {"env": EnvConfig, "core": CoreConfig, "model": ModelConfig, "train": RLTrainConfig}
        unknown = sorted(set(raw) - set(sections))
        if {"data", "eval"} & set(unknown):
            raise ConfigError(
                f"[{next(u for u in unknown if u in ('data', 'eval'))}]: this is a text or audio config, not an agent's "
                f"(whose sections are {', '.join(sections)}); train it with `compressive-transformer train --config FILE`"
            )
        if unknown:
            raise ConfigError(f"{unknown[0]}: unknown section; known sections are {', '.join(sections)}")
        defaults = to_dict(_default_model())
        defaults.pop("kind")  # the file's own kind, or the one its sections name (ModelConfig.with_kind)
        model_raw = merge_tables(defaults, upgrade_model_table(raw.get("model", {})))
        parts = {name: from_dict(c, raw.get(name, {}), name) for name, c in sections.items() if name != "model"}
        # before the model's own checks, which would ask for a segment length an agent cannot have
        require(parts["core"].kind != "transformer" or model_raw.get("ql") is None, "model.ql", QL_REFUSAL)
        return cls(model=ModelConfig.from_raw(model_raw), **parts)


def load_rl_config(path: str | Path | None, overrides: list[str] | tuple[str, ...] = ()) -> RLConfig:
    """Read an agent run's TOML (or the defaults when ``path`` is None) and apply ``section.key=value`` overrides."""
    raw = load_toml(path) if path is not None else {}
    return RLConfig.from_raw(apply_run_overrides(raw, overrides))


def load_saved_config(path: str | Path) -> RLConfig:
    """The resolved config a run or checkpoint recorded. A learner key it lacks was written before the key existed,
    when the run trained with :data:`LEGACY_LEARNER`'s value, so it keeps meaning that learner when the defaults
    change."""
    raw = load_toml(path)
    train = raw.get("train")
    if isinstance(train, dict):
        raw = {**raw, "train": {**LEGACY_LEARNER, **train}}
    return RLConfig.from_raw(apply_run_overrides(raw, ()))


__all__ = [
    "LEGACY_LEARNER",
    "QL_REFUSAL",
    "CoreConfig",
    "EnvConfig",
    "RLConfig",
    "RLTrainConfig",
    "load_rl_config",
    "load_saved_config",
]
