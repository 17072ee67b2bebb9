"""Compiled (numba) paths of the eviction policies in kvlab.sim.policies, one cache or a tier hierarchy.

Every policy's state lives in one int32 row per tier, `S[k]`, so that one kernel runs any policy in any tier (a
policy id picks the branch) and the small inlined functions below take few arrays (numba's reference counting of
each array passed through an inlined call, per access, once cost more than the list updates themselves):
  nodes     4 fields per node (`4 * i + NX, PV, TAG, CT`): the dense blocks 0..n-1, then list sentinels n..n+3
            (lists 1-4), then LFU's count lists (count f at n + 4 + f). NX points toward the oldest, PV toward the
            newest; TAG is the list a block is in (0: absent); CT a counter (LFU count, S3-FIFO hits, SIEVE's
            visited bit, Belady's heap position)
  heap      Belady's binary max-heap on next use (1-based), after the nodes
with per-tier scalars in `iv[k]` (capacity, list sizes, SIEVE's hand, LFU's smallest count, flags) and ARC's target
in `fv[k, 0]`. Each policy's branch is its reference class's logic (hence libCacheSim's) over these arrays; tests
hold the two equal access by access. All kernels live in this one file because numba's on-disk cache notices edits
only to the file of the function it compiled.

Policy ids come from registration (kvlab.sim.policies.base.register numbers the classes in the order
kvlab/sim/policies/__init__.py imports them; `KERNEL_IDS` reads them): no id is typed in here, and an id that no
policy has raises ParameterError (`kernel_id`, and the dispatch below) instead of running any policy. Functions
are compiled where they are defined (`_compiled`, or `_inlined` where inlining pays), one runner per policy is
made by one loop (`_runner`). The id constants are frozen into the compiled code: reordering the registration
means clearing numba's cache (kvlab/sim/__pycache__/*.nbi, *.nbc), as for any edit outside this file.

  `_run_one`  one cache over a trace's block stream: found blocks (libCacheSim's hits), prefix-hit blocks and
              tokens (only a request's leading run of cached blocks counts, as engines match prefixes); one compiled
              runner per policy, where the policy is a constant and the other policies' code drops out
  `run_curve` the same at many capacities, in threads (the compiled runs release the GIL)
  `tiered`    HBM / DRAM / SSD tiers with a policy and an admission rule each, demote-on-evict,
              promote-on-hit, a DRAM TTL with expiry to SSD: kvlab.sim.tiering.simulate_sequential compiled
"""
from __future__ import annotations

import heapq

import numpy as np

from ..errors import ParameterError
from . import kernels
from .kernels import dense_ids
from .policies import REGISTRY

ENABLED = kernels.ENABLED  # numba importable and KVLAB_NUMBA != "0"
NEVER = np.iinfo(np.int64).max

KERNEL_IDS = {name: cls.kernel for name, cls in REGISTRY.items()}  # policy name -> id, given at registration
LRU, FIFO, LFU, SIEVE, S3FIFO, ARC, BELADY, BELADY_BYPASS = (
    KERNEL_IDS[p] for p in ("lru", "fifo", "lfu", "sieve", "s3fifo", "arc", "belady", "belady-bypass"))
NX, PV, TAG, CT = 0, 1, 2, 3  # node fields
# per-tier scalars iv[k, .]; 1..4: sizes of lists 1..4
CAP, HAND, MINF, FA, FB, FG, SCAP, MCAP, GCAP, HS, THR, HEAP, TOP = 0, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16
NIV = 17  # HEAP: where the heap starts in S[k]; TOP: one past the last LFU count list

if ENABLED:
    from numba import njit
    # small functions compile once and are called (LLVM inlines the smallest); inlining them all into every
    # caller with numba's inline="always" made the runners no faster and took minutes to compile, so only the
    # functions that pay for it are `_inlined`
    _compiled = njit(cache=True, nogil=True)
    _inlined = njit(cache=True, nogil=True, inline="always")
else:  # pragma: no cover - without numba every kernel is the plain Python below
    def _compiled(f):
        return f
    _inlined = _compiled


def kernel_id(pol) -> int:
    """`pol` if it is a registered policy's kernel id, else ParameterError (never a silent fallback)."""
    if isinstance(pol, (int, np.integer)) and not isinstance(pol, bool) and int(pol) in KERNEL_IDS.values():
        return int(pol)
    raise ParameterError(f"no eviction policy has kernel id {pol!r}; registered: "
                         + ", ".join(f"{n} {i}" for n, i in KERNEL_IDS.items()))


@_inlined
def _offline(pol):
    """Belady's two variants read each block's next use."""
    return pol == BELADY or pol == BELADY_BYPASS


