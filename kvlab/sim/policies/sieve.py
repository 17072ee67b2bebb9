"""SIEVE (Zhang et al., NSDI'24), as libCacheSim's Sieve.c runs it.

Blocks sit in one queue, newest at the head, each with a visited bit that a hit sets. A hand walks from the
tail toward the head, clearing visited bits, and evicts the first unvisited block; it stays where it stopped
(the next eviction resumes there) and wraps from the head back to the tail. New blocks enter at the head,
unvisited. Nothing moves on a hit.
"""
from __future__ import annotations

from .base import Policy, register


@register
class SIEVE(Policy):
    """SIEVE: a FIFO queue with a visited bit and a roving hand."""

    name = "sieve"
    title = "SIEVE"

    def __init__(self, capacity, future=None):
        super().__init__(capacity, future)
        self.visited: dict = {}  # resident block -> visited bit
        self.newer: dict = {}  # block -> its neighbour toward the head (None at the head)
        self.older: dict = {}  # block -> its neighbour toward the tail (None at the tail)
        self.head = self.tail = None  # newest, oldest
        self.hand = None  # where the next eviction starts (None: at the tail)

    def _unlink(self, b):
        n, o = self.newer.pop(b), self.older.pop(b)
        if n is None:
            self.head = o
        else:
            self.older[n] = o
        if o is None:
            self.tail = n
        else:
            self.newer[o] = n

    def lookup(self, b):
        if b in self.visited:
            self.visited[b] = 1
            return True
        return False

    def insert(self, b):
        v = -1
        if len(self.visited) >= self.capacity:
            v = self.tail if self.hand is None else self.hand
            while self.visited[v]:
                self.visited[v] = 0
                v = self.newer[v] if self.newer[v] is not None else self.tail
            self.hand = self.newer[v]
            self._unlink(v)
            del self.visited[v]
        self.newer[b], self.older[b] = None, self.head
        if self.head is not None:
            self.newer[self.head] = b
        self.head = b
        if self.tail is None:
            self.tail = b
        self.visited[b] = 0
        return v, True

    def remove(self, b):
        if b == self.hand:
            self.hand = self.newer[b]
        self._unlink(b)
        del self.visited[b]

    def __contains__(self, b):
        return b in self.visited

    def __len__(self):
        return len(self.visited)
