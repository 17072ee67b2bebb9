"""A KV tiering simulator: HBM, host DRAM and SSD holding prefix-chained blocks, each tier under its own policy.

Each request reads its blocks in order; only the leading run of cached blocks is a prefix hit
(a block found after the first miss is recomputed anyway, as engines match prefixes). Hit blocks
in a lower tier are promoted to HBM; HBM's victims are demoted to DRAM, DRAM's to SSD, SSD's are
dropped. Each tier has an eviction policy (kvlab.sim.policies: LRU, FIFO, LFU, SIEVE, S3-FIFO, ARC,
Belady) and an admission rule (store every block, or only from its second access). Host DRAM state
expires `ttl_s` seconds after its last use (to SSD when there is one). Capacities are bytes turned
into blocks with the model's own bytes per token (kvlab.engines). Per tier and overall: hits by blocks
and tokens, recomputed tokens, bytes moved, and a TTFT per request = recomputed tokens / prefill
throughput + hit blocks' transfer from their tier.
The rules (exclusive tiers, empty tiers skipped, admission, the DRAM TTL) are kvlab.sim.tierstack's, which
serve-sim's replicas use too.

Engines that give the same answers where both apply (tests hold them equal):
  `simulate_lru_fast`   LRU everywhere: exclusive LRU tiers with demote-on-evict and promote-on-hit behave as one
                        LRU stack cut into regions (HBM = the top C1 positions, DRAM the next C2, SSD the
                        next C3). With numba, a compiled block-by-block pass over that stack as a linked list
                        (kvlab.sim.kernels); without it, stack distances (kvlab.sim.stackdist) give every
                        access's tier at once (numpy). TTL is supported when there is no SSD tier.
  `simulate_compiled`   any policies and admissions, TTL with SSD: the compiled tier kernel (kvlab.sim.policy_kernels)
  `simulate_sequential` the same, block by block through the policies' reference classes
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from . import kernels
from . import policy_kernels as pk
from ..checks import cdiv, need_int, need_number
from ..engines import allocate
from ..errors import ParameterError
from ..hardware import get_gpu
from .policies import admit_after, get_policy, policy_names
from .stackdist import LruIndex, next_access
from .tierstack import TierStack, tier_admissions, tier_policies  # noqa: F401 (re-exported)
from .traces import Trace, access_tokens, need_prefixes

TIERS = ("hbm", "dram", "ssd")
POLICIES = tuple(policy_names())  # the registered eviction policies (kvlab.sim.policies)
DEFAULT_PREFILL_TOKENS_PER_S = 10_000.0  # assumption: one GPU's prefill rate for the TTFT estimate; set per model
MAX_GB = 1e9  # largest tier budget accepted, GB (an exabyte): block counts stay exact integers


@dataclass(frozen=True)
class Tiers:
    """Tier capacities (blocks) and read bandwidths for one model's block size."""

    block_tokens: int  # tokens per block (the trace's hash granularity)
    block_bytes: int  # bytes of one block: model bytes/token x block_tokens, rounded up
    capacity_blocks: tuple[int, int, int]  # HBM, DRAM, SSD
    read_bytes_per_s: tuple[float, float, float]  # bandwidth bringing a block into HBM from each tier
    ttl_s: float = math.inf  # host DRAM state expires this long after its last use
    prefill_tokens_per_s: float = DEFAULT_PREFILL_TOKENS_PER_S  # prefill rate for recomputed tokens

    def __post_init__(self):
        need_int("block_tokens", self.block_tokens, 1)
        need_int("block_bytes", self.block_bytes, 1)
        if len(self.capacity_blocks) != 3 or len(self.read_bytes_per_s) != 3:
            raise ParameterError("capacity_blocks and read_bytes_per_s need one value per tier (hbm, dram, ssd)")
        for t, c in zip(TIERS, self.capacity_blocks):
            need_int(f"{t} capacity (blocks)", c, 0, 2**62)
        if self.capacity_blocks[0] < 1:
            raise ParameterError("the HBM tier must hold at least one block")
        for t, bw in zip(TIERS, self.read_bytes_per_s):
            need_number(f"{t} read bandwidth (B/s)", bw, 0.0, lo_open=True)
        need_number("ttl_s", self.ttl_s, 0.0, lo_open=True, finite=False)
        need_number("prefill_tokens_per_s", self.prefill_tokens_per_s, 0.0, lo_open=True)

    def transfer_s(self) -> np.ndarray:
        """[3] seconds to bring one block into HBM from each tier (HBM: 0)."""
        return np.array([0.0] + [self.block_bytes / bw for bw in self.read_bytes_per_s[1:]])


