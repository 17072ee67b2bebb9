"""Compiled (numba) paths of the eviction policies in kvlab.sim.policies, one cache or a tier hierarchy.

Every policy's state lives in a few arrays shared by all policies, so one kernel runs any policy in any tier
(a policy id picks the branch): intrusive doubly linked lists over dense block ids (`nx` toward the oldest,
`pv` toward the newest; sentinel nodes after the n blocks: lists 1-4 at n..n+3, LFU's count-f list at
n + 4 + f), a list tag and a counter per block, a binary heap for Belady, and a few scalars per tier. Each
branch is the reference class's logic (hence libCacheSim's) written over these arrays; tests hold the
two equal access by access. All kernels live in this one file because numba's on-disk cache notices edits
only to the file of the function it compiled.

  `run_one`   one cache over a trace's block stream: found blocks (libCacheSim's hits), prefix-hit blocks and
              tokens (only a request's leading run of cached blocks counts, as engines match prefixes)
  `run_curve` the same at many capacities, in threads (the compiled runs release the GIL)
  `tiered`    HBM / DRAM / SSD tiers with a policy and an admission rule each, demote-on-evict,
              promote-on-hit, a DRAM TTL with expiry to SSD: kvlab.sim.tiering.simulate_sequential compiled
"""
from __future__ import annotations

import heapq

import numpy as np

from . import kernels
from .kernels import dense_ids

ENABLED = kernels.ENABLED  # numba importable and KVLAB_NUMBA != "0"
NEVER = np.iinfo(np.int64).max

LRU, FIFO, LFU, SIEVE, S3FIFO, ARC, BELADY, BELADY_BYPASS = range(8)  # policy ids (Policy.kernel)
# per-tier scalars iv[k, .]
CAP, HAND, MINF, FA, FB, FG, SCAP, MCAP, GCAP, HS, THR = 0, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14  # 1..4: list sizes
NIV = 16


def _push(nx, pv, k, s, b):
    """Put b at the newest end of the list with sentinel s."""
    q = nx[k, s]
    nx[k, b] = q
    pv[k, b] = s
    pv[k, q] = b
    nx[k, s] = b


def _unlink(nx, pv, k, b):
    p = pv[k, b]
    q = nx[k, b]
    nx[k, p] = q
    pv[k, q] = p


def _heap_swap(hp, ct, k, i, j):
    a = hp[k, i]
    c = hp[k, j]
    hp[k, i] = c
    hp[k, j] = a
    ct[k, c] = i
    ct[k, a] = j


def _above(fut, x, y):
    """Block x leaves before block y: its next use is later, or the same (never again) and its id smaller -
    the reference's tie-break, so that both evict the same block among those never used again."""
    return fut[x] > fut[y] or (fut[x] == fut[y] and x < y)


