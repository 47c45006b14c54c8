"""Brute-force dependency simulation: which input tokens can each output state depend on?

Independent of :mod:`compressive_transformer.core.context`: every hidden state is a set of token positions (a Python int
used as a bitset), and the models' forward passes (Transformer-QL: the paper's Figure 2; Transformer-XL: Figure 3;
Compressive Transformer: Algorithm 1 of Rae et al.) are replayed on those sets over a long stream, starting from
zero memories (empty sets). Attention makes a state depend on the union of everything it can attend to (memory
plus the causal part of the segment, itself included); pooling unions a group of ``c`` states; the accumulation
layer unions, per token position, the newest state of every scale that ends at or before that position.

Figure 2 hands the accumulation layer ``(s_t, m_t)`` of each scale; the simulation also keeps ``m_{t-1}``, since
with ``n_m = 0`` and ``c = 2`` the state the first output position needs has already left ``m_t``.

The result is read in steady state, on the last segment: ``min`` is the fewest strictly-past tokens any output
depends on, ``max_inclusive`` the most tokens any output depends on counting its own token.
"""

from __future__ import annotations

from dataclasses import dataclass

State = tuple[int, int]  # (position of the newest token the state summarises, dependency bitset)


@dataclass(frozen=True)
class Simulated:
    min: int
    max_inclusive: int


def _attend(segment: list[State], memory: list[State]) -> list[State]:
    """One attention layer: position j sees all of memory and segment[0..j]."""
    acc = 0
    for _, deps in memory:
        acc |= deps
    out = []
    for end, deps in segment:
        acc |= deps
        out.append((end, acc))
    return out


def _shift(memory: list[State], new: list[State], mem_len: int) -> list[State]:
    return (memory + new)[-mem_len:] if mem_len > 0 else []


def _zeros(n: int, last_end: int, unit: int) -> list[State]:
    """``n`` zero states (no dependency) whose ends line up just before ``last_end + unit``."""
    return [(last_end - (n - 1 - k) * unit, 0) for k in range(n)]


def _measure(outputs: list[State]) -> Simulated:
    mins, maxs = [], []
    for pos, deps in outputs:
        mins.append(bin(deps & ((1 << pos) - 1)).count("1"))
        maxs.append(bin(deps).count("1"))
    return Simulated(min(mins), max(maxs))


def _run(step, seg_len: int, horizon: int) -> Simulated:
    """Run ``step(t_end)`` over enough segments for the memories to reach steady state; check that it is steady."""
    n_steps = horizon // seg_len + 4
    results = [_measure(step((t + 1) * seg_len - 1)) for t in range(n_steps)]
    assert results[-1] == results[-2], "simulation did not reach a steady state; raise the horizon"
    return results[-1]


def simulate_transformer_ql(
    *, seg_len: int, mem_len: int, scales: tuple[int, ...], compression_rate: int, output_layers: int
) -> Simulated:
    """Replay Figure 2 of the Transformer-QL paper on dependency sets."""
    n_s, c, w = seg_len, compression_rate, seg_len + mem_len
    assert (len(scales) == 1 or w % c == 0) and n_s % c ** (len(scales) - 1) == 0, "shape outside the assumptions"
    seg, mem, unit, shift = [n_s], [mem_len], [1], [n_s]  # per scale, in states of that scale
    for _ in scales[1:]:
        seg.append(min(w // c, seg[-1]))
        mem.append(w - seg[-1])
        unit.append(unit[-1] * c)
        shift.append(shift[-1] // c)
    # memory buffers, one per stored hidden-state sequence, in Figure 2's order of l_g
    lens = []
    for i, n_layers in enumerate(scales):
        lens += [(mem[i], unit[i])] * (n_layers + (1 if i == 0 else 0))
        if i + 1 < len(scales):
            lens.append((mem[i + 1], unit[i + 1]))
    lens += [(mem_len, 1)] * (1 + output_layers)
    mems = [_zeros(m, -1, u) for m, u in lens]

    def step(t_end: int) -> list[State]:
        new = list(mems)
        s = [(p, 1 << p) for p in range(t_end - n_s + 1, t_end + 1)]
        g = 0
        new[0] = _shift(mems[0], s, mem[0])
        acc_inputs = []
        for i, n_layers in enumerate(scales):
            for _ in range(n_layers):
                s = _attend(s, mems[g])
                g += 1
                new[g] = _shift(mems[g], s[: shift[i]], mem[i])
            acc_inputs.append(mems[g] + new[g] + s)  # every state of this scale at hand, oldest first
            if i + 1 < len(scales):
                window = mems[g] + s
                assert len(window) == w
                pooled = []
                for k in range(0, w, c):
                    deps = 0
                    for _, d in window[k : k + c]:
                        deps |= d
                    pooled.append((window[k + c - 1][0], deps))
                s = pooled[-seg[i + 1] :]
                g += 1
                new[g] = _shift(mems[g], s[: shift[i + 1]], mem[i + 1])
        accumulated = []
        for p in range(t_end - n_s + 1, t_end + 1):
            deps = 0
            for states in acc_inputs:
                newest = {}
                for end, d in states:  # later entries are newer versions of the same state
                    newest[end] = d
                deps |= newest[max(e for e in newest if e <= p)]
            accumulated.append((p, deps))
        s = accumulated
        g += 1
        new[g] = _shift(mems[g], s, mem_len)
        for _ in range(output_layers):
            s = _attend(s, mems[g])
            g += 1
            new[g] = _shift(mems[g], s, mem_len)
        assert g == len(mems) - 1
        mems[:] = new
        return s

    horizon = 2 * (sum(scales) + output_layers + len(scales)) * w * c ** (len(scales) - 1) + n_s
    return _run(step, n_s, horizon)


def simulate_transformer_xl(*, seg_len: int, mem_len: int, n_layers: int) -> Simulated:
    return simulate_compressive(seg_len=seg_len, mem_len=mem_len, cmem_len=0, compression_rate=1, n_layers=n_layers)


def simulate_compressive(
    *, seg_len: int, mem_len: int, cmem_len: int, compression_rate: int, n_layers: int
) -> Simulated:
    """Replay Algorithm 1 of Rae et al. (Figure 3 of the QL paper when ``cmem_len == 0``) on dependency sets."""
    n_s, c = seg_len, compression_rate
    assert n_s % c == 0, "whole groups of c are evicted each segment"
    mems = [_zeros(mem_len, -1, 1) for _ in range(n_layers)]
    cmems = [_zeros(cmem_len, -1 - mem_len, c) for _ in range(n_layers)]

    def step(t_end: int) -> list[State]:
        s = [(p, 1 << p) for p in range(t_end - n_s + 1, t_end + 1)]
        for k in range(n_layers):
            h = s
            s = _attend(h, cmems[k] + mems[k])
            both = mems[k] + h
            evicted, mems[k] = both[: len(both) - mem_len], both[len(both) - mem_len :]
            pooled = []
            for j in range(0, len(evicted), c):
                deps = 0
                for _, d in evicted[j : j + c]:
                    deps |= d
                pooled.append((evicted[j + c - 1][0], deps))
            cmems[k] = _shift(cmems[k], pooled, cmem_len)
        return s

    return _run(step, n_s, 2 * n_layers * (n_s + mem_len + c * cmem_len) + n_s)
