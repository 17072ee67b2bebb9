"""Host tiers (DRAM, SSD) behind a vLLM replica's KV pool: kvlab's one tier stack (kvlab.sim.tierstack.TierStack)
with its HBM tier outside it, because the pool is the HBM tier (its free-but-hashed blocks are the HBM prefix cache,
kvlab.serving.blockpool).

The rule followed is the tier stack's (exclusive tiers, demote on evict), not vLLM's write-through:
  evict     when the pool reuses a free hashed block and no other block of the pool carries its key, the key leaves
            HBM and is placed in DRAM (else SSD), under that tier's policy, admission rule and TTL, its victims
            sinking to SSD and then dropped (TierStack.place from HBM).
  lookup    a request taken from the waiting queue with nothing computed hits its leading run of full blocks in the
            pool (vLLM's get_computed_blocks), then continues the run in DRAM / SSD; the continued blocks are loaded
            into new pool blocks and count as computed tokens (vLLM's connector reports them as external computed
            tokens: get_num_new_matched_tokens, OffloadingConnectorScheduler,
            vllm/distributed/kv_transfer/kv_connector/v1/offloading/scheduler.py), priced at the tier's read
            bandwidth and added to the step that admits the request.
  access    admission counts every full prompt block of the request as one access (TierStack.take: a block found
            in a host tier leaves it for the pool), so the admission rule ("second": stored from the second access)
            and the TTL (since the last access) read the same counts `kvlab simulate` keeps; a key the pool hashes
            while a stale host copy exists drops that copy (one copy per key).
What vLLM does instead (for reference): its OffloadingConnector writes each block to the CPU tier once it is
computed (a copy beside the GPU's; `_get_reqs_to_store` in the file above), touches a request's offloaded blocks
on every lookup, stores only blocks seen `store_threshold` times, and loads hits asynchronously (the request waits
in WAITING_FOR_REMOTE_KVS while others run). kvlab keeps one copy per block so that HBM and DRAM add up, as in
`kvlab simulate`, and charges the load to the admitting step. Output blocks (keys unique to their request) are not
kept in host tiers: only a preempted request could hit them.
"""
from __future__ import annotations

from itertools import compress
from operator import not_

import numpy as np

from ..sim.tierstack import TierStack


class HostTiers:
    """DRAM and SSD of one replica, keyed by the scheduler's block keys (kvlab.serving.replica.prompt_keys)."""

    def __init__(self, dram_blocks: int, ssd_blocks: int, block_bytes: int, read_bytes_per_s, ttl_s: float,
                 policy="lru", admission="all"):
        self.stack = TierStack((0, dram_blocks, ssd_blocks), block_bytes, ttl_s, policy, admission,
                               hbm_external=True)  # the tier stack, HBM held by the pool
        self.read_s = tuple(block_bytes / bw for bw in read_bytes_per_s)  # seconds to load one block, per tier
        self.now = 0.0  # time of the step being scheduled

    @property
    def moved(self) -> dict:
        return self.stack.moved

    def run(self, keys) -> int:
        """How many leading `keys` sit in DRAM or SSD (no state change; expired DRAM blocks first leave)."""
        st = self.stack
        st.expire(self.now)
        where = st.where
        n = 0
        for k in keys:
            if k not in where:
                break
            n += 1
        return n

    def admit(self, keys, start: int, run: int) -> list[int]:
        """A request admitted: each of its prompt block `keys` ([K] ints or an int64 array) accessed once, in
        order; keys[:start] hit in the pool, keys[start:start + run] were found in host tiers (`run`) and are loaded.
        Returns [blocks loaded from DRAM, from SSD]. A key the pool holds has no host copy (the pool's hash drops
        it, `hashed`), so without per-block history to keep only keys[start:] are looked up."""
        st = self.stack
        history = st.history
        if not history:
            keys = keys[start:]
            run_at = 0  # where the loaded run starts in `keys`
        else:
            run_at = start
        keys = keys.tolist() if isinstance(keys, np.ndarray) else list(keys)
        got = [0, 0]
        take, now = st.take, self.now
        if history and len(set(keys)) < len(keys):  # a key twice (a trace may repeat a block id): one access at
            held = [True] * len(keys)  # a time, each counted
        else:
            held = list(map(st.where.__contains__, keys))  # in DRAM / SSD: taken out one by one, in order
        if True in held:
            for i in compress(range(len(keys)), held):
                t = take(keys[i], now)
                if run_at <= i < run_at + run and t < 3:  # (t == 3: a key repeated in the run, taken already)
                    got[t - 1] += 1
                    st.move(t, 0)
            keys = list(compress(keys, map(not_, held)))
        if history:
            st.take_absent(keys, now)  # the rest are in no host tier
        return got

    def evicted(self, keys) -> None:
        """The pool dropped these keys (their last block reused): each moves to DRAM, or the next tier."""
        # prompt blocks (keys >= 0), each accessed through `admit` when its request was; output blocks (keys < 0)
        # never are
        self.stack.place_many(list(compress(keys, map((0).__le__, keys))), 1, 0, self.now)

    def hashed(self, keys) -> None:
        """The pool hashed these keys: a host copy of any of them is stale and dropped."""
        st = self.stack
        where = st.where
        for k in compress(keys, map(where.__contains__, keys)):  # most keys have no host copy: passed in C
            t = where.pop(k, None)  # None: a key repeated in `keys`, dropped already
            if t is not None:
                st.caches[t].remove(k)

    def load_s(self, blocks) -> float:
        """Seconds to load [DRAM, SSD] blocks into HBM."""
        return blocks[0] * self.read_s[1] + blocks[1] * self.read_s[2]