def block_bytes(model, block_tokens: int, scheme: str = "storage", kv_format=None) -> int:
    """Bytes of one block of `block_tokens` tokens: the allocation's bytes per token x tokens, rounded up."""
    need_int("block_tokens", block_tokens, 1)
    a = allocate(model, scheme, kv_format)
    return math.ceil(a.bytes_per_token * block_tokens)


def make_tiers(model, hbm_gb: float, dram_gb: float = 0.0, ssd_gb: float = 0.0, gpu="H100",
               block_tokens: int = 512, ttl_s: float = math.inf,
               prefill_tokens_per_s: float = DEFAULT_PREFILL_TOKENS_PER_S, scheme: str = "storage",
               kv_format=None) -> Tiers:
    """Tiers from KV budgets in GB (1e9 B) and a GPU's host-link and SSD bandwidths (an SSD block is read
    through the host, so at the slower of the two)."""
    for k, v in (("hbm_gb", hbm_gb), ("dram_gb", dram_gb), ("ssd_gb", ssd_gb)):
        need_number(k, v, 0.0, MAX_GB)
    need_int("block_tokens", block_tokens, 1)
    need_number("ttl_s", ttl_s, 0.0, lo_open=True, finite=False)
    need_number("prefill_tokens_per_s", prefill_tokens_per_s, 0.0, lo_open=True)
    g = get_gpu(gpu)
    bb = block_bytes(model, block_tokens, scheme, kv_format)
    caps = tuple(int(gb * 1e9 // bb) for gb in (hbm_gb, dram_gb, ssd_gb))
    if caps[0] < 1:
        raise ParameterError(f"hbm_gb {hbm_gb:g} holds no block: one block is {bb:,} B ({block_tokens} tokens of "
                             f"{model}); the HBM tier must hold at least one")
    bws = (g.hbm_bytes_per_s, g.host_link_bytes_per_s, min(g.ssd_bytes_per_s, g.host_link_bytes_per_s))
    return Tiers(block_tokens, bb, caps, bws, ttl_s, prefill_tokens_per_s)


@dataclass
class SimResult:
    """What a trace did to the tiers."""

    policy: str  # eviction policy
    tiers: Tiers  # the configuration simulated
    requests: int  # requests simulated
    accesses: int  # block accesses
    hit_blocks: np.ndarray  # [3] prefix-hit blocks served from HBM, DRAM, SSD
    hit_tokens: np.ndarray  # [3] their tokens
    input_tokens: int  # prompt tokens over all requests
    request_hit_tokens: np.ndarray  # [R] prefix-hit tokens per request
    ttft_s: np.ndarray  # [R] estimated time to first token per request
    moved_bytes: dict = field(default_factory=dict)  # "src->dst" -> bytes moved between tiers
    evicted_blocks: int | None = None  # blocks dropped from the last tier for capacity (None: not tracked)
    stale_blocks: int = 0  # cached blocks past a request's first miss (recomputed, old copy dropped)
    admission: str = "all"  # admission rule(s): "all", "second", or one per tier joined by "/"
    declined_blocks: int = 0  # blocks a tier refused to store (admission, or the policy declining them)

    @property
    def recomputed_tokens(self) -> int:
        return int(self.input_tokens - self.request_hit_tokens.sum())

    @property
    def token_hit_rate(self) -> float:
        return float(self.hit_tokens.sum() / self.input_tokens) if self.input_tokens else 0.0

    @property
    def block_hit_rate(self) -> float:
        return float(self.hit_blocks.sum() / self.accesses) if self.accesses else 0.0

    def summary(self) -> dict:
        d = dict(policy=self.policy, requests=self.requests, block_accesses=self.accesses,
                 block_bytes=self.tiers.block_bytes, capacity_blocks=dict(zip(TIERS, self.tiers.capacity_blocks)),
                 ttl_s=self.tiers.ttl_s if math.isfinite(self.tiers.ttl_s) else None,
                 token_hit_rate=self.token_hit_rate, block_hit_rate=self.block_hit_rate,
                 recomputed_tokens=self.recomputed_tokens, input_tokens=self.input_tokens,
                 moved_bytes=dict(self.moved_bytes), evicted_blocks=self.evicted_blocks,
                 stale_blocks=self.stale_blocks, admission=self.admission, declined_blocks=self.declined_blocks,
                 ttft_mean_s=float(self.ttft_s.mean()) if len(self.ttft_s) else 0.0,
                 ttft_p50_s=float(np.percentile(self.ttft_s, 50)) if len(self.ttft_s) else 0.0,
                 ttft_p99_s=float(np.percentile(self.ttft_s, 99)) if len(self.ttft_s) else 0.0)
        for i, t in enumerate(TIERS):
            d[f"{t}_hit_blocks"] = int(self.hit_blocks[i])
            d[f"{t}_hit_tokens"] = int(self.hit_tokens[i])
            d[f"{t}_token_hit_rate"] = float(self.hit_tokens[i] / self.input_tokens) if self.input_tokens else 0.0
            d[f"{t}_block_hit_rate"] = float(self.hit_blocks[i] / self.accesses) if self.accesses else 0.0
        return d


def _finish(policy, tiers, trace, tier, hit, req, moved, evicted, stale, tok=None) -> SimResult:
    """Per-tier and per-request totals from each access's tier (3 = not found) and prefix-hit flag."""
    R = len(trace)
    tok = access_tokens(trace, req) if tok is None else tok
    th, rh = tier[hit], req[hit]
    hit_blocks = np.bincount(th, minlength=3)[:3]
    hit_tokens = np.bincount(th, weights=tok[hit], minlength=3)[:3].astype(np.int64)
    req_hit = np.bincount(rh, weights=tok[hit], minlength=R).astype(np.int64)
    transfer = np.bincount(rh, weights=tiers.transfer_s()[th], minlength=R)
    ttft = (trace.input_tokens - req_hit) / tiers.prefill_tokens_per_s + transfer
    return SimResult(policy, tiers, R, trace.n_accesses, hit_blocks.astype(np.int64), hit_tokens,
                     int(trace.input_tokens.sum()), req_hit, ttft, moved, evicted, stale)


def _prefix_hits(trace: Trace, found: np.ndarray, req: np.ndarray) -> np.ndarray:
    """[A] True where a found block lies before its request's first miss."""
    off = trace.block_offsets
    pos = np.arange(trace.n_accesses) - off[req]
    first_miss = np.full(len(trace), np.iinfo(np.int64).max)
    nz = np.flatnonzero(np.diff(off) > 0)
    if len(nz):
        miss_pos = np.where(found, np.iinfo(np.int64).max, pos)
        first_miss[nz] = np.minimum.reduceat(miss_pos, off[nz])
    return found & (pos < first_miss[req])


def _check_lru_fast(trace: Trace, tiers: Tiers):
    need_prefixes(trace)
    if math.isfinite(tiers.ttl_s) and tiers.capacity_blocks[2] > 0:
        raise ParameterError("the vectorized LRU path supports a DRAM TTL only without an SSD tier; "
                             "use simulate_sequential")


def _moved_and_evicted(tiers: Tiers, demoted, hit_blocks, ttl_on: bool) -> tuple[dict, int | None]:
    """Bytes moved between tiers ("src->dst") and blocks dropped past the last tier, from the blocks pushed
    out of each tier (demoted [3]) and the prefix hits per tier (promotions)."""
    caps = tiers.capacity_blocks
    bb = tiers.block_bytes
    active = [i for i in range(3) if caps[i] > 0]
    moved, evicted = {}, None
    for k, src in enumerate(active):
        n = int(demoted[src])
        if k + 1 < len(active):
            moved[f"{TIERS[src]}->{TIERS[active[k + 1]]}"] = n * bb
        elif not ttl_on or src == 0:
            evicted = n
    for i in (1, 2):
        moved[f"{TIERS[i]}->hbm"] = int(hit_blocks[i]) * bb
    return {k: v for k, v in moved.items() if v or k in ("dram->hbm", "ssd->hbm")}, evicted


def simulate_lru_fast(trace: Trace, tiers: Tiers, index: LruIndex | None = None) -> SimResult:
    """LRU over exclusive tiers, equal to `simulate_sequential` with policy "lru". With numba
    (kvlab.sim.kernels) a compiled block-by-block pass over linked-list tiers, which needs no index
    (`index` is then unused); without it, the vectorized stack-distance path, where an `index` built
    once serves every configuration of the same trace."""
    if kernels.ENABLED:
        return _simulate_lru_jit(trace, tiers)
    return _simulate_lru_numpy(trace, tiers, index)


def _simulate_lru_jit(trace: Trace, tiers: Tiers) -> SimResult:
    """simulate_lru_fast through the compiled tier kernel."""
    _check_lru_fast(trace, tiers)
    caps = tiers.capacity_blocks
    ttl_on = math.isfinite(tiers.ttl_s) and caps[1] > 0
    transfer_s = tiers.transfer_s()
    hit_blocks, hit_tokens, req_hit, transfer, demoted, stale = kernels.tiered_lru(
        trace.block_ids, trace.block_offsets, trace.input_tokens, trace.timestamps, trace.block_tokens, caps,
        tiers.ttl_s if ttl_on else math.inf, ttl_on, transfer_s)
    moved, evicted = _moved_and_evicted(tiers, demoted, hit_blocks, ttl_on)
    ttft = (trace.input_tokens - req_hit) / tiers.prefill_tokens_per_s + transfer
    return SimResult("lru", tiers, len(trace), trace.n_accesses, hit_blocks, hit_tokens,
                     int(trace.input_tokens.sum()), req_hit, ttft, moved, evicted, int(stale))


def _simulate_lru_numpy(trace: Trace, tiers: Tiers, index: LruIndex | None = None) -> SimResult:
    """simulate_lru_fast from stack distances (vectorized numpy)."""
    _check_lru_fast(trace, tiers)
    ix = LruIndex.build(trace) if index is None else index
    d, prev = ix.dist, ix.prev
    caps = tiers.capacity_blocks
    active = [i for i in range(3) if caps[i] > 0]
    bounds = np.cumsum([caps[i] for i in active])
    # the region of the stack each access finds its block in (len(active): beyond the last tier, or cold)
    slot = np.zeros(len(d), np.int8)
    for b in bounds[:-1]:
        slot += d >= b
    region = np.array(active + [3], np.int8)
    tier = region[slot]
    cold = prev < 0
    tier[cold | (d >= bounds[-1])] = 3
    ttl_on = math.isfinite(tiers.ttl_s) and caps[1] > 0
    if ttl_on:
        t = trace.timestamps[ix.req]
        gap = t - t[np.where(prev < 0, 0, prev)]
        tier = np.where((tier == 1) & (gap > tiers.ttl_s), 3, tier)  # expired host state
        hit = _prefix_hits(trace, tier < 3, ix.req)
    else:
        e = ix.prefix_dist
        hit = (e >= 0) & (e < bounds[-1])  # every block up to this one is within the cache
    # demotions: an access from below boundary k shifts the block at position k - 1 across it
    demoted = np.zeros(3, np.int64)
    for k, b in enumerate(bounds):
        demoted[active[k]] = np.count_nonzero((cold | (d >= b)) & (ix.seen >= b))
    hit_blocks = np.bincount(tier[hit], minlength=4)[:3]
    stale = int(np.count_nonzero(tier < 3)) - int(hit_blocks.sum())
    moved, evicted = _moved_and_evicted(tiers, demoted, hit_blocks, ttl_on)
    return _finish("lru", tiers, trace, tier, hit, ix.req, moved, evicted, stale, ix.tok)


# --- any policy per tier: the block-by-block reference and its compiled twin ---------------------------
def _label(names) -> str:
    return names[0] if len(set(names)) == 1 else "/".join(names)


def _tier_caches(tiers: Tiers, pols, future):
    """One reference cache per tier with room (None for an empty tier); a too-small tier is named."""
    out = []
    for k, p in enumerate(pols):
        if tiers.capacity_blocks[k] == 0:
            out.append(None)
            continue
        try:
            out.append(get_policy(p)(tiers.capacity_blocks[k], future))
        except ParameterError as e:
            raise ParameterError(f"{TIERS[k]} tier: {e}") from None
    return out


def _moved_dict(moved: dict, hit, tier, bb: int) -> dict:
    for k in (1, 2):  # promotions: prefix hits from a lower tier (a stale copy is dropped, not moved)
        moved[f"{TIERS[k]}->hbm"] = int(np.count_nonzero(hit & (tier == k))) * bb
    return {k: v for k, v in moved.items() if v or k in ("dram->hbm", "ssd->hbm")}


def simulate_sequential(trace: Trace, tiers: Tiers, policy="lru", progress: bool = False,
                        admission="all") -> SimResult:
    """Block-by-block simulation through the policies' reference classes (any policy per tier, any admission,
    TTL with or without SSD).

    Every accessed block is looked up in HBM (a hit there is a policy hit); found in DRAM or SSD it is taken out
    and stored in HBM. A tier stores a block only once it has been accessed `admit_after(admission)` times, else
    drops it; a block the policy declines is dropped too. Each tier's victim moves to the next tier with room
    (looked up there first, so ARC's and S3-FIFO's ghosts see it), the last tier's is dropped. Host DRAM drops (or
    sinks to SSD) a block idle past the TTL - at the start of each request, or on arrival from HBM."""
    need_prefixes(trace)
    pols, adms = tier_policies(policy), tier_admissions(admission)
    future: dict = {}  # block -> its next access (read by offline policies)
    stack = TierStack(tiers.capacity_blocks, tiers.block_bytes, tiers.ttl_s, pols, adms, future)
    stack.moved = {}
    nxt = next_access(trace.block_ids).tolist() if any(
        c is not None and c.offline for c in stack.caches) else None
    tier_of = np.full(trace.n_accesses, 3, np.int64)
    ids = trace.block_ids.tolist()
    off = trace.block_offsets.tolist()
    ts = trace.timestamps.tolist()
    it = range(len(trace))
    if progress:
        from tqdm.auto import tqdm
        it = tqdm(it, desc="simulate", unit="req")
    for r in it:
        now = ts[r]
        stack.expire(now)
        intact = True
        for a in range(off[r], off[r + 1]):
            b = ids[a]
            if nxt is not None:
                future[b] = nxt[a]
            k = stack.take(b, now)
            tier_of[a] = k
            if k == 3:
                intact = False
            elif not intact:
                tier_of[a] = k | 8  # found but past the first miss: recomputed
    bb, moved, evicted, declined = tiers.block_bytes, stack.moved, stack.evicted, stack.declined
    found = (tier_of & 7) < 3
    hit = found & (tier_of < 8)
    stale = int(np.count_nonzero(tier_of >= 8))
    tier = np.where(found, tier_of & 7, 3)
    res = _finish(_label(pols), tiers, trace, tier, hit, trace.request_of_access, _moved_dict(moved, hit, tier, bb),
                  evicted, stale)
    res.admission, res.declined_blocks = _label(adms), declined
    return res


def simulate_compiled(trace: Trace, tiers: Tiers, policy="lru", admission="all") -> SimResult:
    """`simulate_sequential` through the compiled tier kernel (kvlab.sim.policy_kernels): the same results."""
    need_prefixes(trace)
    if not pk.ENABLED:
        raise ParameterError("the compiled tier kernel needs numba (KVLAB_NUMBA=0 turns it off); "
                             "use simulate_sequential")
    pols, adms = tier_policies(policy), tier_admissions(admission)
    _tier_caches(tiers, pols, {})  # capacity checks, with the tier named
    classes = [get_policy(p) for p in pols]
    offline = any(c.offline for k, c in enumerate(classes) if tiers.capacity_blocks[k])
    dense, n, nxt, max_freq = pk.stream_arrays(trace.block_ids, True)
    if not offline:
        nxt = np.zeros(len(dense), np.int64)
    params = np.zeros((3, 3), np.float64)
    for k, c in enumerate(classes):
        params[k, :len(c.params())] = c.params()
    ttl_on = math.isfinite(tiers.ttl_s)
    hit_blocks, hit_tokens, req_hit, transfer, moved_blocks, counts, stale = pk.tiered(
        [c.kernel for c in classes], np.asarray(tiers.capacity_blocks, np.int64), params,
        np.array([admit_after(a) for a in adms], np.int64), dense, nxt, trace.block_offsets.astype(np.int64),
        trace.input_tokens.astype(np.int64), trace.timestamps.astype(np.float64), int(trace.block_tokens),
        float(tiers.ttl_s) if ttl_on else 0.0, ttl_on, tiers.transfer_s(), max(n, 1), max_freq)
    bb = tiers.block_bytes
    moved = {f"{TIERS[s]}->{TIERS[d]}": int(moved_blocks[s, d]) * bb for s in range(3) for d in range(s + 1, 3)
             if moved_blocks[s, d]}
    for k in (1, 2):
        moved[f"{TIERS[k]}->hbm"] = int(hit_blocks[k]) * bb
    ttft = (trace.input_tokens - req_hit) / tiers.prefill_tokens_per_s + transfer
    return SimResult(_label(pols), tiers, len(trace), trace.n_accesses, hit_blocks, hit_tokens,
                     int(trace.input_tokens.sum()), req_hit, ttft, moved, int(counts[0]), int(stale),
                     _label(adms), int(counts[1]))


def simulate(trace: Trace, tiers: Tiers, policy="lru", progress: bool = False, admission="all") -> SimResult:
    """LRU in every tier with admission "all": the LRU fast path where it applies (no TTL with SSD); any other
    mix: the compiled tier kernel, or the sequential reference without numba."""
    pols, adms = tier_policies(policy), tier_admissions(admission)
    lru = set(pols) == {"lru"} and set(adms) == {"all"}
    if not pk.ENABLED and not lru:
        return simulate_sequential(trace, tiers, pols, progress, adms)
    need_prefixes(trace)
    _tier_caches(tiers, pols, {})  # bad input is refused before a progress bar appears
    bar = None
    if progress:  # a compiled run is one call: the bar completes when it returns
        from tqdm.auto import tqdm
        bar = tqdm(total=len(trace), desc="simulate", unit="req")
    try:
        if lru and (not math.isfinite(tiers.ttl_s) or tiers.capacity_blocks[2] == 0):
            res = simulate_lru_fast(trace, tiers)
        elif pk.ENABLED:
            res = simulate_compiled(trace, tiers, pols, adms)
        else:
            res = simulate_sequential(trace, tiers, pols, False, adms)
        if bar is not None:
            bar.update(len(trace))
    finally:
        if bar is not None:
            bar.close()
    return res


# --- curves and validation ---------------------------------------------------------------------------
def prefix_hit_curve(trace: Trace, capacities_blocks, index: LruIndex | None = None) -> dict:
    """LRU prefix-hit rates (by tokens and by blocks) at each total capacity, from one pass over the trace: a
    prefix hit at capacity C needs every block of the request up to this one within C (the running maximum)."""
    ix = LruIndex.build(trace) if index is None else index
    e = ix.prefix_dist
    caps = np.asarray(capacities_blocks, np.int64)
    ok = e >= 0
    order = np.argsort(e[ok], kind="stable")
    es = e[ok][order]
    ctok = np.concatenate(([0], np.cumsum(ix.tok[ok][order])))
    n = np.searchsorted(es, caps, side="left")  # accesses with e < capacity
    return dict(capacity_blocks=caps, block_hit_rate=n / max(trace.n_accesses, 1),
                token_hit_rate=ctok[n] / max(int(trace.input_tokens.sum()), 1))


# Mooncake (FAST'25) Table 2 cache ratios of its three workloads (Qin et al., "Mooncake: Trading More Storage for Less
# Computation", USENIX FAST 2025)
MOONCAKE_TABLE2_CACHE_RATIO = {"conversation": 0.40, "synthetic": 0.66, "tool&agent": 0.59}


def reuse_ratio(trace: Trace, warmup: float = 0.0) -> dict:
    """Unlimited-capacity prefix reuse: the share of blocks (and prompt tokens) that a request finds as a cached
    prefix left by any earlier request. `warmup` (a fraction of the requests) lets the first requests fill the
    cache without being counted, which removes the cold start of a trace cut out of longer traffic."""
    r = simulate_lru_fast(trace, Tiers(trace.block_tokens, 1, (max(trace.n_blocks, 1), 0, 0), (1.0, 1.0, 1.0)))
    first = int(len(trace) * warmup)
    a0 = int(trace.block_offsets[first])
    hit_tokens = r.request_hit_tokens[first:].sum()
    # blocks hit per request = hit tokens rounded up to blocks (a hit partial last block counts as one)
    per_req_blocks = cdiv(r.request_hit_tokens, trace.block_tokens)
    return dict(block_reuse=float(per_req_blocks[first:].sum() / max(trace.n_accesses - a0, 1)),
                token_reuse=float(hit_tokens / max(int(trace.input_tokens[first:].sum()), 1)),
                requests=len(trace) - first)


def ttl_sweep(trace: Trace, model, ttls_s, hbm_gb: float, dram_gb: float, gpu="H100", **kw) -> list[dict]:
    """Hit rates and recomputed tokens against the host-DRAM TTL (LRU, no SSD; math.inf = no TTL)."""
    out = []
    ix = None if kernels.ENABLED else LruIndex.build(trace)  # the compiled path needs no index
    for ttl in ttls_s:
        t = make_tiers(model, hbm_gb, dram_gb, 0.0, gpu=gpu, block_tokens=trace.block_tokens, ttl_s=ttl, **kw)
        r = simulate_lru_fast(trace, t, ix)
        out.append(dict(ttl_s=ttl, token_hit_rate=r.token_hit_rate, dram_token_hit_rate=r.summary()["dram_token_hit_rate"],
                        recomputed_tokens=r.recomputed_tokens,
                        recomputed_share=r.recomputed_tokens / r.input_tokens, ttft_mean_s=float(r.ttft_s.mean())))
    return out


def v41_ttl_recompute(ttl_s: float = 60.0, seed: int = 0) -> float:
    """Extra share of prompt tokens recomputed when V4.1-Flash's host-resident state has a `ttl_s` TTL rather
    than none, on the seeded synthetic agent workload with a small HBM tier (0.05 GB) and 10 GB of host DRAM."""
    from .traces import synthetic_agent_trace
    rows = ttl_sweep(synthetic_agent_trace(seed=seed), "deepseek-v4.1-flash", [ttl_s, math.inf], 0.05, 10.0)
    return rows[0]["recomputed_share"] - rows[1]["recomputed_share"]
