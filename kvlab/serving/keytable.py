"""A hash map from 64-bit int keys to non-negative int values, kept in numpy arrays so that a run of hundreds of
keys is looked up, inserted or removed in a few vectorized passes.

The block pool (kvlab.serving.blockpool) maps every cached block key to its block. A prompt of tens of thousands of
tokens has a thousand or more keys, and a Python dict pays a cache miss or two per key (the stored key objects are
scattered over the heap); here keys and values sit side by side in two arrays. Open addressing with linear probing
and Fibonacci hashing; a removed entry leaves a tombstone, and the table is rebuilt when live entries and tombstones
fill more than a quarter of it (it grows when live entries alone would fill an eighth): short probe runs keep a
bulk lookup to a few vectorized passes.
"""
from __future__ import annotations

import numpy as np

EMPTY, GONE = -1, -2  # value of a slot never used, of a slot whose entry was removed
GOLDEN = np.uint64(0x9E3779B97F4A7C15)  # Fibonacci hashing's multiplier (2^64 / golden ratio)
MASK64 = (1 << 64) - 1
VECTOR_PASSES = 4  # probe passes done over whole arrays before the stragglers are probed one by one


class KeyTable:
    """int64 key -> int value >= 0. Bulk operations take and return numpy arrays; scalar ones Python ints."""

    def __init__(self, capacity: int = 1024):
        bits = max(int(capacity - 1).bit_length() + 3, 4)  # at least eight times the entries expected
        self._alloc(bits)

    def _alloc(self, bits: int) -> None:
        self.bits = bits  # log2 of the slots
        self.mask = (1 << bits) - 1  # slot index mask
        pairs = np.empty((1 << bits, 2), np.int64)  # [S, 2] key and value of each slot side by side (one cache
        pairs[:, 1] = EMPTY  # line per probe)
        self.keys = pairs[:, 0]  # [S] key of each slot
        self.vals = pairs[:, 1]  # [S] value, EMPTY or GONE
        self.count = 0  # live entries
        self.used = 0  # live entries and tombstones

    def __len__(self) -> int:
        return self.count

    def _slots(self, keys: np.ndarray) -> np.ndarray:
        """Home slot of each key."""
        return ((keys.view(np.uint64) * GOLDEN) >> np.uint64(64 - self.bits)).astype(np.int64)

    def _slot(self, key: int) -> int:
        return (((key & MASK64) * 0x9E3779B97F4A7C15) & MASK64) >> (64 - self.bits)

    # -- bulk -------------------------------------------------------------------------------------------------------
    def find(self, keys: np.ndarray) -> np.ndarray:
        """Slot holding each key, -1 where absent."""
        keys = np.asarray(keys, np.int64)
        out = np.full(len(keys), -1, np.int64)
        s = self._slots(keys)
        todo = np.arange(len(keys))
        tk, tv, mask = self.keys, self.vals, self.mask
        for _ in range(VECTOR_PASSES):
            if not len(todo):
                return out
            v = tv[s]
            hit = (v >= 0) & (tk[s] == keys[todo])
            out[todo[hit]] = s[hit]
            go = ~hit & (v != EMPTY)  # another key or a tombstone: probe on
            todo, s = todo[go], (s[go] + 1) & mask
        for i in todo.tolist():  # the few long probe runs, one at a time
            out[i] = self._find1(int(keys[i]))
        return out

    def get_many(self, keys: np.ndarray) -> np.ndarray:
        """Value of each key, -1 where absent."""
        s = self.find(keys)
        return np.where(s >= 0, self.vals[s], -1)

    def insert_new(self, keys: np.ndarray, vals: np.ndarray) -> None:
        """Add entries whose keys are absent and distinct (not checked)."""
        keys, vals = np.asarray(keys, np.int64), np.asarray(vals, np.int64)
        self._room(len(keys))
        s = self._slots(keys)
        tk, tv = self.keys, self.vals
        # one vectorized pass: keys whose home slot is open, one per slot; the rest probe one at a time
        v = tv[s]
        cand = np.flatnonzero(v < 0)  # empty or a tombstone: a new key may take it
        _, first = np.unique(s[cand], return_index=True)
        win = cand[first]
        ws = s[win]
        reused = int(np.count_nonzero(v[win] == GONE))
        tk[ws] = keys[win]
        tv[ws] = vals[win]
        self.count += len(win)
        self.used += len(win) - reused
        if len(win) < len(keys):
            rest = np.ones(len(keys), bool)
            rest[win] = False
            for k, x in zip(keys[rest].tolist(), vals[rest].tolist()):
                self._put_new(k, x)

    def _put_new(self, key: int, val: int) -> None:
        """Add one entry whose key is absent, at the first open slot of its probe run."""
        s, tv, mask = self._slot(key), self.vals, self.mask
        while True:
            v = int(tv[s])
            if v < 0:
                break
            s = (s + 1) & mask
        self.keys[s] = key
        tv[s] = val
        self.count += 1
        self.used += v == EMPTY

    def remove_many(self, keys: np.ndarray) -> None:
        """Remove entries whose keys are present and distinct (not checked)."""
        s = self.find(keys)
        self.vals[s] = GONE
        self.count -= len(s)

    def _room(self, n: int) -> None:
        """Make room for n more entries: rebuild when live entries and tombstones would fill over a quarter."""
        if self.used + n <= (self.mask + 1) // 4:
            return
        live = np.flatnonzero(self.vals >= 0)
        keys, vals = self.keys[live], self.vals[live]
        bits = self.bits
        while (self.count + n) > (1 << bits) // 8:  # grow to keep live entries under an eighth after rebuild
            bits += 1
        self._alloc(bits)
        if len(keys):
            self.insert_new(keys, vals)

    # -- scalar -----------------------------------------------------------------------------------------------------
    def _find1(self, key: int) -> int:
        s, tk, tv, mask = self._slot(key), self.keys, self.vals, self.mask
        while True:
            v = int(tv[s])
            if v == EMPTY:
                return -1
            if v >= 0 and int(tk[s]) == key:
                return s
            s = (s + 1) & mask

    def get(self, key: int, default=None):
        s = self._find1(key)
        return default if s < 0 else int(self.vals[s])

    def __contains__(self, key: int) -> bool:
        return self._find1(key) >= 0

    def __getitem__(self, key: int) -> int:
        s = self._find1(key)
        if s < 0:
            raise KeyError(key)
        return int(self.vals[s])

    def __setitem__(self, key: int, val: int) -> None:
        s = self._find1(key)
        if s >= 0:
            self.vals[s] = val
        else:
            self._room(1)
            self._put_new(key, val)

    def __delitem__(self, key: int) -> None:
        s = self._find1(key)
        if s < 0:
            raise KeyError(key)
        self.vals[s] = GONE
        self.count -= 1

    def items(self) -> list[tuple[int, int]]:
        live = np.flatnonzero(self.vals >= 0)
        return list(zip(self.keys[live].tolist(), self.vals[live].tolist()))
