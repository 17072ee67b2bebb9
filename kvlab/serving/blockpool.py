"""vLLM's paged KV pool with prefix caching: reference-counted blocks, the prefix cache as the pool's free-but-hashed
blocks, evicted least recently freed first.

Rules follow vllm/v1/core/block_pool.py (vLLM 0.33): block 0 is the null block and never handed out; free blocks sit
in one queue, a freed hashed block joins its tail (an unhashed one its head), a new block is taken from its head
(dropping the hash it carried); a full block of a request is hashed with its prefix and a later request whose block has the same key takes the same
block (its reference count rises, it leaves the free queue if it sat there); a block whose count falls to zero joins
the free queue but keeps its hash until it is taken again.
"""
from __future__ import annotations

from collections import OrderedDict


class BlockPool:
    """Blocks of one replica's KV pool. The free queue is kept in three parts so that a pool of millions of blocks
    costs nothing until it is used: blocks put back at the head (unhashed), the never-used blocks (a range, in
    order), blocks put back at the tail (hashed); state is kept only for blocks that were handed out."""

    def __init__(self, num_blocks: int, caching: bool = True):
        self.num_blocks = num_blocks  # blocks in the pool, the null block included
        self.caching = caching  # prefix caching on
        self.ref: dict[int, int] = {}  # requests holding each block handed out (absent: 0)
        self.key: dict = {}  # hash key of a full cached block (absent: not cached)
        self.cached: dict = {}  # key -> {block: None}, first cached first (vLLM keeps every block of a key)
        self.head_q: OrderedDict[int, None] = OrderedDict()  # free blocks before the never-used ones
        self.fresh = 1  # next never-used block (block 0: vLLM's null block, popped at start and never freed)
        self.tail_q: OrderedDict[int, None] = OrderedDict()  # free blocks after the never-used ones (LRU order)

    def free_count(self) -> int:
        return len(self.head_q) + (self.num_blocks - self.fresh) + len(self.tail_q)

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
        ref = self.ref
        return sum(1 for b in blocks if not ref.get(b))

    def touch(self, blocks) -> None:
        ref = self.ref
        for b in blocks:
            if not ref.get(b):
                if b in self.head_q:
                    del self.head_q[b]
                else:
                    del self.tail_q[b]
                ref[b] = 1
            else:
                ref[b] += 1

    def _pop(self) -> int:
        if self.head_q:
            return self.head_q.popitem(last=False)[0]
        if self.fresh < self.num_blocks:
            self.fresh += 1
            return self.fresh - 1
        return self.tail_q.popitem(last=False)[0]

    def take(self, n: int) -> list[int]:
        out = []
        for _ in range(n):
            b = self._pop()
            k = self.key.pop(b, None)
            if k is not None:
                bs = self.cached[k]
                del bs[b]
                if not bs:
                    del self.cached[k]
            self.ref[b] = 1
            out.append(b)
        return out

    def cache(self, b: int, k) -> None:
        """Hash full block `b` under key `k` (another block of the same key stays cached beside it)."""
        if not self.caching or b in self.key:
            return
        self.key[b] = k
        self.cached.setdefault(k, {})[b] = None

    def free(self, blocks) -> None:
        """Release one request's blocks, its last block first (vLLM frees in reverse, so the tail is evicted first):
        a block no longer held goes to the back of the free queue if it is hashed (LRU), to the front if not
        (vLLM reuses blocks that can never hit first: block_pool.py free_blocks)."""
        first = []
        ref = self.ref
        for b in reversed(blocks):
            c = ref[b] - 1
            if c == 0:
                del ref[b]
                if b in self.key:
                    self.tail_q[b] = None
                else:
                    first.append(b)
            else:
                ref[b] = c
        for b in reversed(first):
            self.head_q[b] = None
            self.head_q.move_to_end(b, last=False)
