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
        self.first: dict = {}  # key -> the first block of cached[key] (what a hit takes)
        self.head_q: OrderedDict[int, None] = OrderedDict()  # free blocks before the never-used ones
        self.fresh = 1  # next never-used block (block 0: vLLM's null block, popped at start and never freed)
        self.tail_q: OrderedDict[int, None] = OrderedDict()  # free blocks after the never-used ones (LRU order)
        self.evicted: list | None = None  # when a list: keys whose last cached block `take` reused, appended in order
        # (host tiers behind the pool read them: kvlab.serving.hosttiers)

    def free_count(self) -> int:
        return len(self.head_q) + (self.num_blocks - self.fresh) + len(self.tail_q)

    def hit(self, keys) -> list[int]:
        """Blocks cached for the longest run of leading keys."""
        if not self.caching:
            return []
        found = list(map(self.first.get, keys))  # None past the run of cached keys (block 0 is never cached)
        try:
            return found[:found.index(None)]
        except ValueError:
            return found

    def evictable(self, blocks) -> int:
        """How many of `blocks` (cache hits) sit in the free queue, so taking them uses free blocks (a block held
        by a request has a count of at least 1 in `ref`; a free one none)."""
        return len(blocks) - sum(map(self.ref.__contains__, blocks))

    def touch(self, blocks) -> None:
        ref, head_q, tail_q = self.ref, self.head_q, self.tail_q
        for b in blocks:
            c = ref.get(b)
            if c:
                ref[b] = c + 1
            else:
                if b in head_q:
                    del head_q[b]
                else:
                    del tail_q[b]
                ref[b] = 1

    def take(self, n: int) -> list[int]:
        """`n` free blocks in free-queue order (the head's, then never-used ones, then the tail's, least recently
        freed first), each dropping the hash it carried; held once each."""
        out = []
        head_q, ref = self.head_q, self.ref
        while n and head_q:
            out.append(head_q.popitem(last=False)[0])
            n -= 1
        m = min(n, self.num_blocks - self.fresh)
        if m > 0:  # never used: no hash to drop
            fresh = range(self.fresh, self.fresh + m)
            self.fresh += m
            n -= m
        else:
            fresh = ()
        tail_q = self.tail_q
        for _ in range(n):
            out.append(tail_q.popitem(last=False)[0])
        key, cached, first = self.key, self.cached, self.first
        for b in out:
            k = key.pop(b, None)
            if k is not None:
                bs = cached[k]
                del bs[b]
                if not bs:
                    del cached[k]
                    del first[k]
                    if self.evicted is not None:
                        self.evicted.append(k)
                elif first[k] == b:
                    first[k] = next(iter(bs))
            ref[b] = 1
        if fresh:
            ref.update(dict.fromkeys(fresh, 1))
            if len(out) == 0:
                return list(fresh)
            k = len(out) - n  # the head's blocks come before the never-used ones, the tail's after
            out[k:k] = fresh
        return out

    def cache(self, b: int, k) -> None:
        """Hash full block `b` under key `k` (another block of the same key stays cached beside it)."""
        if not self.caching or b in self.key:
            return
        self.key[b] = k
        if k in self.cached:
            self.cached[k][b] = None
        else:
            self.cached[k] = {b: None}
            self.first[k] = b

    def cache_many(self, blocks, keys) -> None:
        """`cache(b, k)` for each pair, in order."""
        if not self.caching:
            return
        key, cached, first = self.key, self.cached, self.first
        for b, k in zip(blocks, keys):
            if b in key:
                continue
            key[b] = k
            d = cached.get(k)
            if d is None:
                cached[k] = {b: None}
                first[k] = b
            else:
                d[b] = None

    def free(self, blocks) -> None:
        """Release one request's blocks, its last block first (vLLM frees in reverse, so the tail is evicted first):
        a block no longer held goes to the back of the free queue if it is hashed (LRU), to the front if not
        (vLLM reuses blocks that can never hit first: block_pool.py free_blocks)."""
        first = []
        ref, key, tail_q = self.ref, self.key, self.tail_q
        for b in reversed(blocks):
            c = ref[b] - 1
            if c == 0:
                del ref[b]
                if b in key:
                    tail_q[b] = None
                else:
                    first.append(b)
            else:
                ref[b] = c
        if first:
            head_q = self.head_q
            for b in reversed(first):
                head_q[b] = None
                head_q.move_to_end(b, last=False)
