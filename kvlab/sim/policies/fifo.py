"""FIFO: evict the block stored longest ago, whatever its hits (libCacheSim FIFO.c)."""
from __future__ import annotations

from .base import register
from .lru import LRU


@register
class FIFO(LRU):
    """First in, first out: LRU's queue, except that a hit changes nothing; the oldest stored block leaves."""

    name = "fifo"
    title = "FIFO"

    def lookup(self, b):
        return b in self.od
