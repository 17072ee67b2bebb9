"""ARC (Megiddo and Modha, FAST'03), as libCacheSim's ARC.c runs it.

Two LRU lists of resident blocks - T1 (seen once since stored) and T2 (hit since) - and two ghost lists of
evicted ids - B1 (from T1) and B2 (from T2) - with a target p for T1's size that a B1 hit raises by
max(|B2| / |B1|, 1) and a B2 hit lowers by max(|B1| / |B2|, 1), within [0, capacity].

Where the paper leaves room, libCacheSim's choices are followed: the ghost lists are bounded as in the
paper's case IV (|T1| + |B1| <= c, all four lists <= 2c) but trimmed only when the cache is full and a block
must leave; REPLACE evicts T1's LRU block when T1 is not empty and larger than p (or equal to p on a B2 hit),
or when T2 is empty; a block found in a ghost list enters T2; without ghosts to trim and T1 full, T1's LRU
block leaves without a ghost entry. p is a float, compared with the integer list sizes as in libCacheSim.
"""
from __future__ import annotations

from collections import OrderedDict

from .base import Policy, register


@register
class ARC(Policy):
    """Adaptive replacement cache with libCacheSim's ghost-list handling."""

    name = "arc"
    title = "ARC"

    def __init__(self, capacity, future=None):
        super().__init__(capacity, future)
        self.t1: OrderedDict = OrderedDict()  # resident, seen once since stored; least recent first
        self.t2: OrderedDict = OrderedDict()  # resident, hit since stored
        self.b1: OrderedDict = OrderedDict()  # ghosts evicted from T1
        self.b2: OrderedDict = OrderedDict()  # ghosts evicted from T2
        self.p = 0.0  # target size of T1
        self.in_b1 = self.in_b2 = False  # the last block found was a B1 / B2 ghost
        self.ghost_now = False  # the current request hit a ghost (libCacheSim's vtime check)

    def lookup(self, b):
        self.ghost_now = False
        c = self.capacity
        if b in self.t1:
            self.in_b1 = self.in_b2 = False
            del self.t1[b]
            self.t2[b] = None
            return True
        if b in self.t2:
            self.in_b1 = self.in_b2 = False
            self.t2.move_to_end(b)
            return True
        if b in self.b1:
            self.in_b1, self.in_b2, self.ghost_now = True, False, True
            self.p = min(self.p + max(len(self.b2) / len(self.b1), 1.0), c)
            del self.b1[b]
        elif b in self.b2:
            self.in_b1, self.in_b2, self.ghost_now = False, True, True
            self.p = max(self.p - max(len(self.b1) / len(self.b2), 1.0), 0.0)
            del self.b2[b]
        return False

    def _replace(self):
        n1 = len(self.t1)
        if (n1 > 0 and (n1 > self.p or (n1 == self.p and self.in_b2))) or not self.t2:
            v = self.t1.popitem(last=False)[0]
            self.b1[v] = None
        else:
            v = self.t2.popitem(last=False)[0]
            self.b2[v] = None
        return v

    def _evict(self):
        c = self.capacity
        if self.ghost_now and (self.in_b1 or self.in_b2):
            return self._replace()
        if len(self.t1) + len(self.b1) + 1 > c:
            if self.b1:
                self.b1.popitem(last=False)
                return self._replace()
            return self.t1.popitem(last=False)[0]
        if len(self.t1) + len(self.b1) + len(self.t2) + len(self.b2) >= 2 * c and self.b2:
            self.b2.popitem(last=False)
        return self._replace()

    def insert(self, b):
        v = self._evict() if len(self.t1) + len(self.t2) >= self.capacity else -1
        if self.ghost_now and (self.in_b1 or self.in_b2):
            self.t2[b] = None
            self.in_b1 = self.in_b2 = self.ghost_now = False
        else:
            self.t1[b] = None
        return v, True

    def remove(self, b):
        if b in self.t1:
            del self.t1[b]
        else:
            del self.t2[b]

    def __contains__(self, b):
        return b in self.t1 or b in self.t2

    def __len__(self):
        return len(self.t1) + len(self.t2)
