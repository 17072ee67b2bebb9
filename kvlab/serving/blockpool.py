"""vLLM's paged KV pool with prefix caching: reference-counted blocks, the prefix cache as the pool's free-but-hashed
blocks, evicted least recently freed first.

Rules follow vllm/v1/core/block_pool.py (vLLM 0.33): block 0 is the null block and never handed out; free blocks sit
in one queue, a freed hashed block joins its tail (an unhashed one its head), a new block is taken from its head (dropping the hash it carried); a
full block of a request is hashed with its prefix and a later request whose block has the same key takes the same
block (its reference count rises, it leaves the free queue if it sat there); a block whose count falls to zero joins
the free queue but keeps its hash until it is taken again.
"""
from __future__ import annotations

from collections import OrderedDict


class BlockPool:
    """Blocks of one replica's KV pool."""

    def __init__(self, num_blocks: int, caching: bool = True):
        self.num_blocks = num_blocks  # blocks in the pool, the null block included
        self.caching = caching  # prefix caching on
        self.ref = [0] * num_blocks  # requests holding each block
        self.key = [None] * num_blocks  # hash key of a full cached block (None: not cached)
        self.cached: dict = {}  # key -> {block: None}, first cached first (vLLM keeps every block of a key)
        self.free_q: OrderedDict[int, None] = OrderedDict((b, None) for b in range(1, num_blocks))  # LRU order
        # block 0: vLLM's null block (block_pool.py: popped from the free queue at start, never freed)

    def free_count(self) -> int:
        return len(self.free_q)

    def hit(self, keys) -> list[int]:
        """Blocks cached for the longest run of leading keys."""
        out = []
        if not self.caching:
            return out
        for k in keys:
            bs = self.cached.get(k)
            if not bs:
                break
            out.append(next(iter(bs)))
        return out

    def evictable(self, blocks) -> int:
        """How many of `blocks` (cache hits) sit in the free queue, so taking them uses free blocks."""
        return sum(1 for b in blocks if self.ref[b] == 0)

    def touch(self, blocks) -> None:
        for b in blocks:
            if self.ref[b] == 0:
                del self.free_q[b]
            self.ref[b] += 1

    def take(self, n: int) -> list[int]:
        out = []
        for _ in range(n):
            b, _ = self.free_q.popitem(last=False)
            k = self.key[b]
            if k is not None:
                bs = self.cached[k]
                del bs[b]
                if not bs:
                    del self.cached[k]
                self.key[b] = None
            self.ref[b] = 1
            out.append(b)
        return out

    def cache(self, b: int, k) -> None:
        """Hash full block `b` under key `k` (another block of the same key stays cached beside it)."""
        if not self.caching or self.key[b] is not None:
            return
        self.key[b] = k
        self.cached.setdefault(k, {})[b] = None

    def free(self, blocks) -> None:
        """Release one request's blocks, its last block first (vLLM frees in reverse, so the tail is evicted first):
        a block no longer held goes to the back of the free queue if it is hashed (LRU), to the front if not
        (vLLM reuses blocks that can never hit first: block_pool.py free_blocks)."""
        first = []
        for b in reversed(blocks):
            self.ref[b] -= 1
            if self.ref[b] == 0:
                if self.key[b] is None:
                    first.append(b)
                else:
                    self.free_q[b] = None
        for b in reversed(first):
            self.free_q[b] = None
            self.free_q.move_to_end(b, last=False)
