"""IMPALA's actor processes (``train.actors = N``): each steps its share of the environments with its own copy of
the agent and sends unrolls to the learner, which batches one unroll of every actor per update and publishes its
weights after each step.

Weights travel through shared memory (a state_dict the learner overwrites under a lock, and a version counter: the
number of updates behind them); an actor loads the newest at the start of each unroll. An actor runs one unroll
ahead of the learner: it starts the next as soon as the learner has taken its last, so it acts while the learner
learns, with weights one update older than those the learner applies its unroll to (V-trace corrects the lag; the
metrics report it as ``policy_lag``). ``train.actors_lockstep`` makes each actor wait for the weights of the update
before, for checks (no lag, no overlap). Unrolls travel as pickled bytes, one queue per actor. Actors ignore Ctrl-C
and stop when the learner asks, when it has gone, or on an error, which they report to the learner.
"""

from __future__ import annotations

import itertools
import os
import pickle
import queue
import signal
import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch
import torch.multiprocessing as mp

from compressive_transformer.agents.acting import Unroll, collect, join_unrolls, start_actors
from compressive_transformer.agents.actor_critic import ActorCritic
from compressive_transformer.agents.config import RLConfig
from compressive_transformer.agents.health import AgentDiverged

POLL_S = 0.05  # how often a waiting actor or learner looks at the stop event and the other side's health
JOIN_S = 10.0  # how long closing waits for an actor before terminating it


def actor_seeds(seed: int, index: int, per_actor: int, version: int) -> tuple[int, int]:
    """Actor ``index``'s torch seed and its environments' first seed. At a run's start, the first actor's are the
    run's (so one actor samples and sees the episodes the in-process actors do) and the others' environments
    continue its numbering; actors restarted at update ``version`` > 0 get seeds derived from it (new episodes, not
    those the run started with)."""
    derived = np.random.SeedSequence([seed, index, version]).generate_state(2)
    if version > 0:
        return int(derived[0]), int(derived[1])
    return (seed if index == 0 else int(derived[0])), seed + index * per_actor


@dataclass
class Failure:
    """What an actor sends instead of an unroll when it stops on an error."""

    message: str
    diverged: bool = False


@dataclass
class Links:
    """An actor's end of what it shares with the learner (multiprocessing objects, passed when the actor starts)."""

    shared: dict[str, torch.Tensor]  # the published weights, in shared memory
    version: Any  # shared int: the updates behind the published weights
    lock: Any  # guards weights and version together
    stop: Any  # event: the learner asks the actors to end
    queue: Any  # unrolls (pickled) to the learner
    slot: Any  # semaphore the learner releases when it takes an unroll: the actor may start the next
    lockstep: bool
    parent: int = 0  # the learner's process id (set in the actor)

    def running(self) -> bool:
        return not self.stop.is_set() and os.getppid() == self.parent

    def until(self, done: Callable[[], bool]) -> bool:
        """Wait for ``done()`` (which may block a moment) while the learner runs; whether it came."""
        while self.running():
            if done():
                return True
            time.sleep(1e-3)
        return False

    def put(self, item: Any) -> bool:
        data = pickle.dumps(item)
        return self.until(lambda: _try(lambda: self.queue.put(data, timeout=POLL_S), queue.Full))


def _try(action: Callable[[], Any], expected: type[Exception]) -> bool:
    try:
        action()
        return True
    except expected:
        return False


def _act(cfg: RLConfig, index: int, links: Links) -> None:
    """An actor process: its environments, its agent, and the loop: wait for a slot, load the newest weights,
    unroll, send."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the learner's to handle: it stops the actors
    links.queue.cancel_join_thread()  # exiting never waits on an unsent unroll
    links.parent, tc = os.getppid(), cfg.train
    per_actor = tc.n_envs // tc.actors
    acted, first = -1, links.version.value
    torch_seed, env_seed = actor_seeds(tc.seed, index, per_actor, first)
    torch.set_num_threads(1)
    torch.manual_seed(torch_seed)
    try:
        envs, agent, actors = start_actors(cfg, per_actor, env_seed)
        for k in itertools.count():
            if not links.until(lambda: links.slot.acquire(timeout=POLL_S)):
                return
            if links.lockstep and not links.until(lambda k=k: links.version.value >= first + k):
                return
            with links.lock:
                if links.version.value != acted:
                    agent.load_state_dict(links.shared)
                    acted = links.version.value
            roll, start, finished = collect(agent, envs, actors, tc.unroll)
            if not links.put(Unroll(roll, start, finished, [acted])):
                return
    except AgentDiverged as e:  # the learner says it in one line, as its own
        links.put(Failure(str(e), diverged=True))
    except Exception:  # noqa: BLE001  (whatever it is, the learner reports it)
        links.put(Failure(f"actor {index} failed:\n{traceback.format_exc()}"))


class ActorPool:
    """``cfg.train.actors`` actor processes (spawned, their environments split evenly) and the learner's end of
    their links; :meth:`close` stops them all, however training ended."""

    def __init__(self, cfg: RLConfig, agent: ActorCritic, version: int, *, lockstep: bool = False) -> None:
        ctx = mp.get_context("spawn")
        shared = {k: v.detach().clone().share_memory_() for k, v in agent.state_dict().items()}
        version_value, lock, stop = ctx.Value("q", version, lock=False), ctx.Lock(), ctx.Event()
        self.links = [
            Links(shared, version_value, lock, stop, ctx.Queue(maxsize=1), ctx.Semaphore(1), lockstep)
            for _ in range(cfg.train.actors)
        ]
        self.procs = [
            ctx.Process(target=_act, args=(cfg, i, links), name=f"actor-{i}", daemon=True)
            for i, links in enumerate(self.links)
        ]
        try:
            for p in self.procs:
                p.start()
        except BaseException:  # the actors started so far stop too
            self.close()
            raise

    def publish(self, agent: ActorCritic, version: int) -> None:
        """Make ``agent``'s weights, the result of ``version`` updates, the ones actors load next."""
        links = self.links[0]
        with links.lock, torch.no_grad():
            for k, v in agent.state_dict().items():
                links.shared[k].copy_(v)
            links.version.value = version

    def next(self) -> Unroll:
        """One unroll of every actor, joined along the environment axis in the actors' order."""
        return join_unrolls([self._get(i) for i in range(len(self.procs))])

    def _get(self, i: int) -> Unroll:
        while True:
            try:
                item = pickle.loads(self.links[i].queue.get(timeout=POLL_S * 20))
                break
            except queue.Empty:
                if not self.procs[i].is_alive():
                    raise RuntimeError(f"actor {i} exited (code {self.procs[i].exitcode})") from None
        if isinstance(item, Failure):
            raise AgentDiverged(item.message) if item.diverged else RuntimeError(item.message)
        self.links[i].slot.release()
        return item

    def checkpoint(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """Nothing of the actors goes into a checkpoint: a resumed run starts them afresh (see train.py)."""
        return {}, {}

    def close(self) -> None:
        """Stop every actor: ask, wait, then terminate what is left; no actor outlives this call."""
        self.links[0].stop.set()
        deadline = time.monotonic() + JOIN_S
        started = [p for p in self.procs if p.pid is not None]
        for p in started:
            p.join(max(0.0, deadline - time.monotonic()))
        for p in started:
            if p.is_alive():
                p.terminate()
                p.join()
        for links in self.links:
            links.queue.close()
            links.queue.cancel_join_thread()


__all__ = ["ActorPool", "Links", "actor_seeds"]