# --- lists and the heap ------------------------------------------------------------------------------------
@_compiled
def _push(S, k, s, b):
    """Put node b at the newest end of the list with sentinel s."""
    q = S[k, 4 * s + NX]
    S[k, 4 * b + NX] = q
    S[k, 4 * b + PV] = s
    S[k, 4 * q + PV] = b
    S[k, 4 * s + NX] = b


@_compiled
def _unlink(S, k, b):
    p = S[k, 4 * b + PV]
    q = S[k, 4 * b + NX]
    S[k, 4 * p + NX] = q
    S[k, 4 * q + PV] = p


@_compiled
def _above(fut, x, y):
    """Block x leaves before block y: its next use is later, or the same (never again) and its id smaller -
    the reference's tie-break, so that both evict the same block among those never used again."""
    return fut[x] > fut[y] or (fut[x] == fut[y] and x < y)


@_compiled
def _heap_swap(S, k, h, i, j):
    a = S[k, h + i]
    c = S[k, h + j]
    S[k, h + i] = c
    S[k, h + j] = a
    S[k, 4 * c + CT] = i
    S[k, 4 * a + CT] = j


@_compiled
def _heap_fix(S, fut, k, h, i, size):
    """Restore the max-heap on next use (starting at S[k, h], 1-based) around position i after its key changed."""
    while i > 1 and _above(fut, S[k, h + i], S[k, h + i // 2]):
        _heap_swap(S, k, h, i, i // 2)
        i //= 2
    while True:
        j = 2 * i
        if j > size:
            break
        if j + 1 <= size and _above(fut, S[k, h + j + 1], S[k, h + j]):
            j += 1
        if not _above(fut, S[k, h + j], S[k, h + i]):
            break
        _heap_swap(S, k, h, i, j)
        i = j


@_compiled
def _heap_delete(S, iv, fut, k, i):
    h = iv[k, HEAP]
    size = iv[k, HS]
    if i != size:
        _heap_swap(S, k, h, i, size)
    iv[k, HS] = size - 1
    if i < size:
        _heap_fix(S, fut, k, h, i, size - 1)


@_inlined
def init_tier(pol, k, cap, params, S, iv, fv, n, heap):
    """Empty tier k of `cap` blocks under policy `pol`: sentinels point at themselves."""
    for s in range(n, heap // 4):
        S[k, 4 * s + NX] = s
        S[k, 4 * s + PV] = s
    iv[k, CAP] = cap
    iv[k, HAND] = -1
    iv[k, MINF] = 1
    iv[k, HEAP] = heap
    iv[k, TOP] = heap // 4 - n - 4
    fv[k, 0] = 0.0
    if pol == S3FIFO:
        iv[k, SCAP] = int(cap * params[0])
        iv[k, MCAP] = cap - iv[k, SCAP]
        iv[k, GCAP] = int(cap * params[1])
        iv[k, THR] = int(params[2])


# --- ARC's and S3-FIFO's evictions ---------------------------------------------------------------------------
@_inlined
def _arc_replace(k, S, iv, fv, n):
    n1 = iv[k, 1]
    p = fv[k, 0]
    if (n1 > 0 and (n1 > p or (n1 == p and iv[k, FB] != 0))) or iv[k, 2] == 0:
        v = S[k, 4 * n + PV]
        _unlink(S, k, v)
        _push(S, k, n + 2, v)
        S[k, 4 * v + TAG] = 3
        iv[k, 1] -= 1
        iv[k, 3] += 1
    else:
        v = S[k, 4 * (n + 1) + PV]
        _unlink(S, k, v)
        _push(S, k, n + 3, v)
        S[k, 4 * v + TAG] = 4
        iv[k, 2] -= 1
        iv[k, 4] += 1
    return v


@_inlined
def _arc_evict(k, S, iv, fv, n):
    cap = iv[k, CAP]
    if iv[k, FG] != 0 and (iv[k, FA] != 0 or iv[k, FB] != 0):
        return _arc_replace(k, S, iv, fv, n)
    if iv[k, 1] + iv[k, 3] + 1 > cap:
        if iv[k, 3] > 0:
            g = S[k, 4 * (n + 2) + PV]
            _unlink(S, k, g)
            S[k, 4 * g + TAG] = 0
            iv[k, 3] -= 1
            return _arc_replace(k, S, iv, fv, n)
        v = S[k, 4 * n + PV]
        _unlink(S, k, v)
        S[k, 4 * v + TAG] = 0
        iv[k, 1] -= 1
        return v
    if iv[k, 1] + iv[k, 3] + iv[k, 2] + iv[k, 4] >= 2 * cap and iv[k, 4] > 0:
        g = S[k, 4 * (n + 3) + PV]
        _unlink(S, k, g)
        S[k, 4 * g + TAG] = 0
        iv[k, 4] -= 1
    return _arc_replace(k, S, iv, fv, n)


@_inlined
def _s3_evict(k, S, iv, n):
    """One S3-FIFO eviction step; the block that left, or -1 (small emptied into main)."""
    iv[k, FB] = 1  # has evicted
    if iv[k, 2] > iv[k, MCAP] or iv[k, 1] == 0:
        while iv[k, 2] > 0:
            v = S[k, 4 * (n + 1) + PV]
            _unlink(S, k, v)
            f = S[k, 4 * v + CT]
            if f >= 1:
                _push(S, k, n + 1, v)
                S[k, 4 * v + CT] = min(f, 3) - 1
                continue
            S[k, 4 * v + TAG] = 0
            iv[k, 2] -= 1
            return v
        return -1
    while iv[k, 1] > 0:
        v = S[k, 4 * n + PV]
        _unlink(S, k, v)
        iv[k, 1] -= 1
        if S[k, 4 * v + CT] >= iv[k, THR]:
            _push(S, k, n + 1, v)
            S[k, 4 * v + TAG] = 2
            S[k, 4 * v + CT] = 0
            iv[k, 2] += 1
            continue
        if iv[k, GCAP] > 0:
            if iv[k, 3] >= iv[k, GCAP]:
                g = S[k, 4 * (n + 2) + PV]
                _unlink(S, k, g)
                S[k, 4 * g + TAG] = 0
                iv[k, 3] -= 1
            _push(S, k, n + 2, v)
            S[k, 4 * v + TAG] = 3
            iv[k, 3] += 1
        else:
            S[k, 4 * v + TAG] = 0
        return v
    return -1


# --- each policy's operations (small functions: inlined where the policy is a constant) ---------------------
@_compiled
def _lru_lookup(k, S, n, b):
    if S[k, 4 * b + TAG]:
        _unlink(S, k, b)
        _push(S, k, n, b)
        return True
    return False


@_compiled
def _fifo_lookup(k, S, b):
    return S[k, 4 * b + TAG] != 0


@_compiled
def _sieve_lookup(k, S, b):
    if S[k, 4 * b + TAG]:
        S[k, 4 * b + CT] = 1
        return True
    return False


@_compiled
def _list_insert(sieve, k, S, iv, n, b):
    """LRU, FIFO and SIEVE: one list, newest first; the victim is the oldest (SIEVE: the hand's first unvisited)."""
    v = -1
    if iv[k, 1] >= iv[k, CAP]:
        if sieve:
            o = iv[k, HAND]
            if o < 0:
                o = S[k, 4 * n + PV]
            while S[k, 4 * o + CT] > 0:
                S[k, 4 * o + CT] = 0
                o = S[k, 4 * o + PV]
                if o == n:
                    o = S[k, 4 * n + PV]
            h = S[k, 4 * o + PV]
            iv[k, HAND] = -1 if h == n else h
            v = o
        else:
            v = S[k, 4 * n + PV]
        _unlink(S, k, v)
        S[k, 4 * v + TAG] = 0
        iv[k, 1] -= 1
    _push(S, k, n, b)
    S[k, 4 * b + TAG] = 1
    S[k, 4 * b + CT] = 0
    iv[k, 1] += 1
    return v


@_inlined
def _lfu_lookup(k, S, iv, n, b):
    if S[k, 4 * b + TAG]:
        f = S[k, 4 * b + CT]
        _unlink(S, k, b)
        _push(S, k, n + 4 + f + 1, b)
        S[k, 4 * b + CT] = f + 1
        s = n + 4 + f
        if f == iv[k, MINF] and S[k, 4 * s + NX] == s:
            iv[k, MINF] = f + 1
        return True
    return False


@_inlined
def _lfu_insert(k, S, iv, n, b):
    v = -1
    if iv[k, 1] >= iv[k, CAP]:
        v = S[k, 4 * (n + 4 + iv[k, MINF]) + PV]
        _unlink(S, k, v)
        S[k, 4 * v + TAG] = 0
        iv[k, 1] -= 1
    _push(S, k, n + 5, b)
    S[k, 4 * b + TAG] = 1
    S[k, 4 * b + CT] = 1
    iv[k, 1] += 1
    iv[k, MINF] = 1
    return v


@_compiled
def _lfu_after_remove(k, S, iv, n, f):
    """A block of count f left: if it emptied the smallest count, the smallest is the next non-empty count."""
    s = n + 4 + f
    if f == iv[k, MINF] and S[k, 4 * s + NX] == s:
        top = iv[k, TOP]
        g = f + 1
        while g < top and S[k, 4 * (n + 4 + g) + NX] == n + 4 + g:
            g += 1
        iv[k, MINF] = g if g < top else 1


@_inlined
def _s3_lookup(k, S, iv, b):
    t = S[k, 4 * b + TAG]
    iv[k, FA] = 0
    if t == 1 or t == 2:
        S[k, 4 * b + CT] += 1
        return True
    if t == 3:
        _unlink(S, k, b)
        S[k, 4 * b + TAG] = 0
        iv[k, 3] -= 1
        iv[k, FA] = 1
    return False


@_inlined
def _s3_insert(k, S, iv, n, b):
    v = -1
    while iv[k, 1] + iv[k, 2] + 1 > iv[k, CAP]:
        r = _s3_evict(k, S, iv, n)
        if r >= 0:
            v = r
    if iv[k, FA] != 0:
        iv[k, FA] = 0
        s = 2
    elif iv[k, FB] == 0 and iv[k, 1] >= iv[k, SCAP]:
        s = 2
    else:
        s = 1
    _push(S, k, n + s - 1, b)
    S[k, 4 * b + TAG] = s
    S[k, 4 * b + CT] = 0
    iv[k, s] += 1
    return v


@_inlined
def _arc_lookup(k, S, iv, fv, n, b):
    t = S[k, 4 * b + TAG]
    iv[k, FG] = 0
    if t == 1 or t == 2:
        iv[k, FA] = 0
        iv[k, FB] = 0
        _unlink(S, k, b)
        _push(S, k, n + 1, b)
        if t == 1:
            S[k, 4 * b + TAG] = 2
            iv[k, 1] -= 1
            iv[k, 2] += 1
        return True
    if t == 3:
        iv[k, FA] = 1
        iv[k, FB] = 0
        iv[k, FG] = 1
        fv[k, 0] = min(fv[k, 0] + max(iv[k, 4] / iv[k, 3], 1.0), float(iv[k, CAP]))
        _unlink(S, k, b)
        S[k, 4 * b + TAG] = 0
        iv[k, 3] -= 1
    elif t == 4:
        iv[k, FA] = 0
        iv[k, FB] = 1
        iv[k, FG] = 1
        fv[k, 0] = max(fv[k, 0] - max(iv[k, 3] / iv[k, 4], 1.0), 0.0)
        _unlink(S, k, b)
        S[k, 4 * b + TAG] = 0
        iv[k, 4] -= 1
    return False


@_inlined
def _arc_insert(k, S, iv, fv, n, b):
    v = -1
    if iv[k, 1] + iv[k, 2] >= iv[k, CAP]:
        v = _arc_evict(k, S, iv, fv, n)
    if iv[k, FG] != 0 and (iv[k, FA] != 0 or iv[k, FB] != 0):
        _push(S, k, n + 1, b)
        S[k, 4 * b + TAG] = 2
        iv[k, 2] += 1
        iv[k, FA] = 0
        iv[k, FB] = 0
        iv[k, FG] = 0
    else:
        _push(S, k, n, b)
        S[k, 4 * b + TAG] = 1
        iv[k, 1] += 1
    return v


@_compiled
def _bel_lookup(k, S, iv, fut, b):
    if S[k, 4 * b + TAG]:
        _heap_fix(S, fut, k, iv[k, HEAP], S[k, 4 * b + CT], iv[k, HS])
        return True
    return False


@_compiled
def _bel_insert(bypass, k, S, iv, fut, b):
    """(victim, stored): with bypass, b itself is declined when it would be the first to leave."""
    h = iv[k, HEAP]
    size = iv[k, HS]
    v = -1
    if size >= iv[k, CAP]:
        top = S[k, h + 1]
        if bypass and not _above(fut, top, b):
            return b, False
        v = top
        S[k, 4 * v + TAG] = 0
        _heap_delete(S, iv, fut, k, 1)
        size -= 1
    size += 1
    iv[k, HS] = size
    S[k, h + size] = b
    S[k, 4 * b + CT] = size
    S[k, 4 * b + TAG] = 1
    _heap_fix(S, fut, k, h, size, size)
    return v, True


# --- the three operations for any policy id -----------------------------------------------------------------
def _lookup(pol, k, S, iv, fv, fut, n, b):
    """True if b is resident in tier k (its hit recorded); False after a miss's bookkeeping."""
    if pol == LRU:
        return _lru_lookup(k, S, n, b)
    if pol == FIFO:
        return _fifo_lookup(k, S, b)
    if pol == SIEVE:
        return _sieve_lookup(k, S, b)
    if pol == LFU:
        return _lfu_lookup(k, S, iv, n, b)
    if pol == S3FIFO:
        return _s3_lookup(k, S, iv, b)
    if pol == ARC:
        return _arc_lookup(k, S, iv, fv, n, b)
    if _offline(pol):
        return _bel_lookup(k, S, iv, fut, b)
    raise ParameterError("unknown eviction policy kernel id")


def _insert(pol, k, S, iv, fv, fut, n, b):
    """Store b (not resident) in tier k, evicting first if full: returns (victim or -1, stored)."""
    if pol == LRU or pol == FIFO:
        return _list_insert(False, k, S, iv, n, b), True
    if pol == SIEVE:
        return _list_insert(True, k, S, iv, n, b), True
    if pol == LFU:
        return _lfu_insert(k, S, iv, n, b), True
    if pol == S3FIFO:
        return _s3_insert(k, S, iv, n, b), True
    if pol == ARC:
        return _arc_insert(k, S, iv, fv, n, b), True
    if _offline(pol):
        return _bel_insert(pol == BELADY_BYPASS, k, S, iv, fut, b)
    raise ParameterError("unknown eviction policy kernel id")


def _remove(pol, k, S, iv, fut, n, b):
    """Take resident b out of tier k. No id falls through to a policy here: b is resident only if `_insert` stored
    it under this tier's id, and `_insert` raises on an id no policy has (a raise here cost the tier kernel 6-10%)."""
    t = S[k, 4 * b + TAG]
    S[k, 4 * b + TAG] = 0
    if _offline(pol):
        _heap_delete(S, iv, fut, k, S[k, 4 * b + CT])
        return
    if pol == SIEVE and iv[k, HAND] == b:
        h = S[k, 4 * b + PV]
        iv[k, HAND] = -1 if h == n else h
    _unlink(S, k, b)
    iv[k, t] -= 1
    if pol == LFU:
        _lfu_after_remove(k, S, iv, n, S[k, 4 * b + CT])


# the tier kernel dispatches on policies known only at run time: one compiled dispatch each (`*_any`); inlined
# where a caller's policy is a constant (`lookup`, `insert`; see lookup_op)
lookup_any, insert_any, remove_any = _compiled(_lookup), _compiled(_insert), _compiled(_remove)
lookup, insert = _inlined(_lookup), _inlined(_insert)


def lookup_op(pol, k, S, iv, fv, fut, n, b):
    """`lookup`, resolved at compile time to the policy's own function where `pol` is a constant."""
    return _lookup(pol, k, S, iv, fv, fut, n, b)


def insert_op(pol, k, S, iv, fv, fut, n, b):
    """`insert`, resolved at compile time to the policy's own function where `pol` is a constant."""
    return _insert(pol, k, S, iv, fv, fut, n, b)


if ENABLED:
    from numba.core import types as _types
    from numba.extending import overload as _overload

    _LOOKUPS = {LRU: lambda pol, k, S, iv, fv, fut, n, b: _lru_lookup(k, S, n, b),
                FIFO: lambda pol, k, S, iv, fv, fut, n, b: _fifo_lookup(k, S, b),
                SIEVE: lambda pol, k, S, iv, fv, fut, n, b: _sieve_lookup(k, S, b),
                LFU: lambda pol, k, S, iv, fv, fut, n, b: _lfu_lookup(k, S, iv, n, b),
                S3FIFO: lambda pol, k, S, iv, fv, fut, n, b: _s3_lookup(k, S, iv, b),
                ARC: lambda pol, k, S, iv, fv, fut, n, b: _arc_lookup(k, S, iv, fv, n, b),
                BELADY: lambda pol, k, S, iv, fv, fut, n, b: _bel_lookup(k, S, iv, fut, b),
                BELADY_BYPASS: lambda pol, k, S, iv, fv, fut, n, b: _bel_lookup(k, S, iv, fut, b)}
    _INSERTS = {LRU: lambda pol, k, S, iv, fv, fut, n, b: (_list_insert(False, k, S, iv, n, b), True),
                FIFO: lambda pol, k, S, iv, fv, fut, n, b: (_list_insert(False, k, S, iv, n, b), True),
                SIEVE: lambda pol, k, S, iv, fv, fut, n, b: (_list_insert(True, k, S, iv, n, b), True),
                LFU: lambda pol, k, S, iv, fv, fut, n, b: (_lfu_insert(k, S, iv, n, b), True),
                S3FIFO: lambda pol, k, S, iv, fv, fut, n, b: (_s3_insert(k, S, iv, n, b), True),
                ARC: lambda pol, k, S, iv, fv, fut, n, b: (_arc_insert(k, S, iv, fv, n, b), True),
                BELADY: lambda pol, k, S, iv, fv, fut, n, b: _bel_insert(False, k, S, iv, fut, b),
                BELADY_BYPASS: lambda pol, k, S, iv, fv, fut, n, b: _bel_insert(True, k, S, iv, fut, b)}

    @_overload(lookup_op, inline="always", prefer_literal=True)
    def _ol_lookup(pol, k, S, iv, fv, fut, n, b):
        if isinstance(pol, _types.IntegerLiteral):  # a runner's constant policy: its own function
            return _LOOKUPS[pol.literal_value]
        return lambda pol, k, S, iv, fv, fut, n, b: lookup(pol, k, S, iv, fv, fut, n, b)

    @_overload(insert_op, inline="always", prefer_literal=True)
    def _ol_insert(pol, k, S, iv, fv, fut, n, b):
        if isinstance(pol, _types.IntegerLiteral):
            return _INSERTS[pol.literal_value]
        return lambda pol, k, S, iv, fv, fut, n, b: insert(pol, k, S, iv, fv, fut, n, b)


# --- one cache over a block stream ------------------------------------------------------------------------------
@_inlined
def _state(tiers, n, max_freq, caps):
    """(S, iv, fv) for `tiers` tiers over n blocks, and where the heap starts in each row (module docstring)."""
    nodes = n + 4 + max_freq + 3
    hcap = 1
    for c in caps:
        hcap = max(hcap, min(c, n) + 1)
    heap = 4 * nodes
    S = np.zeros((tiers, heap + hcap), np.int32)
    iv = np.zeros((tiers, NIV), np.int64)
    fv = np.zeros((tiers, 2), np.float64)
    return S, iv, fv, heap


@_inlined
def _run_body(pol, cap, params, ids, nxt, off, inp, block_tokens, admit, n, max_freq):
    """One cache of `cap` blocks over the block stream: (found, prefix-hit blocks, prefix-hit tokens). Inlined
    into one runner per policy below, where `pol` is a constant: the other policies' code drops out, and the loop
    runs several times faster than with `pol` known only at run time."""
    S, iv, fv, heap = _state(1, n, max_freq, np.array([cap]))
    init_tier(pol, 0, cap, params, S, iv, fv, n, heap)
    fut = np.full(n if _offline(pol) else 0, NEVER, np.int64)
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
            if _offline(pol):
                fut[b] = nxt[a]
            if lookup_op(pol, 0, S, iv, fv, fut, n, b):
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
            insert_op(pol, 0, S, iv, fv, fut, n, b)
    return found, pblocks, ptokens


@_inlined
def _run_arc_body(cap, ids, off, inp, block_tokens, admit, n):
    """ARC over the block stream with the same rules as _arc_lookup / _arc_insert (libCacheSim's ARC, hence the
    reference class's), its four lists in arrays of their own and its sizes, target and flags in locals: the
    generic tier row (S, iv, fv) keeps them in memory the compiler must reload around every list update, which
    made ARC the slowest runner. Lists 0-3 (T1, T2, B1, B2) have sentinels n..n+3; nx points toward the oldest.
    Their link updates are written out rather than called (_push / _unlink work on the tier row), for the reason
    the module docstring gives: arrays passed through an inlined call per access cost more than the update."""
    nx = np.empty(n + 4, np.int32)
    pv = np.empty(n + 4, np.int32)
    for s in range(n, n + 4):
        nx[s] = s
        pv[s] = s
    tag = np.zeros(n, np.int8)
    t1 = 0
    t2 = 0
    b1 = 0
    b2 = 0
    p = 0.0
    fa = False
    fb = False
    fg = False
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
            t = tag[b]
            fg = False
            if t == 1 or t == 2:  # a hit: to T2's newest end
                fa = False
                fb = False
                q = pv[b]
                o = nx[b]
                nx[q] = o
                pv[o] = q
                h = nx[n + 1]
                nx[b] = h
                pv[b] = n + 1
                pv[h] = b
                nx[n + 1] = b
                if t == 1:
                    tag[b] = 2
                    t1 -= 1
                    t2 += 1
                found += 1
                if intact:
                    pblocks += 1
                    ptokens += block_tokens if a < a1 - 1 else inp[r] - (a1 - a0 - 1) * block_tokens
                continue
            intact = False
            if t == 3 or t == 4:  # a ghost hit: adapt the target, leave the ghost list
                if t == 3:
                    fa = True
                    fb = False
                    p = min(p + max(b2 / b1, 1.0), float(cap))
                    b1 -= 1
                else:
                    fa = False
                    fb = True
                    p = max(p - max(b1 / b2, 1.0), 0.0)
                    b2 -= 1
                fg = True
                q = pv[b]
                o = nx[b]
                nx[q] = o
                pv[o] = q
                tag[b] = 0
            if admit > 1:
                cnt[b] += 1
                if cnt[b] < admit:
                    continue
            if t1 + t2 >= cap:  # evict (_arc_evict, then _arc_replace)
                replace = True
                if not (fg and (fa or fb)):
                    if t1 + b1 + 1 > cap:
                        if b1 > 0:
                            g = pv[n + 2]
                            q = pv[g]
                            nx[q] = n + 2
                            pv[n + 2] = q
                            tag[g] = 0
                            b1 -= 1
                        else:
                            v = pv[n]
                            q = pv[v]
                            nx[q] = n
                            pv[n] = q
                            tag[v] = 0
                            t1 -= 1
                            replace = False
                    elif t1 + b1 + t2 + b2 >= 2 * cap and b2 > 0:
                        g = pv[n + 3]
                        q = pv[g]
                        nx[q] = n + 3
                        pv[n + 3] = q
                        tag[g] = 0
                        b2 -= 1
                if replace:
                    if (t1 > 0 and (t1 > p or (t1 == p and fb))) or t2 == 0:
                        src, dst, mark = n, n + 2, 3
                        t1 -= 1
                        b1 += 1
                    else:
                        src, dst, mark = n + 1, n + 3, 4
                        t2 -= 1
                        b2 += 1
                    v = pv[src]
                    q = pv[v]
                    nx[q] = src
                    pv[src] = q
                    h = nx[dst]
                    nx[v] = h
                    pv[v] = dst
                    pv[h] = v
                    nx[dst] = v
                    tag[v] = mark
            if fg and (fa or fb):  # back from a ghost list: straight to T2
                dst = n + 1
                tag[b] = 2
                t2 += 1
                fa = False
                fb = False
                fg = False
            else:
                dst = n
                tag[b] = 1
                t1 += 1
            h = nx[dst]
            nx[b] = h
            pv[b] = dst
            pv[h] = b
            nx[dst] = b
    return found, pblocks, ptokens


@_compiled
def _bits_levels(A):
    """Word counts of a bitset over positions 0..A-1 and its summary levels (64 bits a word), top level last."""
    sizes = []
    m = max(A, 1)
    while True:
        m = (m + 63) // 64
        sizes.append(m)
        if m == 1:
            break
    return sizes


@_inlined
def _bits_set(words, base, L, p):
    """Set bit p in level 0 and its summary bits above (words[base[l] + i]: level l's words)."""
    for lv in range(L):
        w = p >> 6
        old = words[base[lv] + w]
        words[base[lv] + w] = old | (np.uint64(1) << np.uint64(p & 63))
        if old != 0:
            return
        p = w


@_inlined
def _bits_clear(words, base, L, p):
    for lv in range(L):
        w = p >> 6
        v = words[base[lv] + w] & ~(np.uint64(1) << np.uint64(p & 63))
        words[base[lv] + w] = v
        if v != 0:
            return
        p = w


@_inlined
def _top_bit(x):
    """Index of the highest set bit of a non-zero uint64 (a binary search over its halves)."""
    r = 0
    for s in (32, 16, 8, 4, 2, 1):
        y = x >> np.uint64(s)
        if y != 0:
            x = y
            r += s
    return r


@_inlined
def _bits_max(words, base, L):
    """Highest set position (the bitset must not be empty)."""
    i = 0
    for lv in range(L - 1, -1, -1):
        i = i * 64 + _top_bit(words[base[lv] + i])
    return i


@_inlined
def _run_belady_body(bypass, cap, ids, nxt, off, inp, block_tokens, admit, n):
    """Belady over the block stream with the residents' next uses in a bitset over positions instead of a heap:
    a resident's next use is a position of the stream and `ids` at that position is the block itself, so the
    block used furthest ahead is the highest set bit; residents never used again wait on a stack and leave first
    (which of them leaves changes no hit). Same counts as _run_body's heap, several times faster."""
    A = len(ids)
    sizes = _bits_levels(A)
    L = len(sizes)
    base = np.zeros(L, np.int64)
    for lv in range(1, L):
        base[lv] = base[lv - 1] + sizes[lv - 1]
    words = np.zeros(base[L - 1] + sizes[L - 1], np.uint64)
    tag = np.zeros(n, np.int8)
    never = np.empty(min(cap, n) + 1, np.int64)  # residents not used again
    nn = 0
    nb = 0  # residents in the bitset
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
            x = nxt[a]
            if tag[b]:  # hit: its next use was here (bit a); now it is x
                _bits_clear(words, base, L, a)
                nb -= 1
                if x == NEVER:
                    never[nn] = b
                    nn += 1
                else:
                    _bits_set(words, base, L, x)
                    nb += 1
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
            if nn + nb >= cap:
                if nn > 0:
                    if bypass and x == NEVER:
                        continue
                    nn -= 1
                    tag[never[nn]] = 0
                else:
                    m = _bits_max(words, base, L)
                    if bypass and x > m:
                        continue
                    _bits_clear(words, base, L, m)
                    nb -= 1
                    tag[ids[m]] = 0
            tag[b] = 1
            if x == NEVER:
                never[nn] = b
                nn += 1
            else:
                _bits_set(words, base, L, x)
                nb += 1
    return found, pblocks, ptokens


def _runner(pol):
    """The compiled run of one cache under policy id `pol`, a constant in its body (a closure's cell, which
    numba's on-disk cache keys on): the other policies' code drops out, and the loop runs several times faster
    than with `pol` known only at run time. ARC and Belady have loops of their own (_run_arc_body,
    _run_belady_body); every other policy runs _run_body."""
    if pol == ARC:
        def run(cap, params, ids, nxt, off, inp, block_tokens, admit, n, max_freq):
            return _run_arc_body(cap, ids, off, inp, block_tokens, admit, n)
    elif pol in (BELADY, BELADY_BYPASS):
        bypass = pol == BELADY_BYPASS

        def run(cap, params, ids, nxt, off, inp, block_tokens, admit, n, max_freq):
            return _run_belady_body(bypass, cap, ids, nxt, off, inp, block_tokens, admit, n)
    else:
        def run(cap, params, ids, nxt, off, inp, block_tokens, admit, n, max_freq):
            return _run_body(pol, cap, params, ids, nxt, off, inp, block_tokens, admit, n, max_freq)
    name = next(n for n, i in KERNEL_IDS.items() if i == pol)
    run.__name__ = run.__qualname__ = "_run_" + name.replace("-", "_")  # one cache file each
    return _compiled(run)


RUNNERS = {pol: _runner(pol) for pol in KERNEL_IDS.values()}  # kernel id -> its compiled run, one per policy


def _run_one(pol, cap, params, ids, nxt, off, inp, block_tokens, admit, n, max_freq):
    """One cache of `cap` blocks under policy id `pol` (see _runner): (found, prefix blocks, prefix tokens)."""
    return RUNNERS[kernel_id(pol)](cap, params, ids, nxt, off, inp, block_tokens, admit, n, max_freq)


# --- tiers ---------------------------------------------------------------------------------------------------
@_compiled
def _place(b, k, src, now, pols, caps, admits, S, iv, fv, fut, n, where, last, cnt, ttl, ttl_on, expiry, moved,
           counts):
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
        lookup_any(pol, k, S, iv, fv, fut, n, b)
        v, stored = insert_any(pol, k, S, iv, fv, fut, n, b)
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


@_compiled
def _tiered(pols, caps, params, admits, ids, nxt, off, inp, ts, block_tokens, ttl, ttl_on, transfer_s, n,
            max_freq):
    """Exclusive tiers (HBM, DRAM, SSD) with a policy each over the trace, request by request.
    Returns hit_blocks [3], hit_tokens [3], req_hit [R] tokens, transfer [R] s, moved [3, 3] blocks src->dst,
    counts [evicted, declined], stale."""
    R = len(off) - 1
    S, iv, fv, heap = _state(3, n, max_freq, caps)
    for k in range(3):
        if caps[k] > 0:
            init_tier(pols[k], k, caps[k], params[k], S, iv, fv, n, heap)
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
                    remove_any(pols[1], 1, S, iv, fut, n, b)
                    where[b] = 3
                    if caps[2] > 0:
                        _place(b, 2, 1, now, pols, caps, admits, S, iv, fv, fut, n, where, last, cnt, ttl, ttl_on,
                               expiry, moved, counts)
        a0 = off[r]
        a1 = off[r + 1]
        intact = True
        for a in range(a0, a1):
            b = ids[a]
            cnt[b] += 1
            fut[b] = nxt[a]
            k = where[b]
            if k == 0:
                lookup_any(pols[0], 0, S, iv, fv, fut, n, b)
            elif k < 3:
                remove_any(pols[k], k, S, iv, fut, n, b)
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
                _place(b, 0, -1, now, pols, caps, admits, S, iv, fv, fut, n, where, last, cnt, ttl, ttl_on, expiry,
                       moved, counts)
    return hit_blocks, hit_tokens, req_hit, transfer, moved, counts, stale


def tiered(pols, caps, params, admits, ids, nxt, off, inp, ts, block_tokens, ttl, ttl_on, transfer_s, n,
           max_freq):
    """`_tiered` with each tier's policy id checked first (an unknown id is a ParameterError)."""
    pols = np.array([kernel_id(p) for p in pols], np.int64)
    return _tiered(pols, caps, params, admits, ids, nxt, off, inp, ts, block_tokens, ttl, ttl_on, transfer_s, n,
                   max_freq)


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
    kernel_id(pol)

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


@_compiled
def _next_uses(ids, n):
    """(next access of each access or NEVER, most accesses of one block) in one backward pass over dense ids: the
    same next uses as kvlab.sim.stackdist.next_access, without its sort (Belady's preparation, end to end)."""
    A = len(ids)
    nxt = np.empty(A, np.int64)
    seen = np.full(n, NEVER, np.int64)
    freq = np.zeros(n, np.int64)
    top = 0
    for a in range(A - 1, -1, -1):
        b = ids[a]
        nxt[a] = seen[b]
        seen[b] = a
        f = freq[b] + 1
        freq[b] = f
        if f > top:
            top = f
    return nxt, top



def stream_arrays(ids, need_next: bool):
    """(dense ids, n, next access per access or an empty array, max accesses of one block)."""
    from .stackdist import next_access
    dense, n = dense_ids(ids)
    if need_next and ENABLED:
        nxt, max_freq = _next_uses(dense, n)
        return dense, n, nxt, int(max_freq)
    nxt = next_access(dense) if need_next else np.zeros(0, np.int64)
    max_freq = int(np.bincount(dense).max()) if len(dense) else 0
    return dense, n, nxt, max_freq
