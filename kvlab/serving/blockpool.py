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

from collections import OrderedDict, deque

import numpy as np

from .keytable import KeyTable

NONE = np.zeros(0, np.int64)  # no blocks


class BlockPool:
    """Blocks of one replica's KV pool. The free queue is kept in three parts: blocks put back at the head
    (unhashed), the never-used blocks (a range, in order), blocks put back at the tail (hashed). A request takes,
    hashes and frees hundreds of blocks at once, so per-block state (reference count, hash, place in the tail) lives
    in arrays indexed by block and each of those is one vectorized operation over the run; each key's first cached
    block is found in a numpy hash table (prompt keys) or a dict (output keys), and one Python step per block is
    taken only where a key has several blocks. Block ids in and
    out are Python ints; keys are ints that fit in 64 bits (kvlab.serving.replica.prompt_keys,
    kvlab.serving.scheduler.output_key)."""

    SLACK = 4096  # stale tail entries kept beyond as many as live ones before the tail is compacted

    def __init__(self, num_blocks: int, caching: bool = True):
        self.num_blocks = num_blocks  # blocks in the pool, the null block included
        self.caching = caching  # prefix caching on
        # per-block state (zeroed arrays cost no memory until blocks are used)
        self.refs = np.zeros(num_blocks, np.int32)  # [N] requests holding each block
        self.hashed = np.zeros(num_blocks, bool)  # [N] block carries a key
        self.keys = np.zeros(num_blocks, np.int64)  # [N] its key, where hashed
        self.at = np.zeros(num_blocks, np.int64)  # [N] batch of the tail the block sits in (0: not in the tail)
        # key -> the first block cached under it (what a hit takes): prompt keys (>= 0, a thousand a request, looked
        # up in bulk) in a numpy hash table, output keys (< 0, one per decode block) in a dict
        self.table = KeyTable()  # prompt keys (grows with them)
        self.out_first: dict = {}  # output keys
        self.more: dict = {}  # key -> {block: None}: its other cached blocks, first cached first (absent: none)
        self.head_q: OrderedDict[int, None] = OrderedDict()  # free blocks before the never-used ones
        self.fresh = 1  # next never-used block (block 0: vLLM's null block, popped at start and never freed)
        # free blocks after the never-used ones, least recently freed first, kept as the batches `free` put there
        # (a request's blocks at once): a block taken back by a hit only has its `at` cleared, and its entry in its
        # batch is skipped when the queue reaches it (or dropped when stale entries outnumber live ones)
        self.tail: deque = deque()  # [batch number, blocks [n], place of the first not passed yet], oldest first
        self.batches = 1  # number of the next batch put in the tail
        self.live: dict[int, int] = {}  # batch -> its blocks still in the tail (absent once passed)
        self.in_tail = 0  # blocks in the tail
        self.entries = 0  # entries of `tail` not passed yet, stale ones included
        self.evicted: list | None = None  # when a list: keys whose last cached block `take` reused, appended in order
        # (host tiers behind the pool read them: kvlab.serving.hosttiers)

    # -- views (tests and inspection) ----------------------------------------------------------------------------
    @property
    def ref(self) -> dict:
        """block -> requests holding it, for blocks held."""
        b = np.flatnonzero(self.refs)
        return dict(zip(b.tolist(), self.refs[b].tolist()))

    @property
    def key(self) -> dict:
        """block -> the key it carries, for hashed blocks."""
        b = np.flatnonzero(self.hashed)
        return dict(zip(b.tolist(), self.keys[b].tolist()))

    @property
    def first(self) -> dict:
        """key -> the first block cached under it."""
        return {**dict(self.table.items()), **self.out_first}

    @property
    def cached(self) -> dict:
        """key -> [blocks cached under it], first cached first (vLLM keeps every block of a key)."""
        return {k: [b, *self.more.get(k, ())] for k, b in self.first.items()}

    # -- one key (Python ints) ------------------------------------------------------------------------------------
    def has_key(self, k: int) -> bool:
        """Whether some block is cached under key k."""
        return k in (self.table if k >= 0 else self.out_first)

    def _first_of(self, k: int) -> int:
        return self.table[k] if k >= 0 else self.out_first[k]

    def _set_first(self, k: int, b: int) -> None:
        if k >= 0:
            self.table[k] = b
        else:
            self.out_first[k] = b

    def _drop_key(self, k: int) -> None:
        if k >= 0:
            del self.table[k]
        else:
            del self.out_first[k]

    def free_count(self) -> int:
        return len(self.head_q) + (self.num_blocks - self.fresh) + self.in_tail

    def _tail_array(self) -> np.ndarray:
        """The free blocks after the never-used ones, in free-queue order."""
        at, live = self.at, self.live
        parts = []
        for i, bl, pos in self.tail:
            if live[i]:
                seg = bl[pos:]
                parts.append(seg[at[seg] == i])
        return np.concatenate(parts) if parts else NONE

    def tail_blocks(self) -> list[int]:
        """The free blocks after the never-used ones, in free-queue order."""
        return self._tail_array().tolist()

    # -- hits -------------------------------------------------------------------------------------------------------
    def hit(self, keys) -> np.ndarray:
        """Blocks cached for the longest run of leading keys ([n] int64)."""
        ks = np.asarray(keys, np.int64)  # [K]
        if not self.caching or not len(ks):
            return NONE
        prompt = ks >= 0
        found = np.full(len(ks), -1, np.int64)  # [K] -1 where not cached
        found[prompt] = self.table.get_many(ks[prompt])
        if not prompt.all():
            out = np.flatnonzero(~prompt)
            found[out] = [self.out_first.get(k, -1) for k in ks[out].tolist()]
        gap = np.flatnonzero(found < 0)  # block 0 is never cached
        return found[:gap[0]] if len(gap) else found

    def evictable(self, blocks) -> int:
        """How many of `blocks` (cache hits) sit in the free queue, so taking them uses free blocks."""
        return len(blocks) - int(np.count_nonzero(self.refs[np.asarray(blocks, np.int64)]))

    def touch(self, blocks) -> None:
        """Hold each of `blocks` (cache hits, distinct) once more; a free one leaves the free queue."""
        b = np.asarray(blocks, np.int64)  # [n]
        refs = self.refs
        counts = refs[b]
        refs[b] = counts + 1
        idle = b[counts == 0]  # free until now: in the tail, or (unhashed since) at the head
        if not len(idle):
            return
        at = self.at
        gone = at[idle]
        inq = gone > 0
        if inq.any():
            at[idle[inq]] = 0
            batches, n = np.unique(gone[inq], return_counts=True)
            live = self.live
            for i, c in zip(batches.tolist(), n.tolist()):
                live[i] -= c
            self.in_tail -= int(n.sum())
        if not inq.all():
            for x in idle[~inq].tolist():
                del self.head_q[x]

    # -- taking ---------------------------------------------------------------------------------------------------
    def take(self, n: int) -> list[int]:
        """`n` free blocks in free-queue order (the head's, then never-used ones, then the tail's, least recently
        freed first), each dropping the hash it carried; held once each."""
        if n == 1:  # a decode crossing a block boundary: the common case, done directly
            return [self._take_one()]
        head = []
        head_q = self.head_q
        while n and head_q:
            head.append(head_q.popitem(last=False)[0])
            n -= 1
        m = max(min(n, self.num_blocks - self.fresh), 0)
        lo = self.fresh
        self.fresh += m
        n -= m
        self.refs[lo:lo + m] = 1  # never used: no hash to drop
        tail = self._take_tail(n) if n else NONE
        out = head + list(range(lo, lo + m))
        if head:
            h = np.array(head, np.int64)
            self._unhash(h)
            self.refs[h] = 1
        if len(tail):
            self._unhash(tail)
            self.refs[tail] = 1
            out += tail.tolist()
        return out

    def _take_one(self) -> int:
        """`take(1)`'s block."""
        if self.head_q:
            b = self.head_q.popitem(last=False)[0]
        elif self.fresh < self.num_blocks:
            b = self.fresh
            self.fresh += 1
            self.refs[b] = 1
            return b
        else:
            b = self._pop_tail()
        if self.hashed[b]:
            self.hashed[b] = False
            self._drop_slow([b], [int(self.keys[b])])
        self.refs[b] = 1
        return b

    def _pop_tail(self) -> int:
        """The tail's first block, taken out of it (`_take_tail(1)` without array overhead)."""
        at, tail, live = self.at, self.tail, self.live
        while True:
            batch = tail[0]
            i, bl, pos = batch
            if live[i]:
                break
            self.entries -= len(bl) - pos  # every block of it was hit since: pass it whole
            tail.popleft()
            del live[i]
        start = pos
        b = bl.item(pos)
        while at.item(b) != i:  # a stale entry (hit since, or freed again)
            pos += 1
            b = bl.item(pos)
        pos += 1
        self.entries -= pos - start
        live[i] -= 1
        if pos == len(bl):
            tail.popleft()
            del live[i]
        else:
            batch[2] = pos
        at[b] = 0
        self.in_tail -= 1
        return b

    def _take_tail(self, n: int) -> np.ndarray:
        """The first `n` blocks of the tail, taken out of it."""
        at, tail, live = self.at, self.tail, self.live
        out = []
        while n:
            batch = tail[0]
            i, bl, pos = batch
            if not live[i]:  # every block of it was hit since: pass it whole
                self.entries -= len(bl) - pos
                tail.popleft()
                del live[i]
                continue
            if live[i] <= n:  # the whole batch
                seg = bl[pos:]
                got = seg[at[seg] == i]  # live (a block hit since, or freed again, is not)
                self.entries -= len(seg)
                tail.popleft()
                del live[i]
            else:  # its first n live blocks: look through a window of entries that likely holds them
                seg = bl[pos:pos + 2 * n + 32]
                idx = np.flatnonzero(at[seg] == i)[:n]
                got = seg[idx]
                end = int(idx[-1]) + 1 if len(idx) == n else len(seg)
                self.entries -= end
                batch[2] = pos + end
                live[i] -= len(got)
            out.append(got)
            n -= len(got)
        got = out[0] if len(out) == 1 else np.concatenate(out)
        at[got] = 0
        self.in_tail -= len(got)
        return got

    def _compact(self) -> None:
        """One batch of the tail's live blocks, in order, when stale entries outnumber them."""
        live = self._tail_array()
        self.at[live] = self.batches
        self.tail = deque([[self.batches, live, 0]])
        self.live = {self.batches: len(live)}
        self.batches += 1
        self.entries = len(live)

    def _unhash(self, blocks: np.ndarray) -> None:
        """Drop the hash each of `blocks` carries (blocks taken anew), keeping its key's other blocks cached."""
        h = self.hashed[blocks]
        if not h.any():
            return
        b = blocks[h]
        self.hashed[b] = False
        ks = self.keys[b]  # [m]
        if not self.more:  # every key has one block: drop them all at once
            prompt = ks >= 0
            self.table.remove_many(ks[prompt])
            list(map(self.out_first.pop, ks[~prompt].tolist()))
            if self.evicted is not None:
                self.evicted += ks.tolist()
        else:
            self._drop_slow(b.tolist(), ks.tolist())

    def _drop_slow(self, blocks, ks) -> None:
        """Drop block b from key k's cached blocks for each pair, one at a time (a key's last block gone: the key
        is evicted)."""
        more = self.more
        for b, k in zip(blocks, ks):
            bs = more.get(k)
            if bs is None:
                self._drop_key(k)
                if self.evicted is not None:
                    self.evicted.append(k)
            elif self._first_of(k) == b:
                nb = next(iter(bs))
                self._set_first(k, nb)
                del bs[nb]
                if not bs:
                    del more[k]
            else:
                del bs[b]
                if not bs:
                    del more[k]

    # -- hashing --------------------------------------------------------------------------------------------------
    def cache(self, b: int, k) -> None:
        """Hash full block `b` under key `k` (another block of the same key stays cached beside it)."""
        self.cache_many([b], [k])

    def cache_many(self, blocks, keys) -> None:
        """`cache(b, k)` for each pair, in order (a block hashed already keeps its hash)."""
        if not self.caching or not blocks:
            return
        if len(blocks) == 1:  # a decode filling a block: the common case, done directly
            b = int(blocks[0])
            if not self.hashed[b]:
                k = int(keys[0])
                self.hashed[b] = True
                self.keys[b] = k
                self._join(b, k)
            return
        if len(blocks) != len(keys):  # pairs, as zip makes them
            n = min(len(blocks), len(keys))
            blocks, keys = blocks[:n], keys[:n]
        arr = np.asarray(blocks, np.int64)  # [n]
        ks = np.asarray(keys, np.int64)  # [n]
        known = self.hashed[arr]
        if known.any():  # hits at the front are hashed already
            if known.all():
                return
            new = ~known
            arr, ks = arr[new], ks[new]
        self.hashed[arr] = True
        self.keys[arr] = ks
        more = self.more
        if (ks >= 0).all():  # prompt keys: a block is its key's first where the key is new (its first time here)
            _, at = np.unique(ks, return_index=True)
            lead = np.zeros(len(ks), bool)
            lead[at] = True
            lead &= self.table.find(ks) < 0
            if lead.all():
                self.table.insert_new(ks, arr)
                return
            self.table.insert_new(ks[lead], arr[lead])
            for b, k in zip(arr[~lead].tolist(), ks[~lead].tolist()):  # the others join their key's blocks
                more.setdefault(k, {})[b] = None
            return
        for b, k in zip(arr.tolist(), ks.tolist()):
            self._join(b, k)

    def _join(self, b: int, k: int) -> None:
        """Cache block b under key k: its first block if k is new here, else beside the others."""
        if self.has_key(k):
            self.more.setdefault(k, {})[b] = None
        else:
            self._set_first(k, b)

    # -- freeing ----------------------------------------------------------------------------------------------------
    def free(self, blocks) -> None:
        """Release one request's blocks, its last block first (vLLM frees in reverse, so the tail is evicted first):
        a block no longer held goes to the back of the free queue if it is hashed (LRU), to the front if not
        (vLLM reuses blocks that can never hit first: block_pool.py free_blocks)."""
        if not len(blocks):
            return
        rev = np.array(blocks, np.int64)[::-1]  # [n]
        refs = self.refs
        counts = refs[rev]
        refs[rev] = counts - 1
        if counts.max() > 1:  # shared blocks stay held by the others
            rev = rev[counts == 1]
        hashed = self.hashed[rev]
        if hashed.all():
            self._to_tail(rev)
            return
        self._to_tail(rev[hashed])
        head_q = self.head_q
        for b in rev[~hashed][::-1].tolist():
            head_q[b] = None
            head_q.move_to_end(b, last=False)

    def _to_tail(self, blocks: np.ndarray) -> None:
        """Put `blocks` (no longer held, hashed) at the back of the free queue, in order."""
        if not len(blocks):
            return
        self.at[blocks] = self.batches
        self.tail.append([self.batches, blocks, 0])
        self.live[self.batches] = len(blocks)
        self.batches += 1
        self.entries += len(blocks)
        self.in_tail += len(blocks)
        if self.entries > 2 * self.in_tail + self.SLACK:
            self._compact()
