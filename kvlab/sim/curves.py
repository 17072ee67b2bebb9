"""One cache over a trace's block stream under any registered policy: hits at one capacity, or a whole curve.

Each run counts two things:
  found          accesses whose block is cached when read - libCacheSim's hits, the count every policy is
                 held to libCacheSim on (a trace's blocks read in order as one stream of unit-size objects)
  prefix hits    the found blocks before the request's first miss, and their tokens: what an engine reuses,
                 since it matches prefixes (a cached block after a miss is recomputed anyway)
The cache sees every access either way; the prefix rule only changes what is counted.

LRU with admission "all" comes from stack distances (one pass, exact at every capacity: Mattson et al. 1970);
every other policy runs once per capacity through the compiled kernels (kvlab.sim.policy_kernels, capacities
in parallel threads), or through the reference classes where numba is absent or `engine="reference"`.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..checks import need_choice, need_int, need_number
from ..errors import ParameterError
from . import policy_kernels as pk
from .policies import admit_after, get_policy
from .stackdist import LruIndex, hit_curve, next_access
from .traces import Trace

ENGINES = ("auto", "compiled", "reference")
MEASURES = ("token", "block")  # prefix-hit share of prompt tokens; found share of block accesses (libCacheSim's)


@dataclass
class CacheHits:
    """One policy's hits on one trace at each capacity."""

    policy: str  # registered policy name
    admission: str  # "all" or "second"
    capacity_blocks: np.ndarray  # [C] capacities simulated
    found: np.ndarray  # [C] accesses found cached (libCacheSim's hits)
    prefix_blocks: np.ndarray  # [C] found blocks before their request's first miss
    prefix_tokens: np.ndarray  # [C] their tokens
    accesses: int  # block accesses in the trace
    input_tokens: int  # prompt tokens in the trace

    @property
    def block_hit_rate(self) -> np.ndarray:
        """[C] found / accesses: libCacheSim's hit ratio."""
        return self.found / max(self.accesses, 1)

    @property
    def token_hit_rate(self) -> np.ndarray:
        """[C] prefix-hit tokens / prompt tokens: the share of prefill an engine skips."""
        return self.prefix_tokens / max(self.input_tokens, 1)

    def rate(self, measure: str) -> np.ndarray:
        need_choice("measure", measure, MEASURES)
        return self.token_hit_rate if measure == "token" else self.block_hit_rate


def _check(trace: Trace, policy: str) -> type:
    if not isinstance(trace, Trace):
        raise ParameterError(f"expected a Trace, got {type(trace).__name__}")
    if not trace.has_prefixes:
        raise ParameterError(f"trace {trace.name!r} has no block ids: a cache needs prefix (block hash) information "
                             "(Azure traces give arrivals and lengths only)")
    return get_policy(policy)


def _capacities(cls, capacities) -> np.ndarray:
    caps = np.atleast_1d(np.asarray(capacities))
    if caps.ndim != 1 or not (np.issubdtype(caps.dtype, np.integer) or
                              (np.issubdtype(caps.dtype, np.floating) and np.all(np.mod(caps, 1) == 0))):
        raise ParameterError(f"capacities must be integers (blocks), got {capacities!r}")
    caps = caps.astype(np.int64)
    if len(caps) and caps.min() < cls.min_capacity:
        cls.check_capacity(int(caps.min()))  # the message names the smallest
    return caps


def reference_hits(trace: Trace, policy: str, capacity: int, admission: str = "all") -> tuple[int, int, int]:
    """(found, prefix blocks, prefix tokens) of one cache, block by block through the policy's reference class."""
    cls = _check(trace, policy)
    admit = admit_after(admission)
    ids = trace.block_ids
    fut: dict = {}  # block -> its next access (read by offline policies)
    nxt = next_access(ids).tolist() if cls.offline else None
    cache = cls(capacity, fut)
    seen: dict = {}  # block -> misses so far
    off, inp, B = trace.block_offsets.tolist(), trace.input_tokens.tolist(), trace.block_tokens
    found = pblocks = ptokens = 0
    idl = ids.tolist()
    for r in range(len(trace)):
        intact = True
        a0, a1 = off[r], off[r + 1]
        for a in range(a0, a1):
            b = idl[a]
            if nxt is not None:
                fut[b] = nxt[a]
            if cache.lookup(b):
                found += 1
                if intact:
                    pblocks += 1
                    ptokens += B if a < a1 - 1 else inp[r] - (a1 - a0 - 1) * B
                continue
            intact = False
            seen[b] = seen.get(b, 0) + 1
            if seen[b] >= admit:
                cache.insert(b)
    return found, pblocks, ptokens