def _heap_fix(hp, ct, fut, k, i, size):
    """Restore the max-heap on next use around position i (1-based) after its key changed."""
    while i > 1 and _above(fut, hp[k, i], hp[k, i // 2]):
        _heap_swap(hp, ct, k, i, i // 2)
        i //= 2
    while True:
        j = 2 * i
        if j > size:
            break
        if j + 1 <= size and _above(fut, hp[k, j + 1], hp[k, j]):
            j += 1
        if not _above(fut, hp[k, j], hp[k, i]):
            break
        _heap_swap(hp, ct, k, i, j)
        i = j


def _heap_delete(hp, ct, fut, iv, k, i):
    size = iv[k, HS]
    if i != size:
        _heap_swap(hp, ct, k, i, size)
    iv[k, HS] = size - 1
    if i < size:
        _heap_fix(hp, ct, fut, k, i, size - 1)


def init_tier(pol, k, cap, params, nx, pv, iv, fv, n):
    """Empty tier k of `cap` blocks under policy `pol`; sentinels point at themselves."""
    for s in range(n, nx.shape[1]):
        nx[k, s] = s
        pv[k, s] = s
    iv[k, CAP] = cap
    iv[k, HAND] = -1
    iv[k, MINF] = 1
    fv[k, 0] = 0.0
    if pol == S3FIFO:
        iv[k, SCAP] = int(cap * params[0])
        iv[k, MCAP] = cap - iv[k, SCAP]
        iv[k, GCAP] = int(cap * params[1])
        iv[k, THR] = int(params[2])


def lookup(pol, k, nx, pv, tag, ct, hp, iv, fv, fut, n, b):
    """True if b is resident in tier k (its hit recorded); False after a miss's bookkeeping."""
    t = tag[k, b]
    if pol == LRU:
        if t:
            _unlink(nx, pv, k, b)
            _push(nx, pv, k, n, b)
            return True
        return False
    if pol == FIFO:
        return t != 0
    if pol == LFU:
        if t:
            f = ct[k, b]
            _unlink(nx, pv, k, b)
            _push(nx, pv, k, n + 4 + f + 1, b)
            ct[k, b] = f + 1
            if f == iv[k, MINF] and nx[k, n + 4 + f] == n + 4 + f:
                iv[k, MINF] = f + 1
            return True
        return False
    if pol == SIEVE:
        if t:
            ct[k, b] = 1
            return True
        return False
    if pol == S3FIFO:
        iv[k, FA] = 0
        if t == 1 or t == 2:
            ct[k, b] += 1
            return True
        if t == 3:
            _unlink(nx, pv, k, b)
            tag[k, b] = 0
            iv[k, 3] -= 1
            iv[k, FA] = 1
        return False
    if pol == ARC:
        iv[k, FG] = 0
        if t == 1:
            iv[k, FA] = 0
            iv[k, FB] = 0
            _unlink(nx, pv, k, b)
            _push(nx, pv, k, n + 1, b)
            tag[k, b] = 2
            iv[k, 1] -= 1
            iv[k, 2] += 1
            return True
        if t == 2:
            iv[k, FA] = 0
            iv[k, FB] = 0
            _unlink(nx, pv, k, b)
            _push(nx, pv, k, n + 1, b)
            return True
        if t == 3:
            iv[k, FA] = 1
            iv[k, FB] = 0
            iv[k, FG] = 1
            fv[k, 0] = min(fv[k, 0] + max(iv[k, 4] / iv[k, 3], 1.0), float(iv[k, CAP]))
            _unlink(nx, pv, k, b)
            tag[k, b] = 0
            iv[k, 3] -= 1
        elif t == 4:
            iv[k, FA] = 0
            iv[k, FB] = 1
            iv[k, FG] = 1
            fv[k, 0] = max(fv[k, 0] - max(iv[k, 3] / iv[k, 4], 1.0), 0.0)
            _unlink(nx, pv, k, b)
            tag[k, b] = 0
            iv[k, 4] -= 1
        return False
    # Belady
    if t:
        _heap_fix(hp, ct, fut, k, ct[k, b], iv[k, HS])
        return True
    return False


def _arc_replace(k, nx, pv, tag, iv, fv, n):
    n1 = iv[k, 1]
    p = fv[k, 0]
    if (n1 > 0 and (n1 > p or (n1 == p and iv[k, FB] != 0))) or iv[k, 2] == 0:
        v = pv[k, n]
        _unlink(nx, pv, k, v)
        _push(nx, pv, k, n + 2, v)
        tag[k, v] = 3
        iv[k, 1] -= 1
        iv[k, 3] += 1
    else:
        v = pv[k, n + 1]
        _unlink(nx, pv, k, v)
        _push(nx, pv, k, n + 3, v)
        tag[k, v] = 4
        iv[k, 2] -= 1
        iv[k, 4] += 1
    return v


def _arc_evict(k, nx, pv, tag, iv, fv, n):
    cap = iv[k, CAP]
    if iv[k, FG] != 0 and (iv[k, FA] != 0 or iv[k, FB] != 0):
        return _arc_replace(k, nx, pv, tag, iv, fv, n)
    if iv[k, 1] + iv[k, 3] + 1 > cap:
        if iv[k, 3] > 0:
            g = pv[k, n + 2]
            _unlink(nx, pv, k, g)
            tag[k, g] = 0
            iv[k, 3] -= 1
            return _arc_replace(k, nx, pv, tag, iv, fv, n)
        v = pv[k, n]
        _unlink(nx, pv, k, v)
        tag[k, v] = 0
        iv[k, 1] -= 1
        return v
    if iv[k, 1] + iv[k, 3] + iv[k, 2] + iv[k, 4] >= 2 * cap and iv[k, 4] > 0:
        g = pv[k, n + 3]
        _unlink(nx, pv, k, g)
        tag[k, g] = 0
        iv[k, 4] -= 1
    return _arc_replace(k, nx, pv, tag, iv, fv, n)


def _s3_evict(k, nx, pv, tag, ct, iv, n):
    """One S3-FIFO eviction step; the block that left, or -1 (small emptied into main)."""
    iv[k, FB] = 1  # has evicted
    if iv[k, 2] > iv[k, MCAP] or iv[k, 1] == 0:
        while iv[k, 2] > 0:
            v = pv[k, n + 1]
            _unlink(nx, pv, k, v)
            f = ct[k, v]
            if f >= 1:
                _push(nx, pv, k, n + 1, v)
                ct[k, v] = min(f, 3) - 1
                continue
            tag[k, v] = 0
            iv[k, 2] -= 1
            return v
        return -1
    while iv[k, 1] > 0:
        v = pv[k, n]
        _unlink(nx, pv, k, v)
        iv[k, 1] -= 1
        if ct[k, v] >= iv[k, THR]:
            _push(nx, pv, k, n + 1, v)
            tag[k, v] = 2
            ct[k, v] = 0
            iv[k, 2] += 1
            continue
        if iv[k, GCAP] > 0:
            if iv[k, 3] >= iv[k, GCAP]:
                g = pv[k, n + 2]
                _unlink(nx, pv, k, g)
                tag[k, g] = 0
                iv[k, 3] -= 1
            _push(nx, pv, k, n + 2, v)
            tag[k, v] = 3
            iv[k, 3] += 1
        else:
            tag[k, v] = 0
        return v
    return -1


def insert(pol, k, nx, pv, tag, ct, hp, iv, fv, fut, n, b):
    """Store b (not resident) in tier k, evicting first if full: returns (victim or -1, stored)."""
    cap = iv[k, CAP]
    v = -1
    if pol == LRU or pol == FIFO or pol == SIEVE:
        if iv[k, 1] >= cap:
            if pol == SIEVE:
                o = iv[k, HAND]
                if o < 0:
                    o = pv[k, n]
                while ct[k, o] > 0:
                    ct[k, o] = 0
                    o = pv[k, o]
                    if o == n:
                        o = pv[k, n]
                h = pv[k, o]
                iv[k, HAND] = -1 if h == n else h
                v = o
            else:
                v = pv[k, n]
            _unlink(nx, pv, k, v)
            tag[k, v] = 0
            iv[k, 1] -= 1
        _push(nx, pv, k, n, b)
        tag[k, b] = 1
        ct[k, b] = 0
        iv[k, 1] += 1
        return v, True
    if pol == LFU:
        if iv[k, 1] >= cap:
            v = pv[k, n + 4 + iv[k, MINF]]
            _unlink(nx, pv, k, v)
            tag[k, v] = 0
            iv[k, 1] -= 1
        _push(nx, pv, k, n + 5, b)
        tag[k, b] = 1
        ct[k, b] = 1
        iv[k, 1] += 1
        iv[k, MINF] = 1
        return v, True
    if pol == S3FIFO:
        while iv[k, 1] + iv[k, 2] + 1 > cap:
            r = _s3_evict(k, nx, pv, tag, ct, iv, n)
            if r >= 0:
                v = r
        if iv[k, FA] != 0:
            iv[k, FA] = 0
            s = 2
        elif iv[k, FB] == 0 and iv[k, 1] >= iv[k, SCAP]:
            s = 2
        else:
            s = 1
        _push(nx, pv, k, n + s - 1, b)
        tag[k, b] = s
        ct[k, b] = 0
        iv[k, s] += 1
        return v, True
    if pol == ARC:
        if iv[k, 1] + iv[k, 2] >= cap:
            v = _arc_evict(k, nx, pv, tag, iv, fv, n)
        if iv[k, FG] != 0 and (iv[k, FA] != 0 or iv[k, FB] != 0):
            _push(nx, pv, k, n + 1, b)
            tag[k, b] = 2
            iv[k, 2] += 1
            iv[k, FA] = 0
            iv[k, FB] = 0
            iv[k, FG] = 0
        else:
            _push(nx, pv, k, n, b)
            tag[k, b] = 1
            iv[k, 1] += 1
        return v, True
    # Belady, with or without bypass
    size = iv[k, HS]
    if size >= cap:
        top = hp[k, 1]
        if pol == BELADY_BYPASS and not _above(fut, top, b):
            return b, False
        v = top
        tag[k, v] = 0
        _heap_delete(hp, ct, fut, iv, k, 1)
        size -= 1
    size += 1
    iv[k, HS] = size
    hp[k, size] = b
    ct[k, b] = size
    tag[k, b] = 1
    _heap_fix(hp, ct, fut, k, size, size)
    return v, True


def remove(pol, k, nx, pv, tag, ct, hp, iv, fut, n, b):
    """Take resident b out of tier k."""
    t = tag[k, b]
    tag[k, b] = 0
    if pol >= BELADY:
        _heap_delete(hp, ct, fut, iv, k, ct[k, b])
        return
    if pol == SIEVE and iv[k, HAND] == b:
        h = pv[k, b]
        iv[k, HAND] = -1 if h == n else h
    _unlink(nx, pv, k, b)
    iv[k, t] -= 1
    if pol == LFU:
        f = ct[k, b]
        if f == iv[k, MINF] and nx[k, n + 4 + f] == n + 4 + f:
            g = f + 1
            while g < nx.shape[1] - n - 4 and nx[k, n + 4 + g] == n + 4 + g:
                g += 1
            iv[k, MINF] = g if g < nx.shape[1] - n - 4 else 1


def _state(tiers, n, max_freq, caps):
    """Arrays for `tiers` tiers over n blocks (see the module docstring)."""
    width = n + 4 + max_freq + 3
    hcap = 1
    for c in caps:
        hcap = max(hcap, min(c, n) + 1)
    nx = np.empty((tiers, width), np.int32)
    pv = np.empty((tiers, width), np.int32)
    tag = np.zeros((tiers, n), np.int8)
    ct = np.zeros((tiers, n), np.int32)
    hp = np.zeros((tiers, hcap), np.int32)
    iv = np.zeros((tiers, NIV), np.int64)
    fv = np.zeros((tiers, 2), np.float64)
    return nx, pv, tag, ct, hp, iv, fv


def _run_body(pol, cap, params, ids, nxt, off, inp, block_tokens, admit, n, max_freq):
    """One cache of `cap` blocks over the block stream: (found, prefix-hit blocks, prefix-hit tokens). Inlined
    into one runner per policy below, where `pol` is a constant: numba prunes the other policies' branches, and
    the loop runs several times faster than with `pol` known only at run time."""
    nx, pv, tag, ct, hp, iv, fv = _state(1, n, max_freq, np.array([cap]))
    init_tier(pol, 0, cap, params, nx, pv, iv, fv, n)
    fut = np.full(n if pol >= BELADY else 0, NEVER, np.int64)
    cnt = np.zeros(n if admit > 1 else 0, np.int32)
    found = 0
    pblocks = 0
    ptokens = 0
    R = len(off) - 1
    for r in range(R):
        a0 = off[r]
        a1 = off[r + 1]
        intact = True
        for a in range(a0, a1):
            b = ids[a]
            if pol >= BELADY:
                fut[b] = nxt[a]
            if lookup(pol, 0, nx, pv, tag, ct, hp, iv, fv, fut, n, b):
                found += 1
                if intact:
                    pblocks += 1
                    ptokens += block_tokens if a < a1 - 1 else inp[r] - (a1 - a0 - 1) * block_tokens
                continue
            intact = False
            if admit > 1:
                cnt[b] += 1
                if cnt[b] < admit:
                    continue
            insert(pol, 0, nx, pv, tag, ct, hp, iv, fv, fut, n, b)
    return found, pblocks, ptokens


# one runner per policy (a constant `pol` each; see _run_body); RUNNERS[pol] picks it
def _run_lru(cap, params, ids, nxt, off, inp, block_tokens, admit, n, max_freq):
    return _run_body(LRU, cap, params, ids, nxt, off, inp, block_tokens, admit, n, max_freq)


def _run_fifo(cap, params, ids, nxt, off, inp, block_tokens, admit, n, max_freq):
    return _run_body(FIFO, cap, params, ids, nxt, off, inp, block_tokens, admit, n, max_freq)


def _run_lfu(cap, params, ids, nxt, off, inp, block_tokens, admit, n, max_freq):
    return _run_body(LFU, cap, params, ids, nxt, off, inp, block_tokens, admit, n, max_freq)


def _run_sieve(cap, params, ids, nxt, off, inp, block_tokens, admit, n, max_freq):
    return _run_body(SIEVE, cap, params, ids, nxt, off, inp, block_tokens, admit, n, max_freq)


def _run_s3fifo(cap, params, ids, nxt, off, inp, block_tokens, admit, n, max_freq):
    return _run_body(S3FIFO, cap, params, ids, nxt, off, inp, block_tokens, admit, n, max_freq)


def _run_arc(cap, params, ids, nxt, off, inp, block_tokens, admit, n, max_freq):
    return _run_body(ARC, cap, params, ids, nxt, off, inp, block_tokens, admit, n, max_freq)


def _run_belady(cap, params, ids, nxt, off, inp, block_tokens, admit, n, max_freq):
    return _run_body(BELADY, cap, params, ids, nxt, off, inp, block_tokens, admit, n, max_freq)


def _run_belady_bypass(cap, params, ids, nxt, off, inp, block_tokens, admit, n, max_freq):
    return _run_body(BELADY_BYPASS, cap, params, ids, nxt, off, inp, block_tokens, admit, n, max_freq)


RUNNERS = [_run_lru, _run_fifo, _run_lfu, _run_sieve, _run_s3fifo, _run_arc, _run_belady, _run_belady_bypass]


def _run_one(pol, cap, params, ids, nxt, off, inp, block_tokens, admit, n, max_freq):
    """One cache of `cap` blocks under policy id `pol` (see _run_body)."""
    return RUNNERS[pol](cap, params, ids, nxt, off, inp, block_tokens, admit, n, max_freq)


def _place(b, k, src, now, pols, caps, admits, nx, pv, tag, ct, hp, iv, fv, fut, n, where, last, cnt,
           ttl, ttl_on, expiry, moved, counts):
    """Put b (from tier src, -1 if new) into tier k or the next tier with room below, cascading victims down
    (see simulate_sequential). counts: [evicted past the last tier, declined by admission or policy]."""
    while True:
        while k < 3 and caps[k] == 0:
            k += 1
        if k >= 3:
            counts[0] += 1
            return
        if cnt[b] < admits[k]:
            counts[1] += 1
            return
        if src >= 0:
            moved[src, k] += 1
        if k == 1 and ttl_on and now - last[b] > ttl:  # expired on arrival
            if caps[2] == 0:
                return
            src = 1
            k = 2
            continue
        pol = pols[k]
        lookup_any(pol, k, nx, pv, tag, ct, hp, iv, fv, fut, n, b)
        v, stored = insert_any(pol, k, nx, pv, tag, ct, hp, iv, fv, fut, n, b)
        if stored:
            where[b] = k
            if k == 1 and ttl_on:
                heapq.heappush(expiry, (last[b], np.int64(b)))
        else:
            counts[1] += 1
        if v < 0 or v == b:
            return
        where[v] = 3
        b = v
        src = k
        k += 1


def _tiered(pols, caps, params, admits, ids, nxt, off, inp, ts, block_tokens, ttl, ttl_on, transfer_s, n,
            max_freq):
    """Exclusive tiers (HBM, DRAM, SSD) with a policy each over the trace, request by request.
    Returns hit_blocks [3], hit_tokens [3], req_hit [R] tokens, transfer [R] s, moved [3, 3] blocks src->dst,
    counts [evicted, declined], stale."""
    R = len(off) - 1
    nx, pv, tag, ct, hp, iv, fv = _state(3, n, max_freq, caps)
    for k in range(3):
        if caps[k] > 0:
            init_tier(pols[k], k, caps[k], params[k], nx, pv, iv, fv, n)
    fut = np.full(n, NEVER, np.int64)
    cnt = np.zeros(n, np.int64)
    where = np.full(n, 3, np.int8)
    last = np.zeros(n, np.float64)
    expiry = [(0.0, np.int64(0))]
    expiry.pop()
    moved = np.zeros((3, 3), np.int64)
    counts = np.zeros(2, np.int64)
    hit_blocks = np.zeros(3, np.int64)
    hit_tokens = np.zeros(3, np.int64)
    req_hit = np.zeros(R, np.int64)
    transfer = np.zeros(R, np.float64)
    stale = 0
    for r in range(R):
        now = ts[r]
        if ttl_on:  # host state idle longer than the TTL moves to SSD or is dropped
            while len(expiry) > 0 and expiry[0][0] < now - ttl:
                t0, b = heapq.heappop(expiry)
                if where[b] == 1 and last[b] == t0:
                    remove_any(pols[1], 1, nx, pv, tag, ct, hp, iv, fut, n, b)
                    where[b] = 3
                    if caps[2] > 0:
                        _place(b, 2, 1, now, pols, caps, admits, nx, pv, tag, ct, hp, iv, fv, fut, n, where,
                               last, cnt, ttl, ttl_on, expiry, moved, counts)
        a0 = off[r]
        a1 = off[r + 1]
        intact = True
        for a in range(a0, a1):
            b = ids[a]
            cnt[b] += 1
            fut[b] = nxt[a]
            k = where[b]
            if k == 0:
                lookup_any(pols[0], 0, nx, pv, tag, ct, hp, iv, fv, fut, n, b)
            elif k < 3:
                remove_any(pols[k], k, nx, pv, tag, ct, hp, iv, fut, n, b)
                where[b] = 3
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
            last[b] = now
            if k != 0:
                _place(b, 0, -1, now, pols, caps, admits, nx, pv, tag, ct, hp, iv, fv, fut, n, where, last, cnt,
                       ttl, ttl_on, expiry, moved, counts)
    return hit_blocks, hit_tokens, req_hit, transfer, moved, counts, stale


if ENABLED:
    from numba import njit
    _jit = njit(cache=True, nogil=True)
    _inl = njit(cache=True, nogil=True, inline="always")
    # the tier kernel dispatches on policies known only at run time: called, not inlined (compiles in a third of
    # the time); the per-policy runners inline them with a constant policy
    lookup_any, insert_any, remove_any = _jit(lookup), _jit(insert), _jit(remove)
    for _f in (_push, _unlink, _above, _heap_swap, _heap_fix, _heap_delete, _arc_replace, _arc_evict, _s3_evict):
        globals()[_f.__name__] = _jit(_f)
    init_tier = _inl(init_tier)
    _state = _inl(_state)
    lookup = _inl(lookup)
    insert = _inl(insert)
    remove = _inl(remove)
    _run_body = _inl(_run_body)
    RUNNERS = [_jit(f) for f in RUNNERS]
    for _f in RUNNERS:
        globals()[_f.__name__] = _f
    _place = _jit(_place)
    _tiered = _jit(_tiered)


else:  # pragma: no cover - without numba every kernel is the plain Python above
    lookup_any, insert_any, remove_any = lookup, insert, remove


def threads() -> int:
    """Threads for runs at many capacities: numba's thread count (NUMBA_NUM_THREADS, default the CPUs)."""
    try:
        from numba import config
        return max(1, int(config.NUMBA_NUM_THREADS))
    except ImportError:  # pragma: no cover
        return 1


def run_curve(pol, caps, params, ids, nxt, off, inp, block_tokens, admit, n, max_freq) -> np.ndarray:
    """[C, 3] (found, prefix blocks, prefix tokens) at each capacity: one `_run_one` per capacity, run in threads
    (the compiled runs release the GIL), largest capacities first."""
    caps = np.asarray(caps, np.int64)
    out = np.zeros((len(caps), 3), np.int64)

    def one(i):
        out[i] = _run_one(pol, int(caps[i]), params, ids, nxt, off, inp, block_tokens, admit, n, max_freq)

    order = np.argsort(-caps, kind="stable").tolist()
    w = min(threads(), len(order))
    if w <= 1 or not ENABLED:
        for i in order:
            one(i)
    else:
        from concurrent.futures import ThreadPoolExecutor
        with ThreadPoolExecutor(w) as ex:
            list(ex.map(one, order))
    return out


def stream_arrays(ids, need_next: bool):
    """(dense ids, n, next access per access or an empty array, max accesses of one block)."""
    from .stackdist import next_access
    dense, n = dense_ids(ids)
    nxt = next_access(dense) if need_next else np.zeros(0, np.int64)
    max_freq = int(np.bincount(dense).max()) if len(dense) else 0
    return dense, n, nxt, max_freq
