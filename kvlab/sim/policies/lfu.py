"""LFU over the blocks in the cache (libCacheSim LFU.c).

The published idea leaves open what a count covers and how ties break. Following libCacheSim: a block's count
starts at 1 when it is stored and is forgotten when it leaves (in-cache LFU, not the whole history), and among
the least-used blocks the one that reached its count earliest leaves first - which is the least recently used
of them, since every hit raises the count.
"""
from __future__ import annotations

from collections import OrderedDict

from .base import Policy, register


@register
class LFU(Policy):
    """Least frequently used (in-cache counts, least recent first among equals)."""

    name = "lfu"
    title = "LFU"

    def __init__(self, capacity, future=None):
        super().__init__(capacity, future)
        self.freq: dict = {}  # resident block -> uses since stored
        self.buckets: dict = {}  # count -> OrderedDict of its blocks, in the order they reached it
        self.min_freq = 0  # smallest count among residents (0: empty)

    def _add(self, b, f):
        self.freq[b] = f
        self.buckets.setdefault(f, OrderedDict())[b] = None

    def _drop(self, b):
        f = self.freq.pop(b)
        q = self.buckets[f]
        del q[b]
        if not q:
            del self.buckets[f]
            if f == self.min_freq:
                self.min_freq = min(self.buckets) if self.buckets else 0
        return f

    def lookup(self, b):
        if b not in self.freq:
            return False
        f = self._drop(b)
        self._add(b, f + 1)
        if self.min_freq == 0 or f + 1 < self.min_freq:
            self.min_freq = f + 1
        return True

    def insert(self, b):
        v = -1
        if len(self.freq) >= self.capacity:
            v = next(iter(self.buckets[self.min_freq]))
            self._drop(v)
        self._add(b, 1)
        self.min_freq = 1
        return v, True

    def remove(self, b):
        self._drop(b)

    def __contains__(self, b):
        return b in self.freq

    def __len__(self):
        return len(self.freq)
