"""One tier stack: HBM, host DRAM and SSD holding prefix-chained blocks, any eviction policy per tier.

The rules every kvlab tier simulation follows (`kvlab simulate` through kvlab.sim.tiering, whose compiled kernel
kvlab.sim.policy_kernels.tiered is held equal to this class by tests; `kvlab serve-sim`'s replicas through
kvlab.serving.hosttiers, this class with `hbm_external`: the vLLM pool is the HBM tier, its evictions arrive in DRAM):

  tiers       exclusive: a block lives in at most one tier. A tier of 0 blocks is absent: HBM's victims go to
              the next tier that exists (DRAM, else SSD), the last tier's victims are dropped.
  lookup      a request's blocks are looked up in order; only the leading run of found blocks is a prefix hit
              (vLLM's find_longest_cache_hit, vllm/v1/core/kv_cache_manager.py); a block found in DRAM or SSD is
              taken out and stored in HBM (promote on hit), a block found after the first miss is recomputed and
              its old copy moves to HBM all the same.
  eviction    each tier runs one of the registered policies (kvlab.sim.policies: lru, fifo, lfu, sieve, s3fifo,
              arc, belady, belady-bypass); a tier's victim moves down (demote on evict), looked up in the next
              tier first so that ARC's and S3-FIFO's ghosts see it.
  admission   one rule per tier: a tier stores a block once it has been accessed `admit_after(rule)` times
              ("all": 1, "second": 2), else the block is dropped; a block the policy declines is dropped too.
              This is vLLM's CPU offloading store threshold (OffloadingConnector, vllm/v1/kv_offload: a block is
              offloaded only after it was seen N times) applied the same way to every tier.
  TTL         host DRAM only: a DRAM block idle longer than `ttl_s` (since its last use) leaves DRAM at the
              start of the next request, or on arrival from HBM, and sinks to SSD when there is one (dropped
              otherwise); SSD keeps no TTL. LMCache documents a retention TTL per request on its CPU tier, and
              NVIDIA Dynamo's KVBM an ephemeral TTL for agent sessions (../shared/reference/serving.md, "Tiering
              in engines"); both are about host memory, not disk.

What a DRAM tier does, for reference: vLLM's OffloadingConnector keeps a CPU block pool of --kv-offloading-size
GiB under an LRU (also ARC) manager (vllm/v1/kv_offload/lru_manager.py, arc_manager.py) and loads hit blocks
back into GPU blocks before the request runs; LMCache keeps 256-token chunks in a local CPU backend (default
5 GB) in front of local disk and remote tiers. kvlab differs in one deliberate way: both engines write a block to
the CPU tier when it is computed (a copy beside the GPU's), kvlab moves it there when HBM evicts it (one copy,
so HBM and DRAM add up). A write-through variant is left for later.
"""
from __future__ import annotations

import heapq
from itertools import repeat
import math

import numpy as np

from ..errors import ParameterError
from .policies import admit_after, get_policy

TIERS = ("hbm", "dram", "ssd")


def _per_tier(name: str, value, check) -> tuple[str, str, str]:
    """One value for every tier, or a sequence of three (hbm, dram, ssd), each passed through `check`."""
    vals = (value,) * 3 if isinstance(value, str) else tuple(value) if isinstance(value, (list, tuple)) else ()
    if len(vals) != 3:
        raise ParameterError(f"{name} must be one name or one per tier (hbm, dram, ssd), got {value!r}")
    for v in vals:
        check(v)
    return vals


def tier_policies(policy) -> tuple[str, str, str]:
    """Policy names for HBM, DRAM and SSD from one name (every tier) or a sequence of three."""
    return _per_tier("policy", policy, get_policy)


def tier_admissions(admission) -> tuple[str, str, str]:
    """Admission rules ("all" or "second") for HBM, DRAM and SSD from one rule or a sequence of three."""
    return _per_tier("admission", admission, admit_after)


