"""A replica's prefix cache over HBM / DRAM / SSD: LRU in each tier, demotion on eviction, promotion on a hit,
a TTL on the host tiers. Blocks are the trace's hashed blocks (Mooncake: 512 tokens), whose ids name a block and
everything before it, so a request's hit is its leading run of cached blocks (vLLM's find_longest_cache_hit,
vllm/v1/core/kv_cache_manager.py get_computed_blocks)."""
from __future__ import annotations

import math
from collections import OrderedDict

import numpy as np


class TierCache:
    """LRU per tier (capacity in blocks); an HBM eviction moves the block to DRAM, a DRAM one to SSD."""

    def __init__(self, capacity_blocks, block_bytes: int, ttl_s: float = math.inf):
        self.cap = tuple(int(c) for c in capacity_blocks)  # blocks per tier: HBM, DRAM, SSD
        self.block_bytes = int(block_bytes)  # bytes of one block
        self.ttl_s = float(ttl_s)  # host (DRAM / SSD) copies expire this long after their last use
        self.tiers = [OrderedDict(), OrderedDict(), OrderedDict()]  # block id -> last use time, LRU first
        self.moved = {"hbm->dram": 0, "dram->ssd": 0, "dram->hbm": 0, "ssd->hbm": 0}  # bytes moved between tiers

    def _where(self, b: int, now: float) -> int:
        for k, t in enumerate(self.tiers):
            if b in t:
                if k and now - t[b] > self.ttl_s:  # expired host copy
                    del t[b]
                    return 3
                return k
        return 3

    def peek(self, blocks) -> int:
        """Leading blocks cached in any tier (no state change: what a prefix-aware router asks)."""
        n = 0
        for b in blocks:
            if not any(b in t for t in self.tiers):
                break
            n += 1
        return n

    def hbm_overlap(self, blocks) -> int:
        n = 0
        h = self.tiers[0]
        for b in blocks:
            if b not in h:
                break
            n += 1
        return n

    def _put(self, k: int, b: int, now: float) -> None:
        while k < 3:
            t = self.tiers[k]
            t[b] = now
            t.move_to_end(b)
            if len(t) <= self.cap[k]:
                return
            b, now = t.popitem(last=False)  # demote the LRU block (it keeps its last-use time)
            k += 1
            if k < 3 and self.cap[k] > 0:
                self.moved["hbm->dram" if k == 1 else "dram->ssd"] += self.block_bytes
            elif k < 3:
                k = 3  # no room below: dropped

    def access(self, blocks, tokens, now: float):
        """Look a request's blocks up and store them: ([3] hit blocks, [3] hit tokens) per tier over the leading
        run (`tokens`: each block's tokens); every block ends in HBM (hits promoted, misses computed here)."""
        hits = np.zeros(3, np.int64)
        tok = np.zeros(3, np.int64)
        run = True
        for b, n in zip(blocks, tokens):
            k = self._where(b, now)
            if run and k < 3:
                hits[k] += 1
                tok[k] += int(n)
                if k:
                    self.moved["dram->hbm" if k == 1 else "ssd->hbm"] += self.block_bytes
            else:
                run = False
            if k < 3:
                del self.tiers[k][b]
            self._put(0, b, now)
        return hits, tok
