"""LRU: evict the least recently used block (libCacheSim LRU.c)."""
from __future__ import annotations

from collections import OrderedDict

from .base import Policy, register


@register
class LRU(Policy):
    """Least recently used: a hit moves the block to the most recent end; the least recent block leaves."""

    name = "lru"
    title = "LRU"

    def __init__(self, capacity, future=None):
        super().__init__(capacity, future)
        self.od: OrderedDict = OrderedDict()  # residents, least recent first

    def lookup(self, b):
        if b in self.od:
            self.od.move_to_end(b)
            return True
        return False

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