class TierStack:
    """HBM / DRAM / SSD under the rules of the module docstring, one request (or one block) at a time."""

    def __init__(self, capacity_blocks, block_bytes: int, ttl_s: float = math.inf, policy="lru",
                 admission="all", future: dict | None = None, hbm_external: bool = False):
        self.hbm_external = hbm_external  # HBM is a vLLM pool outside the stack (kvlab.serving.hosttiers): storing
        # a block "in HBM" leaves it to the pool, and the pool's victims arrive through place(b, 1, 0, now)
        self.cap = tuple(int(c) for c in capacity_blocks)  # blocks per tier: HBM, DRAM, SSD (0: no such tier)
        self.block_bytes = int(block_bytes)  # bytes of one block
        self.ttl_s = float(ttl_s)  # DRAM blocks expire this long after their last use (math.inf: never)
        self.policies = tier_policies(policy)  # eviction policy per tier
        self.admissions = tier_admissions(admission)  # admission rule per tier
        self.admits = [admit_after(a) for a in self.admissions]  # accesses a block needs before a tier stores it
        self.future = {} if future is None else future  # block -> next use (offline policies; the caller updates)
        self.caches = []  # one policy instance per tier with room, None for an absent tier
        for k, p in enumerate(self.policies):
            if self.cap[k] == 0:
                self.caches.append(None)
                continue
            cls = get_policy(p)
            if cls.offline and future is None:
                raise ParameterError(f"{TIERS[k]} tier: {cls.title} needs each block's next use, which a "
                                     "serving run does not know; use an online policy")
            try:
                self.caches.append(cls(self.cap[k], self.future))
            except ParameterError as e:
                raise ParameterError(f"{TIERS[k]} tier: {e}") from None
        self.where: dict[int, int] = {}  # block -> tier index
        # per-block history, kept only where a rule reads it (it grows with every block ever seen: hundreds of
        # millions of keys over a long serving run would not fit in memory)
        self.counting = any(a > 1 for a, c in zip(self.admits, self.cap) if c)  # an admission rule counts
        self.dating = math.isfinite(self.ttl_s)  # a TTL reads last uses
        self.last: dict[int, float] = {}  # block -> time of its last use (when dating)
        self.count: dict[int, int] = {}  # block -> accesses so far (when counting; else every block seen has 1)
        self.expiry: list = []  # (last use, block) for DRAM residents; lazy: stale entries are skipped
        self.moved: dict = {"hbm->dram": 0, "dram->ssd": 0, "dram->hbm": 0, "ssd->hbm": 0}  # bytes src->dst
        self.evicted = 0  # blocks dropped past the last tier for capacity
        self.declined = 0  # blocks a tier refused (admission or the policy)

    @property
    def history(self) -> bool:
        """Per-block history is kept (a rule reads it): blocks are then taken and placed one at a time."""
        return self.counting or self.dating

    def move(self, src: int, dst: int, blocks: int = 1) -> None:
        """Count `blocks` blocks moved from tier src to tier dst."""
        key = f"{TIERS[src]}->{TIERS[dst]}"
        self.moved[key] = self.moved.get(key, 0) + self.block_bytes * blocks

    # --- the rules -------------------------------------------------------------------------------------------
    def place(self, b: int, k: int, src: int | None, now: float) -> None:
        """Store b (coming from tier src, None if computed) in tier k or the next that exists, victims cascading
        down."""
        caps = self.cap
        if k == 0 and self.hbm_external:
            return
        while True:
            while k < 3 and caps[k] == 0:
                k += 1
            if k >= 3:
                self.evicted += 1
                return
            if self.counting and self.count[b] < self.admits[k]:
                self.declined += 1
                return
            if src is not None:
                self.move(src, k)
            if k == 1 and self.dating and now - self.last[b] > self.ttl_s:  # expired on arrival
                if caps[2] == 0:
                    return
                src, k = 1, 2
                continue
            self.caches[k].lookup(b)
            v, stored = self.caches[k].insert(b)
            if stored:
                self.where[b] = k
                if k == 1 and math.isfinite(self.ttl_s):
                    heapq.heappush(self.expiry, (self.last[b], b))
            else:
                self.declined += 1
            if v < 0 or v == b:
                return
            del self.where[v]
            b, src, k = v, k, k + 1

    def place_many(self, blocks: list, k: int, src: int | None, now: float) -> None:
        """`place(b, k, src, now)` for each of `blocks` (distinct, in no tier, as `place` needs them) in order: one
        policy call a tier (Policy.insert_run) when no rule reads per-block history (a tier's victims reach the
        next tier in the order they left, which is all the next tier sees); else one at a time."""
        if self.history:
            for b in blocks:
                self.place(b, k, src, now)
            return
        if k == 0 and self.hbm_external:
            return
        caps, where = self.cap, self.where
        while blocks:
            while k < 3 and caps[k] == 0:
                k += 1
            if k >= 3:
                self.evicted += len(blocks)
                return
            if src is not None:
                self.move(src, k, len(blocks))
            kept, left = self.caches[k].insert_run(blocks)
            self.declined += len(blocks) - len(kept)
            where.update(dict.fromkeys(kept, k))
            for v in left:
                del where[v]
            blocks, src, k = left, k, k + 1

    def expire(self, now: float) -> None:
        """DRAM blocks idle longer than the TTL leave DRAM: to SSD when there is one, else dropped."""
        if not math.isfinite(self.ttl_s):
            return
        ex = self.expiry
        while ex and ex[0][0] < now - self.ttl_s:
            t0, b = heapq.heappop(ex)
            if self.where.get(b) == 1 and self.last[b] == t0:
                self.caches[1].remove(b)
                del self.where[b]
                if self.cap[2] > 0:
                    self.place(b, 2, 1, now)

    def take(self, b: int, now: float) -> int:
        """One access to b: the tier it was found in (3: nowhere), after which b is used at `now` and stored in
        HBM (the caller sets `future[b]` first for offline policies)."""
        if self.counting:
            self.count[b] = self.count.get(b, 0) + 1
        k = self.where.get(b, 3)
        if k == 0:
            self.caches[0].lookup(b)
        elif k < 3:
            self.caches[k].remove(b)
            del self.where[b]
        if self.dating:
            self.last[b] = now
        if k != 0:
            self.place(b, 0, None, now)
        return k

    def take_absent(self, keys: list, now: float) -> None:
        """`take` for each of `keys` (distinct, in no tier) when HBM is external: all it does then is count the
        access and date the use, done here in bulk (a prompt's ~1,000 keys an admission)."""
        assert self.hbm_external, "storing in HBM is the stack's own work unless HBM is external"
        if self.counting:
            count = self.count
            count.update(zip(keys, [c + 1 for c in map(count.get, keys, repeat(0))]))
        if self.dating:
            self.last.update(dict.fromkeys(keys, now))

    # --- what a serving replica asks ---------------------------------------------------------------------------
    def access(self, blocks, tokens, now: float):
        """Look a request's blocks up and store them: ([3] hit blocks, [3] hit tokens) per tier over the leading
        run (`tokens`: each block's tokens); every block ends in HBM, or where the rules put it."""
        self.expire(now)
        hits = np.zeros(3, np.int64)
        tok = np.zeros(3, np.int64)
        run = True
        for b, n in zip(blocks, tokens):
            k = self.take(b, now)
            if run and k < 3:
                hits[k] += 1
                tok[k] += int(n)
                if k:
                    self.move(k, 0)
            else:
                run = False
        return hits, tok

    def peek(self, blocks) -> int:
        """Leading blocks cached in any tier (no state change: what a prefix-aware router asks)."""
        n = 0
        for b in blocks:
            if b not in self.where:
                break
            n += 1
        return n

