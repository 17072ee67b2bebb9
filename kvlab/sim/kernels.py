"""Compiled (numba) kernels for the LRU tiering simulator and for stack distances.

Two loops that numpy cannot vectorize well, written once in plain Python and compiled with
numba when it is importable (`@njit(cache=True)`: compiled once per machine, then loaded from
numba's on-disk cache). Without numba, `ENABLED` is False and kvlab.sim.tiering / kvlab.sim.stackdist keep
their numpy paths; setting the environment variable KVLAB_NUMBA=0 forces those paths too.

  `tiered_lru`       exclusive LRU tiers as one intrusive doubly-linked list over dense block ids
                     (array-based prev/next, a region id per block) cut into consecutive regions, HBM first:
                     each access is O(1), moves its block to the front and shifts each full region's tail
                     pointer one node up (a demotion), dropping the last region's tail; per-tier prefix
                     hits, stale blocks, demotions and per-request TTFT terms are summed in the loop.
  `stack_distances`  LRU stack distances with a Fenwick tree over access positions, one mark at each
                     block's latest access: the distance is the number of marks after its previous access.
"""
from __future__ import annotations

import os

import numpy as np

try:  # numba is a core dependency; the numpy paths remain for environments without it
    from numba import njit
    ENABLED = os.environ.get("KVLAB_NUMBA", "1") != "0"
except ImportError:  # pragma: no cover - exercised only without numba
    njit = None
    ENABLED = False

DENSE_SLACK = 8  # ids in [0, DENSE_SLACK x accesses + 1024) are indexed directly; others are renumbered


def _tiered_lru(ids, off, inp, ts, block_tokens, caps, ttl, ttl_on, transfer_s, n):
    """Simulate exclusive LRU tiers over dense block ids 0..n-1, request by request.

    ids [A], off [R + 1], inp [R] (prompt tokens), ts [R] (arrival seconds), caps [3] (blocks),
    transfer_s [3] (seconds per block into HBM). The tiers with room form consecutive regions of one
    LRU list (most recent first), so demoting a tier's least recent block is moving that region's tail
    pointer one node up. With ttl_on, a DRAM block idle longer than ttl seconds counts as gone (no SSD
    tier: such blocks sit at DRAM's tail, so dropping them lazily on access leaves every live block
    where eager expiry would).
    Returns hit_blocks [3], hit_tokens [3], req_hit [R] tokens, transfer [R] seconds,
    demoted [3] (blocks pushed out of each tier) and stale (found after the request's first miss)."""
    R = len(off) - 1
    tid = np.zeros(3, np.int64)  # tier of each region (the tiers with room, top down)
    cap = np.zeros(3, np.int64)  # capacity of each region
    m = 0
    for k in range(3):
        if caps[k] > 0:
            tid[m] = k
            cap[m] = caps[k]
            m += 1
    nxt = np.empty(n + 1, np.int32)  # node n is the sentinel of the circular list
    prv = np.empty(n + 1, np.int32)
    nxt[n] = n
    prv[n] = n
    where = np.full(n, 3, np.int8)  # region of each block, 3: absent
    last = np.zeros(n if ttl_on else 0, np.float64)  # time of each block's last use (for the TTL)
    size = np.zeros(3, np.int64)  # blocks in each region
    tail = np.zeros(3, np.int64)  # least recent block of each region (when not empty)
    hit_blocks = np.zeros(3, np.int64)
    hit_tokens = np.zeros(3, np.int64)
    demoted = np.zeros(3, np.int64)
    req_hit = np.zeros(R, np.int64)
    transfer = np.zeros(R, np.float64)
    stale = 0
    for r in range(R):
        now = ts[r]
        a0 = off[r]
        a1 = off[r + 1]
        intact = True
        for a in range(a0, a1):
            b = ids[a]
            g = where[b]
            k = 3
            if g < 3:  # take it out of the list
                p = prv[b]
                q = nxt[b]
                nxt[p] = q
                prv[q] = p
                if tail[g] == b:
                    tail[g] = p
                size[g] -= 1
                k = tid[g]
                if ttl_on and k == 1 and now - last[b] > ttl:
                    k = 3  # expired host state
            if k == 3:
                intact = False
            elif intact:
                tok = block_tokens if a < a1 - 1 else inp[r] - (a1 - a0 - 1) * block_tokens
                hit_blocks[k] += 1
                hit_tokens[k] += tok
                req_hit[r] += tok
                transfer[r] += transfer_s[k]
            else:
                stale += 1
            if ttl_on:
                last[b] = now
            q = nxt[n]  # to the front: the most recent block of the top region
            nxt[b] = q
            prv[b] = n
            prv[q] = b
            nxt[n] = b
            where[b] = 0
            if size[0] == 0:
                tail[0] = b
            size[0] += 1
            i = 0
            while size[i] > cap[i]:  # region i's tail crosses into region i + 1 (or drops out)
                v = tail[i]
                tail[i] = prv[v]
                size[i] -= 1
                demoted[tid[i]] += 1
                j = i + 1
                if j == m:
                    p = prv[v]
                    nxt[p] = n
                    prv[n] = p
                    where[v] = 3
                    break
                where[v] = j
                if size[j] == 0:
                    tail[j] = v
                size[j] += 1
                i = j
    return hit_blocks, hit_tokens, req_hit, transfer, demoted, stale


