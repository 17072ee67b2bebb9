"""FIFO: evict the block stored longest ago, whatever its hits (libCacheSim FIFO.c)."""
from __future__ import annotations

from collections import OrderedDict

from .base import Policy, register


@register
class FIFO(Policy):
    """First in, first out: hits change nothing; the oldest stored block leaves."""

    name = "fifo"
    title = "FIFO"
    kernel = 1

    def __init__(self, capacity, future=None):
        super().__init__(capacity, future)
        self.od: OrderedDict = OrderedDict()  # residents, oldest first

    def lookup(self, b):
        return b in self.od

    def insert(self, b):
        v = self.od.popitem(last=False)[0] if len(self.od) >= self.capacity else -1
        self.od[b] = None
        return v, True

    def remove(self, b):
        del self.od[b]

    def __contains__(self, b):
        return b in self.od

    def __len__(self):
        return len(self.od)