def cache_hits(trace: Trace, policy: str, capacities, admission: str = "all", engine: str = "auto") -> CacheHits:
    """Hits of `policy` at each capacity (blocks) on `trace`: LRU with admission "all" by stack distances, the
    rest by one compiled run per capacity (parallel threads); engine="reference" runs the reference classes."""
    cls = _check(trace, policy)
    caps = _capacities(cls, capacities)
    need_choice("engine", engine, ENGINES)
    admit = admit_after(admission)
    A, T = trace.n_accesses, int(trace.input_tokens.sum())
    if engine == "reference" or (engine == "auto" and not pk.ENABLED):
        rows = np.array([reference_hits(trace, policy, int(c), admission) for c in caps], np.int64).reshape(-1, 3)
    elif policy == "lru" and admit == 1 and engine == "auto":
        ix = LruIndex.build(trace)
        _, found = hit_curve(ix.dist, caps)
        pc = _prefix_counts(ix, caps)
        rows = np.stack([found, pc[0], pc[1]], axis=1)
    else:
        if not pk.ENABLED:
            raise ParameterError("engine='compiled' needs numba (pip install numba; KVLAB_NUMBA=0 turns it off)")
        dense, n, nxt, mf = pk.stream_arrays(trace.block_ids, cls.offline)
        params = np.zeros(3, np.float64)
        params[:len(cls.params())] = cls.params()
        rows = pk.run_curve(cls.kernel, caps, params, dense, nxt, trace.block_offsets.astype(np.int64),
                             trace.input_tokens.astype(np.int64), int(trace.block_tokens), admit, n, mf)
    return CacheHits(policy, admission, caps, rows[:, 0].copy(), rows[:, 1].copy(), rows[:, 2].copy(), A, T)


def _prefix_counts(ix, caps) -> tuple[np.ndarray, np.ndarray]:
    """(prefix-hit blocks, tokens) of LRU at each capacity from the per-request running max of stack distances."""
    e = ix.prefix_dist
    ok = e >= 0
    order = np.argsort(e[ok], kind="stable")
    es = e[ok][order]
    ctok = np.concatenate(([0], np.cumsum(ix.tok[ok][order])))
    k = np.searchsorted(es, caps, side="left")
    return k.astype(np.int64), ctok[k].astype(np.int64)


def capacity_for(trace: Trace, policy: str, target: float, measure: str = "token", admission: str = "all") -> int | None:
    """Smallest capacity (blocks) at which `policy` reaches hit rate `target` on `trace` (None: not even with every
    block cached). LRU with admission "all" is exact (stack distances); other policies double the capacity until the
    target is met, then bisect (FIFO and S3-FIFO are not monotone in capacity: this is the bisection's answer)."""
    cls = _check(trace, policy)
    need_choice("measure", measure, MEASURES)
    t = need_number("target", target, 0.0, 1.0)
    admit_after(admission)
    lo = cls.min_capacity
    hi_cap = max(trace.n_blocks, lo)

    def rate(c):
        return float(cache_hits(trace, policy, [c], admission).rate(measure)[0])

    if rate(hi_cap) < t:
        return None
    if policy == "lru" and admission == "all":
        ix = LruIndex.build(trace)
        if measure == "token":
            e, w, total = ix.prefix_dist, ix.tok, int(trace.input_tokens.sum())
        else:
            e, w, total = ix.dist, np.ones(len(ix.dist), np.int64), trace.n_accesses
        ok = e >= 0
        order = np.argsort(e[ok], kind="stable")
        es, cw = e[ok][order], np.cumsum(w[ok][order])
        if t == 0:
            return lo
        k = int(np.searchsorted(cw, t * total, side="left"))  # the first capacity whose hits reach the target
        return max(int(es[k]) + 1, lo)
    if rate(lo) >= t:
        return lo
    c = lo
    while rate(min(2 * c, hi_cap)) < t:
        c = min(2 * c, hi_cap)
    a, b = c, min(2 * c, hi_cap)  # rate(a) < t <= rate(b)
    while b - a > 1:
        m = (a + b) // 2
        a, b = (a, m) if rate(m) >= t else (m, b)
    return b


def grid(n_blocks: int, points: int = 100, lo: int = 1) -> np.ndarray:
    """`points` capacities spaced evenly in log from `lo` to n_blocks (every block cached), distinct."""
    need_int("points", points, 2)
    n_blocks, lo = need_int("n_blocks", n_blocks), need_int("lo", lo, 1)
    hi = max(n_blocks, lo + 1)
    return np.unique(np.round(np.logspace(np.log10(lo), np.log10(hi), points)).astype(np.int64))
