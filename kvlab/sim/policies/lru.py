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

    def insert_run(self, blocks):
        od = self.od  # one insert each, in order: the blocks leave oldest first, the run's own early blocks last
        od.update(dict.fromkeys(blocks))
        over = len(od) - self.capacity
        return blocks, [od.popitem(last=False)[0] for _ in range(over)] if over > 0 else []

    def remove(self, b):
        del self.od[b]

    def __contains__(self, b):
        return b in self.od

    def __len__(self):
        return len(self.od)
