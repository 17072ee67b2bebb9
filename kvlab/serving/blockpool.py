"""vLLM's paged KV pool with prefix caching: reference-counted blocks, the prefix cache as the pool's free-but-hashed
blocks, evicted least recently freed first.

Rules follow vllm/v1/core/block_pool.py (vLLM 0.33): block 0 is the null block and never handed out; free blocks sit
in one queue, a freed hashed block joins its tail (an unhashed one its head), a new block is taken from its head
(dropping the hash it carried); a full block of a request is hashed with its prefix and a later request whose
block has the same key takes the same block (its reference count rises, it leaves the free queue if it sat there);
a block whose count falls to zero joins the free queue but keeps its hash until it is taken again. A key whose last
cached block is taken anew is recorded in `evicted` when host tiers listen (kvlab.serving.hosttiers).
"""
from __future__ import annotations

from collections import Counter, OrderedDict, deque
from itertools import compress, repeat
from operator import not_, sub


class BlockPool:
    """Blocks of one replica's KV pool. The free queue is kept in three parts so that a pool of millions of blocks
    costs nothing until it is used: blocks put back at the head (unhashed), the never-used blocks (a range, in
    order), blocks put back at the tail (hashed); state is kept only for blocks that were handed out. A request
    takes, hashes and frees hundreds of blocks at once, so each of those is done with bulk dict operations over
    the whole run, one Python step per block only where blocks are shared or a key has several blocks."""

    SLACK = 4096  # stale tail entries kept beyond as many as live ones before the tail is compacted

    def __init__(self, num_blocks: int, caching: bool = True):
        self.num_blocks = num_blocks  # blocks in the pool, the null block included
        self.caching = caching  # prefix caching on
        self.ref: dict[int, int] = {}  # requests holding each block handed out (absent: 0)
        self.key: dict = {}  # hash key of a full cached block (absent: not cached)
        self.first: dict = {}  # key -> the first block cached under it (what a hit takes)
        self.more: dict = {}  # key -> {block: None}: its other cached blocks, first cached first (absent: none)
        self.head_q: OrderedDict[int, None] = OrderedDict()  # free blocks before the never-used ones
        self.fresh = 1  # next never-used block (block 0: vLLM's null block, popped at start and never freed)
        # free blocks after the never-used ones, least recently freed first, kept as the batches `free` put there
        # (a request's blocks at once): a block taken back by a hit is only dropped from `tail_at`, and its entry
        # in its batch skipped when the queue reaches it (or dropped when stale entries outnumber live ones)
        self.tail_at: dict[int, int] = {}  # block in the tail -> the batch it was freed in
        self.tail: deque = deque()  # [batch number, blocks, place of the first not passed yet], oldest first
        self.batches = 0  # batches put in the tail so far
        self.live: dict[int, int] = {}  # batch -> its blocks still in the tail (absent once passed)
        self.entries = 0  # entries of `tail` not passed yet, stale ones included
        self.evicted: list | None = None  # when a list: keys whose last cached block `take` reused, appended in order
        # (host tiers behind the pool read them: kvlab.serving.hosttiers)

    @property
    def cached(self) -> dict:
        """key -> [blocks cached under it], first cached first (vLLM keeps every block of a key)."""
        return {k: [b, *self.more.get(k, ())] for k, b in self.first.items()}

    def free_count(self) -> int:
        return len(self.head_q) + (self.num_blocks - self.fresh) + len(self.tail_at)

    def tail_blocks(self) -> list[int]:
        """The free blocks after the never-used ones, in free-queue order."""
        at = self.tail_at
        live = self.live
        return [b for i, bl, pos in self.tail if live[i] for b in bl[pos:] if at.get(b) == i]

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
        """Hold each of `blocks` (cache hits) once more; a free one leaves the free queue."""
        ref = self.ref
        counts = list(map(ref.get, blocks, repeat(0)))
        ref.update(zip(blocks, [c + 1 for c in counts]))
        if 0 in counts:
            idle = list(compress(blocks, [c == 0 for c in counts]))
            gone = list(map(self.tail_at.pop, idle, repeat(-1)))  # -1: not in the tail
            live = self.live
            for i, c in Counter(gone).items():
                if i >= 0:
                    live[i] -= c
            if -1 in gone:
                for b, g in zip(idle, gone):
                    if g == -1:
                        del self.head_q[b]

    def take(self, n: int) -> list[int]:
        """`n` free blocks in free-queue order (the head's, then never-used ones, then the tail's, least recently
        freed first), each dropping the hash it carried; held once each."""
        if n == 1:  # a decode crossing a block boundary: the common case, done directly
            return [self._take_one()]
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
        if n:
            out += self._take_tail(n)
        if out:
            self._unhash(out)
            ref.update(dict.fromkeys(out, 1))
        if fresh:
            ref.update(dict.fromkeys(fresh, 1))
            if len(out) == 0:
                return list(fresh)
            k = len(out) - n  # the head's blocks come before the never-used ones, the tail's after
            out[k:k] = fresh
        return out

    def _take_one(self) -> int:
        """`take(1)`'s block."""
        if self.head_q:
            b = self.head_q.popitem(last=False)[0]
        elif self.fresh < self.num_blocks:
            b = self.fresh
            self.fresh += 1
            self.ref[b] = 1
            return b
        else:
            b = self._take_tail(1)[0]
        k = self.key.pop(b, None)
        if k is not None:
            if k in self.more:
                self._unhash_slow([b], [k])
            else:
                del self.first[k]
                if self.evicted is not None:
                    self.evicted.append(k)
        self.ref[b] = 1
        return b

    def _take_tail(self, n: int) -> list[int]:
        """The first `n` blocks of the tail, taken out of it."""
        at, tail, live = self.tail_at, self.tail, self.live
        out = []
        while n:
            batch = tail[0]
            i, bl, pos = batch
            if not live[i]:  # every block of it was hit since: pass it whole
                self.entries -= len(bl) - pos
                tail.popleft()
                del live[i]
                continue
            end = min(pos + n, len(bl))
            got = [b for b in bl[pos:end] if at.get(b) == i]  # live (a block hit since, or freed again, is not)
            self.entries -= end - pos
            live[i] -= len(got)
            if end == len(bl):
                tail.popleft()
                del live[i]
            else:
                batch[2] = end
            out += got
            n -= len(got)
        list(map(at.pop, out))
        return out

    def _compact(self) -> None:
        """One batch of the tail's live blocks, in order, when stale entries outnumber them."""
        live = self.tail_blocks()
        self.tail_at = dict.fromkeys(live, self.batches)
        self.tail = deque([[self.batches, live, 0]])
        self.live = {self.batches: len(live)}
        self.batches += 1
        self.entries = len(live)

    def _unhash(self, blocks) -> None:
        """Drop the hash each of `blocks` carries (a block taken anew), keeping its key's other blocks cached."""
        ks = list(map(self.key.pop, blocks, repeat(None)))
        first, more = self.first, self.more
        if not more:  # every key has one block: drop them all at once
            gone = [k for k in ks if k is not None]
            list(map(first.pop, gone))
            if self.evicted is not None:
                self.evicted += gone
        else:
            self._unhash_slow(blocks, ks)

    def _unhash_slow(self, blocks, ks) -> None:
        """`_unhash` one block at a time (`ks`: the keys they carried, None: none), where a key has several."""
        first, more = self.first, self.more
        for b, k in zip(blocks, ks):
            if k is None:
                continue
            bs = more.get(k)
            if bs is None:
                del first[k]
                if self.evicted is not None:
                    self.evicted.append(k)
            elif first[k] == b:
                first[k] = next(iter(bs))
                del bs[first[k]]
                if not bs:
                    del more[k]
            else:
                del bs[b]
                if not bs:
                    del more[k]

    def cache(self, b: int, k) -> None:
        """Hash full block `b` under key `k` (another block of the same key stays cached beside it)."""
        self.cache_many([b], [k])

    def cache_many(self, blocks, keys) -> None:
        """`cache(b, k)` for each pair, in order (a block hashed already keeps its hash)."""
        if not self.caching or not blocks:
            return
        key, first = self.key, self.first
        if len(blocks) == 1:  # a decode filling a block: the common case, done directly
            b = blocks[0]
            if b not in key:
                k = keys[0]
                key[b] = k
                if k in first:
                    self.more.setdefault(k, {})[b] = None
                else:
                    first[k] = b
            return
        known = list(map(key.__contains__, blocks))
        if True in known:  # hits at the front are hashed already
            if all(known):
                return
            j = known.index(False)
            if True in known[j:]:
                pairs = [(b, k) for b, k, kn in zip(blocks, keys, known) if not kn]
                blocks, keys = [b for b, _ in pairs], [k for _, k in pairs]
            else:
                blocks, keys = blocks[j:], keys[j:]
        keys = list(keys)
        if True not in map(first.__contains__, keys) and len(set(keys)) == len(keys):
            first.update(zip(keys, blocks))  # every key new and distinct: each block is its key's first
            key.update(zip(blocks, keys))
            return
        more = self.more
        for b, k in zip(blocks, keys):
            key[b] = k
            if k in first:
                d = more.get(k)
                if d is None:
                    more[k] = {b: None}
                else:
                    d[b] = None
            else:
                first[k] = b

    def free(self, blocks) -> None:
        """Release one request's blocks, its last block first (vLLM frees in reverse, so the tail is evicted first):
        a block no longer held goes to the back of the free queue if it is hashed (LRU), to the front if not
        (vLLM reuses blocks that can never hit first: block_pool.py free_blocks)."""
        ref, key = self.ref, self.key
        rev = blocks[::-1]
        counts = list(map(ref.pop, rev))
        if max(counts, default=1) > 1:  # shared blocks stay held by the others
            left = list(map(sub, counts, repeat(1)))
            ref.update(compress(zip(rev, left), left))
            rev = list(compress(rev, map(not_, left)))
        hashed = list(map(key.__contains__, rev))
        if False not in hashed:
            self._to_tail(rev)
            return
        self._to_tail(list(compress(rev, hashed)))
        first = list(compress(rev, [not h for h in hashed]))
        head_q = self.head_q
        for b in reversed(first):
            head_q[b] = None
            head_q.move_to_end(b, last=False)

    def _to_tail(self, blocks: list) -> None:
        """Put `blocks` (no longer held, hashed) at the back of the free queue, in order."""
        if not blocks:
            return
        self.tail_at.update(dict.fromkeys(blocks, self.batches))
        self.tail.append([self.batches, blocks, 0])
        self.live[self.batches] = len(blocks)
        self.batches += 1
        self.entries += len(blocks)
        if self.entries > 2 * len(self.tail_at) + self.SLACK:
            self._compact()
