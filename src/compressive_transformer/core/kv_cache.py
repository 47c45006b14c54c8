"""The inference cache of keys and values per layer: each memory slot's keys/values are projected once and reused
by every later step that still holds the slot, in buffers that successive memory states share.

It rides along in :class:`~compressive_transformer.core.memory.LayerMemory` (``kv``), and
:func:`~compressive_transformer.core.memory.update_layer` keeps it in step with the memory it describes. Training never
builds one.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

import torch
from torch import Tensor


class _Buffer:
    """What all windows of one cache buffer share: how far it has been written, and an epoch that moves when its
    newest window is moved back to the front (every older window is then void)."""

    __slots__ = ("end", "epoch")

    def __init__(self, end: int) -> None:
        self.end, self.epoch = end, 0


def spare_slots(n: int, width: int) -> int:
    """Room to leave after a cache window of ``width`` slots extended by ``n`` per step: one step's worth (at least
    64 slots), never more than the window itself. A move copies only the window, so moving often is cheap, and a
    smaller buffer is a lower peak memory (measured: room for two steps cost 8-56 MB more in evaluation)."""
    return min(max(n, 64), width + n)


@dataclass(frozen=True)
class SlotCache:
    """Keys | values per head of consecutive slots (inference): the window ``[start, stop)`` of a buffer along dim 2.

    Successive states share one buffer instead of each holding a copy. :meth:`extend` writes the new slots just past
    the window when nothing has been written there yet (this window ends at the buffer's frontier); when the buffer
    is full it moves the window back to the front of the same buffer and voids every older window (:attr:`valid`
    turns False: those states project their keys/values again); a state extended a second time gets a fresh buffer.
    So the usual chain of states copies each slot about once, and no window a state can still use ever changes.
    """

    buf: Tensor  # (B, H, L, 2 dh); only slots before shared.end have been written
    start: int
    stop: int
    shared: _Buffer
    epoch: int = 0

    @staticmethod
    def of(kv: Tensor, *, room: int) -> "SlotCache":
        """A cache holding ``kv`` (B, H, S, 2 dh), with space for ``room`` more slots before it has to move."""
        B, H, S, e = kv.shape
        buf = kv.new_empty(B, H, S + room, e)
        buf[:, :, :S] = kv
        return SlotCache(buf, 0, S, _Buffer(S))

    @property
    def valid(self) -> bool:
        return self.epoch == self.shared.epoch

    @property
    def kv(self) -> Tensor:
        """(B, H, stop - start, 2 dh), a view."""
        return self.buf[:, :, self.start : self.stop]

    def extend(self, new: Tensor) -> "SlotCache":
        """This window followed by ``new`` (B, H, n, 2 dh)."""
        if not self.valid:
            raise RuntimeError("this cache window was voided by a newer state; project the memory's keys/values again")
        n, width = new.shape[2], self.stop - self.start
        if self.shared.end != self.stop or width + n > self.buf.shape[2]:  # another state wrote past this one, or
            return SlotCache.of(torch.cat([self.kv, new], dim=2), room=spare_slots(n, width))  # too small: its own
        start, stop = self.start, self.stop
        if stop + n > self.buf.shape[2]:  # full: move this window to the front, voiding the older ones
            window = self.kv if start >= width else self.kv.clone()  # overlapping source and destination
            self.buf[:, :, :width] = window
            self.shared.epoch += 1
            start, stop = 0, width
        self.buf[:, :, stop : stop + n] = new  # past every usable window of this buffer: nobody reads it yet
        self.shared.end = stop + n
        return SlotCache(self.buf, start, stop + n, self.shared, self.shared.epoch)

    def last(self, n: int) -> "SlotCache":
        """The newest ``n`` slots: a narrower window of the same buffer."""
        return replace(self, start=self.stop - n)

    def map(self, fn: Callable[[Tensor], Tensor]) -> "SlotCache":
        """``fn`` applied to the buffer (row selection, device moves). Sharing :class:`_Buffer` stays safe when
        ``fn`` copies: a write or a move through either buffer only makes the other's windows more conservative."""
        return replace(self, buf=fn(self.buf))


@dataclass(frozen=True)
class KVCache:
    """A layer's inference cache: keys | values of its compressed slots and of its memory slots (in slot order), made
    with one version of the key/value weights."""

    cmem: SlotCache  # (B, H, cmem_len, 2 dh)
    mem: SlotCache  # (B, H, capacity, 2 dh)
    version: int

    @staticmethod
    def of(cmem: Tensor, mem: Tensor, *, version: int) -> "KVCache":
        return KVCache(SlotCache.of(cmem, room=0), SlotCache.of(mem, room=0), version)

    @property
    def valid(self) -> bool:
        """False once a newer state has moved one of the buffers over this state's windows."""
        return self.cmem.valid and self.mem.valid

    @property
    def kv(self) -> Tensor:
        """(B, H, cmem_len + capacity, 2 dh): [cmem; mem], a copy."""
        return torch.cat([self.cmem.kv, self.mem.kv], dim=2)

    def map(self, fn: Callable[[Tensor], Tensor]) -> "KVCache":
        return replace(self, cmem=self.cmem.map(fn), mem=self.mem.map(fn))


__all__ = ["KVCache", "SlotCache", "spare_slots"]
