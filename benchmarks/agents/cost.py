"""What each arm of an agent spec costs per environment step: keys per query, FLOPs of acting and of learning, and
training CPU seconds.

    python -m benchmarks.agents.cost benchmarks/agents/reach.toml [--models A B] [--updates 10 40] [--out DIR]

- Keys per query: the memory slots a layer reads at each step plus the step itself (n_m + n_cm + 1); an LSTM has none.
- Acting FLOPs per step: one step of the agent for one environment with its memory full (no gradient), counted by
  ``torch.utils.flop_counter``; the attention layers' share beside it.
- Learning FLOPs per step: the FLOPs of a short training run (acting and learning, ``--updates`` MORE updates)
  divided by its environment steps, less the acting FLOPs.
- CPU seconds per update (the cost pilot): each arm trained for FEWER updates, then resumed to MORE; the process
  CPU time of the second call divided by its updates (one torch thread; start-up is in the first call).

Writes ``cost.json`` and ``cost.md`` into ``--out`` (default: the folder named after the spec); the study's report
(``benchmarks.agents.run``) tables them beside success.
"""

from __future__ import annotations

import dataclasses
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.flops import cost_arguments, count, matching, save_cost
from compressive_transformer.agents.actor_critic import ActorCritic
from compressive_transformer.agents.config import RLConfig, load_rl_config
from compressive_transformer.agents.envs import make_env
from compressive_transformer.agents.train import train_agent
from compressive_transformer.core.config import load_toml
from compressive_transformer.runs.machine import machine_info


def acting_flops(cfg: RLConfig) -> tuple[int, int]:
    """(FLOPs, of which attention) of one agent step for one environment whose memory is full."""
    torch.manual_seed(0)
    env = make_env(cfg.env)
    agent = ActorCritic(cfg, env.observation_space.shape[0], int(env.action_space.n))
    obs = torch.rand(1, env.observation_space.shape[0])
    first = torch.zeros(1, dtype=torch.bool)
    state = agent.initial_state(1)
    m = cfg.model.memory
    with torch.no_grad():
        for _ in range(m.mem_len + cfg.model.compression.rate * m.cmem_len + 1):
            state = agent.step(obs, first, state)[0].state
        total, per_module = count(lambda: agent.step(obs, first, state))
    return total, matching(per_module, r"blocks\.\d+\.attn")


def arm_overrides(spec: dict[str, Any], model: str) -> list[str]:
    """An arm's config overrides: the spec's own (every arm's) first, then the arm's."""
    return [*spec.get("overrides", []), *spec["models"][model]["overrides"]]


def parameter_counts(cfg: RLConfig) -> dict[str, int]:
    """The built agent's parameters: all of them, and the observation embedding's (the encoder's) share."""
    env = make_env(cfg.env)
    agent = ActorCritic(cfg, env.observation_space.shape[0], int(env.action_space.n))
    count_of = lambda module: sum(p.numel() for p in module.parameters())  # noqa: E731
    return {"total": count_of(agent), "observation_embedding": count_of(agent.encoder)}


def with_updates(cfg: RLConfig, updates: int) -> RLConfig:
    steps = updates * cfg.train.n_envs * cfg.train.unroll
    return dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, env_steps=steps, threads=1))


def measure_one(cfg: RLConfig, updates: tuple[int, int], scratch: Path) -> dict[str, Any]:
    fewer, more = updates
    steps_per_update = cfg.train.n_envs * cfg.train.unroll
    train_flops, _ = count(lambda: train_agent(with_updates(cfg, more), scratch / "flops", progress=False))
    act, act_attention = acting_flops(cfg)
    train_agent(with_updates(cfg, fewer), scratch / "cpu", progress=False)
    t0 = time.process_time()
    train_agent(with_updates(cfg, more), scratch / "cpu", resume=True, progress=False)
    cpu = (time.process_time() - t0) / (more - fewer)
    m = cfg.model.memory
    return {
        "keys_per_query": m.mem_len + m.cmem_len + 1 if cfg.core.kind == "transformer" else None,
        "acting_flops_per_step": act,
        "acting_attention_flops_per_step": act_attention,
        "learning_flops_per_step": train_flops / (more * steps_per_update) - act,
        "steps_per_update": steps_per_update,
        "cpu_seconds_per_update": cpu,
        "cpu_seconds_per_million_steps": cpu / steps_per_update * 1e6,
    }


def markdown(result: dict[str, Any]) -> list[str]:
    lines = [
        f"# Cost per arm: {result['spec']}",
        "",
        f"`{result['command']}` (one torch thread, process CPU time; FLOPs by torch.utils.flop_counter: matrix "
        "products and convolutions).",
        "",
        "| model | keys per query | acting FLOPs / step | of which attention | learning FLOPs / step | "
        "env steps / update | CPU s / update | CPU s per 1 M steps |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, c in result["models"].items():
        lines.append(
            f"| {name} | {c['keys_per_query'] or '-'} | {c['acting_flops_per_step']:,} | "
            f"{c['acting_attention_flops_per_step']:,} | {c['learning_flops_per_step']:,.0f} | {c['steps_per_update']} | "
            f"{c['cpu_seconds_per_update']:.3f} | {c['cpu_seconds_per_million_steps']:,.0f} |"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    args = cost_arguments(__doc__, "models", (10, 40), argv)
    torch.set_num_threads(1)
    spec = load_toml(args.spec)
    models: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in spec["models"]:
            if args.arms and name not in args.arms:
                continue
            cfg = load_rl_config(spec["config"], arm_overrides(spec, name))
            models[name] = measure_one(cfg, tuple(args.updates), Path(tmp) / name)
            print(f"{name}: {models[name]['cpu_seconds_per_update']:.3f} CPU s per update", flush=True)
    result = {
        "spec": str(args.spec),
        "command": "python -m benchmarks.agents.cost " + " ".join(sys.argv[1:] if argv is None else argv),
        "machine": machine_info() | {"torch_threads": 1},
        "models": models,
    }
    save_cost(args.out, result, "models", markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
