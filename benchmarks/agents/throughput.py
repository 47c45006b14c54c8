"""Environment steps per second of the agent trainer with its actors in the learner's process (``train.actors = 0``)
and in N actor processes, on one config; the steady rate, without start-up (spawning actors, building the agent).

    python -m benchmarks.agents.throughput [CONFIG] [--actors 0 1 2 4] [--updates 40] [--set KEY=VALUE ...]

Each setting trains in a temporary directory for one update (a warm-up), ``updates`` and twice as many; the rate is the
difference in steps over the difference in seconds. Actor processes use one thread each and the learner
``train.threads``, so N actors occupy N + 1 cores: on a machine with fewer, the numbers measure contention.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

from compressive_transformer.agents.config import load_rl_config
from compressive_transformer.agents.train import train_agent
from compressive_transformer.runs.machine import machine_info
from compressive_transformer.runs.provenance import code_state


def steps_per_second(config: Path, overrides: list[str], actors: int, updates: int) -> float:
    cfg, runs = load_rl_config(config, [*overrides, f"train.actors={actors}"]), []
    for n in (1, updates, 2 * updates):  # the first warms up (imports, caches) and is not counted
        tc = replace(cfg.train, env_steps=n * cfg.train.n_envs * cfg.train.unroll, checkpoint_every=10 * n)
        with tempfile.TemporaryDirectory() as tmp:
            runs.append(train_agent(replace(cfg, train=tc), Path(tmp) / "run", progress=False))
    return (runs[2].env_steps - runs[1].env_steps) / (runs[2].seconds - runs[1].seconds)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("config", type=Path, nargs="?", default=Path("configs/agents/nonmatching.toml"))
    p.add_argument("--actors", type=int, nargs="+", default=[0, 1, 2, 4])
    p.add_argument("--updates", type=int, default=40)
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE")
    args = p.parse_args(argv)
    rates = {n: steps_per_second(args.config, args.overrides, n, args.updates) for n in args.actors}
    for n, rate in rates.items():
        print(f"train.actors = {n}: {rate:.0f} environment steps/s", flush=True)
    command = " ".join(["python -m benchmarks.agents.throughput", *sys.argv[1:]])
    print(json.dumps({"command": command, "machine": machine_info(), "code": code_state(), "steps_per_second": rates}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
