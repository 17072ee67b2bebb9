"""Belady's offline optimum: evict the block whose next use lies furthest ahead.

`Belady` follows libCacheSim's Belady.c: every missed block is stored (demand paging), so it is the most hits
any policy that stores every block can get - the upper bound for LRU, FIFO, LFU, SIEVE, ARC and S3-FIFO
with admission "all" (Belady 1966; Mattson et al. 1970). `BeladyBypass` may decline the incoming block when
its next use is the furthest of all (or never): the optimum when a cache may choose not to store, the bound
for policies behind an admission filter. Ties (blocks never used again) do not change the hits; the smallest
block id leaves first, so that the reference and the compiled path move the same blocks between tiers.
"""
from __future__ import annotations

import heapq

from .base import NEVER, Policy, register


@register
class Belady(Policy):
    """Belady's MIN with demand paging (libCacheSim's Belady): evict the resident block used furthest ahead."""

    name = "belady"
    title = "Belady"
    offline = True
    bypass = False  # may decline the incoming block

    def __init__(self, capacity, future=None):
        super().__init__(capacity, future)
        self.key: dict = {}  # resident block -> its next use as pushed on the heap
        self.heap: list = []  # (-next use, block), lazily invalidated

    def _push(self, b):
        k = int(self.future[b])
        self.key[b] = k
        heapq.heappush(self.heap, (-k, b))

    def _top(self):
        while True:
            k, b = self.heap[0]
            if self.key.get(b) == -k:
                return -k, b
            heapq.heappop(self.heap)

    def lookup(self, b):
        if b in self.key:
            self._push(b)
            return True
        return False

    def insert(self, b):
        v = -1
        if len(self.key) >= self.capacity:
            k, v = self._top()
            kb = int(self.future[b])
            if self.bypass and (kb > k or (kb == k and b < v)):  # b would be the first to leave
                return b, False
            heapq.heappop(self.heap)
            del self.key[v]
        self._push(b)
        return v, True

    def remove(self, b):
        del self.key[b]

    def __contains__(self, b):
        return b in self.key

    def __len__(self):
        return len(self.key)


@register
class BeladyBypass(Belady):
    """The offline optimum when storing is optional: Belady's MIN that declines a block used furthest ahead."""

    name = "belady-bypass"
    title = "Belady (bypass)"
    bypass = True