def _stack_distances(ids, n):
    """prev [A] (previous access to the same block, -1) and LRU stack distance [A] (-1: first access)
    over dense ids 0..n-1. tree is a Fenwick tree over positions 1..A with a 1 at each block's latest
    access; `seen` marks in all, `seen - prefix(prev)` of them lie after the previous access."""
    A = len(ids)
    latest = np.full(n, -1, np.int64)
    tree = np.zeros(A + 1, np.int32)
    prev = np.empty(A, np.int64)
    dist = np.empty(A, np.int64)
    seen = 0
    for i in range(A):
        b = ids[i]
        p = latest[b]
        prev[i] = p
        if p < 0:
            dist[i] = -1
            seen += 1
        else:
            s = 0
            j = p + 1
            while j > 0:
                s += tree[j]
                j -= j & -j
            dist[i] = seen - s
            j = p + 1
            while j <= A:
                tree[j] -= 1
                j += j & -j
        j = i + 1
        while j <= A:
            tree[j] += 1
            j += j & -j
        latest[b] = i
    return prev, dist


if ENABLED:
    _tiered_lru = njit(cache=True, nogil=True)(_tiered_lru)
    _stack_distances = njit(cache=True, nogil=True)(_stack_distances)


def dense_ids(ids) -> tuple[np.ndarray, int]:
    """(ids as int64 indices 0..n-1, n): as they are when already small non-negative integers (a trace's
    block ids are dense), else renumbered (np.unique), so any integer ids work."""
    ids = np.ascontiguousarray(ids, dtype=np.int64)
    if len(ids) == 0:
        return ids, 0
    lo, hi = ids.min(), ids.max()
    if lo >= 0 and hi < DENSE_SLACK * len(ids) + 1024:
        return ids, int(hi) + 1
    uniq, inv = np.unique(ids, return_inverse=True)
    return inv.astype(np.int64).reshape(-1), len(uniq)


def tiered_lru(ids, off, inp, ts, block_tokens: int, caps, ttl: float, ttl_on: bool, transfer_s):
    """Run the tier kernel on a trace's arrays (see `_tiered_lru`)."""
    dense, n = dense_ids(ids)
    return _tiered_lru(dense, np.ascontiguousarray(off, np.int64), np.ascontiguousarray(inp, np.int64),
                       np.ascontiguousarray(ts, np.float64), int(block_tokens), np.asarray(caps, np.int64),
                       float(ttl), bool(ttl_on), np.ascontiguousarray(transfer_s, np.float64), n)


def stack_distances(ids) -> tuple[np.ndarray, np.ndarray]:
    """(prev, dist), each [A], for any integer ids (see `_stack_distances`)."""
    dense, n = dense_ids(ids)
    return _stack_distances(dense, n)
