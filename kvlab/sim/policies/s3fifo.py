"""S3-FIFO (Yang et al., SOSP'23), as libCacheSim's S3FIFO.c runs it.

Three FIFO queues: a small one for new blocks, a main one, and a ghost queue of block ids recently evicted from
the small one. A block found in the ghost queue is stored in main; any other new block in small. Evicting from
small: a block hit at least `move_to_main` times since it was stored moves to main, else it leaves (its id
into the ghost queue). Evicting from main: a block with a nonzero count is reinserted at main's head with its
count decremented (capped at 3 first: a 2-bit clock), else it leaves. Main is evicted from when it exceeds its
share or small is empty.

The paper leaves the queue sizes open; libCacheSim's defaults are followed: small = floor(0.1 x capacity),
main = the rest, ghost = floor(0.9 x capacity) ids, move_to_main = 2; and as in libCacheSim, until the first
eviction a new block goes to main once small is full. Capacities below 20 blocks are refused: libCacheSim
refuses an empty small queue (below 10) and stores no block as large as the whole small queue, so with unit
blocks a one-block small queue (10-19) would cache nothing at all.
"""
from __future__ import annotations

from collections import OrderedDict

from .base import Policy, register


@register
class S3FIFO(Policy):
    """S3-FIFO with libCacheSim's queue shares (10% small, 90% ghost) and threshold (2)."""

    name = "s3fifo"
    title = "S3-FIFO"
    min_capacity = 20
    small_ratio = 0.1  # small queue's share of the capacity (libCacheSim default)
    ghost_ratio = 0.9  # ghost queue's length as a share of the capacity (libCacheSim default)
    move_to_main = 2  # hits in small that move a block to main (libCacheSim default)

    @classmethod
    def min_capacity_reason(cls):
        return (f"its small queue of floor({cls.small_ratio} x capacity) blocks must hold 2: libCacheSim stores no "
                "block as large as the small queue")

    @classmethod
    def params(cls):
        return (cls.small_ratio, cls.ghost_ratio, float(cls.move_to_main))

    def __init__(self, capacity, future=None):
        super().__init__(capacity, future)
        c = self.capacity
        self.small_cap = int(c * self.small_ratio)
        self.main_cap = c - self.small_cap
        self.ghost_cap = int(c * self.ghost_ratio)
        self.small: OrderedDict = OrderedDict()  # block -> hits, oldest first
        self.main: OrderedDict = OrderedDict()  # block -> hits, oldest first
        self.ghost: OrderedDict = OrderedDict()  # evicted-from-small ids, oldest first
        self.hit_on_ghost = False  # the last lookup found the block's id in the ghost queue
        self.has_evicted = False  # any eviction so far

    def lookup(self, b):
        self.hit_on_ghost = False
        for q in (self.small, self.main):
            if b in q:
                q[b] += 1
                return True
        if b in self.ghost:
            del self.ghost[b]
            self.hit_on_ghost = True
        return False

    def _evict_small(self):
        while self.small:
            v, f = self.small.popitem(last=False)
            if f >= self.move_to_main:
                self.main[v] = 0
                continue
            if self.ghost_cap > 0:
                if len(self.ghost) >= self.ghost_cap:
                    self.ghost.popitem(last=False)
                self.ghost[v] = None
            return v
        return -1

    def _evict_main(self):
        while self.main:
            v, f = self.main.popitem(last=False)
            if f >= 1:
                self.main[v] = min(f, 3) - 1
                continue
            return v
        return -1

    def _evict(self):
        self.has_evicted = True
        if len(self.main) > self.main_cap or not self.small:
            return self._evict_main()
        return self._evict_small()

    def insert(self, b):
        v = -1
        while len(self.small) + len(self.main) + 1 > self.capacity:
            v = self._evict()
        if self.hit_on_ghost:
            self.hit_on_ghost = False
            self.main[b] = 0
        elif not self.has_evicted and len(self.small) >= self.small_cap:
            self.main[b] = 0
        else:
            self.small[b] = 0
        return v, True

    def remove(self, b):
        if b in self.small:
            del self.small[b]
        else:
            del self.main[b]

    def __contains__(self, b):
        return b in self.small or b in self.main

    def __len__(self):
        return len(self.small) + len(self.main)
