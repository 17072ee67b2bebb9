"""LRU stack distances for a whole trace in one vectorized pass, and the hit-rate curve they give.

The stack distance of an access is the number of distinct blocks touched since the previous
access to the same block (cold accesses: -1). An LRU cache of C blocks hits exactly the accesses
with 0 <= distance < C, so one pass gives the hit rate at every capacity (Mattson et al., 1970).

With prev[i] the previous access to the same block, the distance is
  d(i) = (i - prev[i] - 1) - #{j : prev[i] < prev[j], j < i}
(the accesses in between minus the repeats among them). The second term counts, for each reuse,
the earlier reuses whose own previous access is later than its own: an inversion count per element,
computed bit by bit (a wavelet-matrix pass) with O(N) numpy work per bit, so O(N log N) in all with no
Python loop over accesses. Where numba is available the same distances come from a compiled Fenwick-tree
pass (kvlab.sim.kernels), which is several times faster; the numpy path stays as the fallback.

`LruIndex` is that pass over a trace, kept: the distances, their running maximum within each request (what a
prefix hit needs) and the tokens of each access, which every LRU configuration of the trace then reads
(kvlab.sim.curves, kvlab.sim.tiering, kvlab.sim.analyze).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import kernels
from .traces import Trace, access_tokens, need_prefixes


def previous_access(ids: np.ndarray) -> np.ndarray:
    """prev[i]: index of the previous access to ids[i], or -1.  ids: [N] integers."""
    ids = np.asarray(ids)
    n = len(ids)
    order = np.argsort(ids, kind="stable")
    s = ids[order]
    same = s[1:] == s[:-1]
    prev = np.full(n, -1, np.int64)
    prev[order[1:][same]] = order[:-1][same]
    return prev


def earlier_greater(y: np.ndarray) -> np.ndarray:
    """For distinct non-negative integers y[k]: how many y[k'] with k' < k are greater.  [Q] -> [Q]

    A wavelet matrix: at each bit (high to low) the values are stably partitioned, zeros first, and every
    query tracks where its prefix [0, k) of equal higher bits went; where its own bit is 0, the ones in
    that range are earlier and greater."""
    q = len(y)
    if q == 0:
        return np.zeros(0, np.int64)
    it = np.int32 if max(q, int(np.max(y))) < 2**31 - 1 else np.int64  # int32 halves the memory traffic
    out = np.zeros(q, it)
    cur = np.asarray(y, it)  # [Q] values in level order
    v = cur.copy()  # each query's own value
    s = np.zeros(q, it)  # start of each query's range in level order
    e = np.arange(q, dtype=it)  # end (exclusive): the prefix [0, k)
    c1 = np.zeros(q + 1, it)  # exclusive prefix counts of ones
    for b in range(int(cur.max()).bit_length() - 1, -1, -1):
        bit = (cur >> b) & 1
        np.cumsum(bit, out=c1[1:])
        zeros = it(q - int(c1[-1]))
        cs, ce = c1[s], c1[e]
        vb = ((v >> b) & 1).astype(bool)
        out += np.where(vb, it(0), ce - cs)
        s = np.where(vb, zeros + cs, s - cs)
        e = np.where(vb, zeros + ce, e - ce)
        m = bit.astype(bool)
        cur = np.concatenate((cur[~m], cur[m]))
    return out.astype(np.int64)


def stack_distances(ids: np.ndarray, prev: np.ndarray | None = None) -> np.ndarray:
    """LRU stack distance of every access (-1 for a block's first access).  [N] -> [N]
    With numba, a compiled Fenwick-tree pass (kvlab.sim.kernels; `prev` is then unused), else the
    vectorized inversion count below."""
    if kernels.ENABLED:
        return kernels.stack_distances(ids)[1]
    return _stack_distances_numpy(ids, prev)


def _stack_distances_numpy(ids: np.ndarray, prev: np.ndarray | None = None) -> np.ndarray:
    """stack_distances from previous accesses and an inversion count (numpy only)."""
    prev = previous_access(ids) if prev is None else prev
    reuse = np.flatnonzero(prev >= 0)  # positions that reuse a block
    p = prev[reuse]
    d = np.full(len(prev), -1, np.int64)
    d[reuse] = reuse - p - 1 - earlier_greater(p)
    return d


def hit_curve(distances: np.ndarray, capacities=None) -> tuple[np.ndarray, np.ndarray]:
    """(capacities, LRU hits) for every capacity 1..max distance + 1 (or the given ones), from distances."""
    d = np.asarray(distances)
    d = d[d >= 0]
    hist = np.bincount(d) if len(d) else np.zeros(1, np.int64)
    cum = np.cumsum(hist)  # cum[c - 1] = accesses with distance < c
    if capacities is None:
        caps = np.arange(1, len(cum) + 1)
        return caps, cum
    caps = np.asarray(capacities, np.int64)
    hits = np.where(caps <= 0, 0, cum[np.clip(caps, 1, len(cum)) - 1])
    return caps, hits


def next_access(ids: np.ndarray, never: int = np.iinfo(np.int64).max) -> np.ndarray:
    """nxt[i]: index of the next access to ids[i], or `never`.  ids: [N] integers.  (Belady's key.)"""
    ids = np.asarray(ids)
    n = len(ids)
    order = np.argsort(ids, kind="stable")
    s = ids[order]
    same = s[1:] == s[:-1]
    nxt = np.full(n, never, np.int64)
    nxt[order[:-1][same]] = order[1:][same]
    return nxt


@dataclass
class LruIndex:
    """What one pass over a trace tells every LRU configuration: stack distances and their running maximum
    within each request (the capacity a prefix hit needs), plus per-access request, tokens and history."""

    prev: np.ndarray  # [A] previous access to the same block, -1 if none
    dist: np.ndarray  # [A] LRU stack distance, -1 for a first access
    prefix_dist: np.ndarray  # [A] running max of dist within the request (-1: never a prefix hit)
    req: np.ndarray  # [A] request of each access
    tok: np.ndarray  # [A] tokens each access stands for
    seen: np.ndarray  # [A] distinct blocks before each access

    @classmethod
    def build(cls, trace: Trace) -> "LruIndex":
        need_prefixes(trace)
        ids = trace.block_ids
        if kernels.ENABLED:
            prev, d = kernels.stack_distances(ids)
        else:
            prev = previous_access(ids)
            d = stack_distances(ids, prev)
        req = trace.request_of_access
        big = int(d.max()) + 2 if len(d) else 1
        v = np.where(d < 0, big - 1, d)
        run = np.maximum.accumulate(v + req * big) - req * big  # segmented running max
        cold = prev < 0
        return cls(prev, d, np.where(run >= big - 1, -1, run), req, access_tokens(trace, req),
                   np.cumsum(cold) - cold)
