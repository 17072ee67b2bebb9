"""vLLM's paged KV pool with prefix caching: reference-counted blocks, the prefix cache as the pool's free-but-hashed
blocks, evicted least recently freed first.

Rules follow vllm/v1/core/block_pool.py (vLLM 0.33): block 0 is the null block and never handed out; free blocks sit
in one queue, a freed hashed block joins its tail (an unhashed one its head), a new block is taken from its head
(dropping the hash it carried); a full block of a request is hashed with its prefix and a later request whose
block has the same key takes the same block (its reference count rises, it leaves the free queue if it sat there);
a block whose count falls to zero joins the free queue but keeps its hash until it is taken again. A key whose last
cached block is taken anew is recorded in `evicted` when host tiers listen (kvlab.serving.hosttiers).

A request takes, hits, hashes and frees about a thousand blocks at once, so the pool's state lives in arrays and
each operation over a request's blocks is one compiled (numba) loop, as vLLM's own pool walks them one by one:
  blk    [N, 8] int32 per block: reference count, hashed flag, key (its low and high halves), its place in the
         free queue's ring (while it sits there), the next block cached under the same key (-1: none) and two spare
         columns: rows of 32 bytes, aligned, two to a cache line (int64 rows of 48 bytes, half of them across two
         lines, ran the pool about a tenth slower)
  fq     [N + R] int32 the free queue (vLLM's FreeKVCacheBlockQueue, a doubly linked list, in two arrays): a stack
         of the free unhashed blocks (fq[:meta[NSTK]], its top the queue's head), then a ring of R >= 2N places
         holding the free hashed blocks least recently freed first (positions meta[QHEAD] to meta[QTAIL] count up
         from 0, a place is the position's low bits; -1 where a block left from the middle, a hit taking it: the
         ring closes such gaps when it fills). Taking from the queue's hashed end reads the ring in order, so the
         rows it visits are known ahead (a linked list's walk waits on each row in turn)
  tab    the key table (int64, `new_key_table`): the first block cached under each key, filed on pages of a
         trace block's keys that a directory (open addressing, linear probing, removal by backward shift, at most
         half full) finds once per trace block, so a walk over a request's keys reads its pages in order
  meta   [6] free blocks, the next never-used block, the stack's height, the ring's head and tail positions and
         its mask (R - 1)
A decode stretch's takes and hashes (kvlab.serving.scheduler.VllmScheduler.skip_decodes) are one compiled loop too
(`_decode_run`).
Never-used blocks are in neither: they are a range between the queue's unhashed head and its hashed tail, so a pool
of millions of blocks costs nothing until its blocks are used (np.zeros and np.empty page in lazily). Without numba
(KVLAB_NUMBA=0) the same functions run as plain Python, slowly.
"""
from __future__ import annotations

import numpy as np

from ..errors import ParameterError
from ..sim.kernels import ENABLED
from .prefetch import prefetch

# numba's on-disk cache checks only a kernel's own source file, yet a compiled caller embeds the kernels it calls:
# EMBEDS names the other sources whose kernels this module's embed, with their sha256 (first 16 hex digits), so that
# changing one of them means changing this file too, which recompiles it (tests/test_compiled_run.py checks)
EMBEDS = {"prefetch.py": "0a22742b3b5766d2"}

NONE = np.zeros(0, np.int64)  # no blocks
AHEAD = 8  # how many blocks or keys ahead a loop asks for the rows and slots it will visit (`prefetch`)

if ENABLED:
    from numba import njit
    _compiled = njit(cache=True, nogil=True, _nrt=True)  # named: a caller without NRT would pass that on
    # a kernel that allocates no array and returns none runs without numba's reference counting: the atomic
    # increments and decrements of its array arguments cost more than a block's own work in the innermost loops
    _leaf = njit(cache=True, nogil=True, _nrt=False)
    # a small kernel called once per block is inlined where it is called (numba's IR inlining): a call of a compiled
    # function passes each array as seven values and costs as much as the block's own work
    _inline = njit(cache=True, nogil=True, _nrt=False, inline="always")
else:  # pragma: no cover - without numba the kernels below run as plain Python
    def _compiled(f):
        return f
    _leaf = _inline = _compiled

REF, HASHED, KEY_LO, KEY_HI, QPOS, SAME = range(6)  # columns of blk (int32; the key's two halves)
COLS = 8  # a row is 32 bytes: two to a cache line
MAX_BLOCKS = 1 << 30  # the most blocks of a pool: its ring's places (R < 4N) fit an int32
FREE, FRESH, NSTK, QHEAD, QTAIL, QMASK = range(6)  # entries of meta
EVICTED, HASHED_KEY = 0, 1  # kinds of a decode run's log entries (what host tiers are told, in order)


def output_key(rid, i):
    """Hash key of block i of request rid when it holds output tokens (ints, or i an int64 array): unique to the
    request, and negative, so that it never equals a prompt block's key (kvlab.serving.replica.prompt_keys:
    non-negative ints)."""
    return ~((rid << 32) | i)


_output_key = _leaf(output_key)  # the same function, for the kernels


# -- directories: hash tables of int64 keys (the pool's pages, the host tiers' trace blocks) ------------------------
@_inline
def _home(k, mask):
    """Slot where key k's probe starts: k's high half folded into the low one, then xorshift-mixed (int64
    arithmetic, which wraps in numba and numpy alike)."""
    h = k ^ (k >> 32)
    h ^= h << 13
    h ^= h >> 7
    h ^= h << 17
    return h & mask


@_inline
def _probe(d, base, mask, k):
    """(index in d of key k's entry, or of the empty one where it would go; found). A directory is mask + 1 slots
    of two int64 from d[base] on, key and value (-1: an empty slot): open addressing, linear probing, at most half
    full (its owner sizes it)."""
    i = _home(k, mask)
    while True:
        e = base + 2 * i
        if d[e + 1] < 0:
            return e, False
        if d[e] == k:
            return e, True
        i = (i + 1) & mask


@_inline
def _unprobe(d, base, mask, e):
    """Empty the directory entry at e, moving later entries of its probe run back (no tombstones) so that every key
    stays reachable."""
    i = (e - base) >> 1
    j = i
    while True:
        j = (j + 1) & mask
        ej = base + 2 * j
        if d[ej + 1] < 0:
            break
        h = _home(d[ej], mask)
        # the entry at j may move to i unless its home lies cyclically in (i, j]
        if (i < j and i < h <= j) or (i > j and (h > i or h <= j)):
            continue
        d[base + 2 * i] = d[ej]
        d[base + 2 * i + 1] = d[ej + 1]
        i = j
    d[base + 2 * i + 1] = -1


# -- the pool's key table: pages of a key family ------------------------------------------------------------------
# A request hits, hashes and frees its keys in order, and prompt keys come in families: kvlab.serving.replica's
# prompt_keys are t * span + offset, the offsets of one trace block t stepping by the block size. So the pool files
# key k on a page: its family (k // span, a page per `P` of its steps) is found once in a directory (a hash table
# `_probe`, over family numbers) and its step ((k % span) // step) names the page's entry directly. A walk over a
# request's keys probes the directory once per trace block and reads its pages in order (a hash table of keys
# reads a random slot per key, which misses the cache each time). Output keys (negative, ~(request << 32 | index))
# are families of P indexes of one request. span = step = 1 (the default) makes every key a family of its own: any
# int64 keys work, as a plain hash table would. One int64 array holds it all:
#   tab[:T_HEAD]  the header (T_* below): directory slots, entries per page and their shift, pages, the span and
#                 step (and their shifts, -1 where not a power of two), pages per span, the free pages' list head,
#                 the next never-used page, the last family looked up and its page (a walk's memo), live pages
#   then the directory: 2 entries per slot (family, page; page -1: an empty slot), at most half full
#   then the pages: P + 1 entries each, the first block cached under each of its keys (-1: none) and, last, how
#   many of them are set (a free page: the next free page, -1: none). Pages are np.empty: untouched until used.
(T_DSLOTS, T_P, T_PSH, T_PAGES, T_SPAN, T_SPSH, T_STEP, T_STSH, T_SUB, T_FREEPG, T_FRESHPG, T_MEMO, T_MEMOPG,
 T_LIVE) = range(14)
T_HEAD = 16  # header entries
PAGE_MAX = 256  # most keys on a page


def shift_of(x: int) -> int:
    """log2(x) when x is a power of two, else -1."""
    return x.bit_length() - 1 if x > 0 and x & (x - 1) == 0 else -1


def new_key_table(pages: int, span: int = 1, step: int = 1, page_max: int = PAGE_MAX):
    """An empty key table with room for `pages` pages of keys t * span + offset (offsets of one t stepping by
    `step`), P = the power of two holding a span's steps, at most `page_max`; its directory the least power of two
    of slots at least twice the pages."""
    if span < 1 or step < 1:
        raise ParameterError(f"a key table's span and step must be positive, not {span} and {step}")
    steps = -(-span // step)  # a span's steps
    p = 1
    while p < min(steps, page_max):
        p *= 2
    slots = 1 << max(int(2 * pages - 1).bit_length(), 4)
    tab = np.empty(T_HEAD + 2 * slots + pages * (p + 1), np.int64)
    tab[:T_HEAD] = 0
    tab[T_DSLOTS], tab[T_P], tab[T_PSH], tab[T_PAGES] = slots, p, shift_of(p), pages
    tab[T_SPAN], tab[T_SPSH], tab[T_STEP], tab[T_STSH] = span, shift_of(span), step, shift_of(step)
    tab[T_SUB] = -(-steps // p)
    tab[T_FREEPG] = tab[T_MEMOPG] = -1
    tab[T_HEAD + 1:T_HEAD + 2 * slots:2] = -1  # every directory slot empty
    return tab


@_inline
def _family(tab, k):
    """(family, entry on its page) of key k (divisions become shifts where span, step are powers of two: a
    division is some tens of cycles, and every key hit, hashed or evicted is split)."""
    psh = tab[T_PSH]
    if k >= 0:
        sp = tab[T_SPSH]
        if sp >= 0:
            t = k >> sp
            o = k & ((np.int64(1) << sp) - 1)
        else:
            t = k // tab[T_SPAN]
            o = k - t * tab[T_SPAN]
        st = tab[T_STSH]
        g = o >> st if st >= 0 else o // tab[T_STEP]
        return t * tab[T_SUB] + (g >> psh), g & (tab[T_P] - 1)
    j = ~k  # an output key: request << 32 | index
    lo = j & 0xFFFFFFFF
    return ~((j - lo) | (lo >> psh)), lo & (tab[T_P] - 1)


@_inline
def _page_at(tab, pg):
    """Index in tab of page pg's first entry."""
    return T_HEAD + 2 * tab[T_DSLOTS] + pg * (tab[T_P] + 1)


@_inline
def _dir_slot(tab, f):
    """(index in tab of family f's directory entry, or of the empty one where it would go; found)."""
    return _probe(tab, T_HEAD, tab[T_DSLOTS] - 1, f)


@_inline
def _page(tab, f, make):
    """Family f's page: its first entry's index in tab, or -1 if it has none (one is made, every key unset, when
    `make`). The last family found is remembered: a walk stays on one page for a span's keys."""
    if tab[T_MEMOPG] >= 0 and tab[T_MEMO] == f:
        return _page_at(tab, tab[T_MEMOPG])
    e, found = _dir_slot(tab, f)
    if found:
        pg = tab[e + 1]
    else:
        if not make:
            return -1
        pg = tab[T_FREEPG]
        if pg >= 0:
            tab[T_FREEPG] = tab[_page_at(tab, pg) + tab[T_P]]
        else:
            pg = tab[T_FRESHPG]
            tab[T_FRESHPG] += 1
        at = _page_at(tab, pg)
        for s in range(tab[T_P]):
            tab[at + s] = -1
        tab[at + tab[T_P]] = 0
        tab[e] = f
        tab[e + 1] = pg
        tab[T_LIVE] += 1
    tab[T_MEMO] = f
    tab[T_MEMOPG] = pg
    return _page_at(tab, pg)


@_inline
def _page_free(tab, f, at):
    """Family f's page (at: its first entry) holds no key any more: it leaves the directory (`_unprobe`) and joins
    the free pages."""
    e, _ = _dir_slot(tab, f)
    pg = tab[e + 1]
    _unprobe(tab, T_HEAD, tab[T_DSLOTS] - 1, e)
    tab[at + tab[T_P]] = tab[T_FREEPG]
    tab[T_FREEPG] = pg
    tab[T_LIVE] -= 1
    if tab[T_MEMOPG] == pg:
        tab[T_MEMOPG] = -1


@_inline
def _first(tab, k):
    """The first block cached under key k, -1 if none."""
    f, s = _family(tab, k)
    at = _page(tab, f, False)
    return tab[at + s] if at >= 0 else -1


@_leaf
def _regrow(old, new):
    """Put every page of table `old` in the empty table `new` (same span and step; room for them)."""
    p = old[T_P]
    for i in range(old[T_DSLOTS]):
        e = T_HEAD + 2 * i
        if old[e + 1] >= 0:
            src = _page_at(old, old[e + 1])
            dst = _page(new, old[e], True)
            for s in range(p + 1):
                new[dst + s] = old[src + s]


# -- block rows ---------------------------------------------------------------------------------------------------
@_inline
def _key(blk, b):
    """The key block b carries, from its row's two int32 halves."""
    return (np.int64(blk[b, KEY_HI]) << 32) | (np.int64(blk[b, KEY_LO]) & 0xFFFFFFFF)


# -- the free queue ---------------------------------------------------------------------------------------------
@_leaf
def _compact(blk, fq, meta):
    """Close the ring's gaps, keeping its order (each block moved learns its new place)."""
    base, mask = blk.shape[0], meta[QMASK]
    w = meta[QHEAD]
    for p in range(meta[QHEAD], meta[QTAIL]):
        b = fq[base + (p & mask)]
        if b >= 0:
            if p != w:
                fq[base + (w & mask)] = b
                blk[b, QPOS] = w & mask
            w += 1
    meta[QTAIL] = w


@_inline
def _push_back(blk, fq, meta, b):
    """Hashed block b joins the queue's tail (the ring's newest)."""
    if meta[QTAIL] - meta[QHEAD] > meta[QMASK]:  # full: close its gaps (at most N of its R >= 2N places hold blocks)
        _compact(blk, fq, meta)
    p = meta[QTAIL] & meta[QMASK]
    fq[blk.shape[0] + p] = b
    blk[b, QPOS] = p
    meta[QTAIL] += 1


@_inline
def _pop_front(blk, fq, meta):
    """The ring's oldest block, taken off it (the queue's hashed end)."""
    base, mask = blk.shape[0], meta[QMASK]
    p = meta[QHEAD]
    b = fq[base + (p & mask)]
    while b < 0:
        p += 1
        b = fq[base + (p & mask)]
    meta[QHEAD] = p + 1
    return b


# -- pool operations over a run of blocks -------------------------------------------------------------------------
@_inline
def _drop(blk, tab, meta, b):
    """Block b (hashed, taken anew) leaves its key's cached blocks; True when it was the key's last (evicted)."""
    f, s = _family(tab, _key(blk, b))
    at = _page(tab, f, False)
    first = tab[at + s]
    nxt = blk[b, SAME]
    blk[b, HASHED] = 0
    if first == b:
        tab[at + s] = nxt
        if nxt < 0:
            tab[at + tab[T_P]] -= 1
            if tab[at + tab[T_P]] == 0:
                _page_free(tab, f, at)
            return True
        return False
    p = first
    while blk[p, SAME] != b:
        p = blk[p, SAME]
    blk[p, SAME] = nxt
    return False


@_leaf
def _take(blk, fq, tab, meta, out, evicted):
    """Take len(out) free blocks in queue order (unhashed head, never-used range, hashed tail), each dropping its
    hash and held once; keys evicted go to `evicted` in order. Returns how many were evicted."""
    n_blocks = blk.shape[0]
    nev = 0
    for i in range(out.shape[0]):
        if meta[NSTK]:  # put back at the head
            meta[NSTK] -= 1
            b = fq[meta[NSTK]]
        elif meta[FRESH] < n_blocks:  # never used: no hash, in no queue
            b = meta[FRESH]
            meta[FRESH] += 1
        else:  # the tail's least recently freed
            b = _pop_front(blk, fq, meta)
            p = meta[QHEAD] + AHEAD  # the row a few places on
            if p < meta[QTAIL]:
                c = fq[n_blocks + (p & meta[QMASK])]
                if c >= 0:
                    prefetch(blk, c)
            if _drop(blk, tab, meta, b):
                evicted[nev] = _key(blk, b)
                nev += 1
        blk[b, REF] = 1
        out[i] = b
    meta[FREE] -= out.shape[0]
    return nev


@_leaf
def _touch(blk, fq, meta, blocks):
    """Hold each of `blocks` (distinct cache hits) once more; a free one leaves the queue (a gap in the ring)."""
    base = blk.shape[0]
    n = blocks.shape[0]
    for i in range(n):
        if i + AHEAD < n:
            prefetch(blk, blocks[i + AHEAD])
        b = blocks[i]
        if blk[b, REF] == 0:
            fq[base + blk[b, QPOS]] = -1
            meta[FREE] -= 1
        blk[b, REF] += 1


@_leaf
def _idle(blk, blocks):
    """How many of `blocks` no request holds."""
    n, m = 0, blocks.shape[0]
    for i in range(m):
        if i + AHEAD < m:
            prefetch(blk, blocks[i + AHEAD])
        n += blk[blocks[i], REF] == 0
    return n


@_leaf
def _hit(tab, keys, out):
    """Blocks cached for the longest run of leading keys, in out[:m]; returns m."""
    for i in range(keys.shape[0]):
        b = _first(tab, keys[i])
        if b < 0:
            return i
        out[i] = b
    return keys.shape[0]


@_leaf
def _hit_held(tab, blk, keys, out, need):
    """`_hit` counting the blocks of the run that a request holds, stopping early when fewer than `need` could be
    held even if every key left hit a held block; returns (m, held, short), short when it stopped early (out[:m]
    is then a part of the run). For an admission that failed before: one pass, but each block read waits on its
    probe, so a first try takes `_hit` and `_idle`."""
    n = keys.shape[0]
    held = 0
    for i in range(n):
        if held + n - i < need:
            return i, held, True
        b = _first(tab, keys[i])
        if b < 0:
            return i, held, False
        out[i] = b
        held += blk[b, REF] > 0
    return n, held, False


@_inline
def _cache_one(blk, tab, meta, b, k):
    """Hash block b under key k: k's first block if k is new, else after its others; a hashed block keeps its
    hash. Returns whether b was hashed now."""
    if blk[b, HASHED]:
        return False
    blk[b, HASHED] = 1
    blk[b, KEY_LO] = ((k & 0xFFFFFFFF) ^ 0x80000000) - 0x80000000  # the low half as a signed int32
    blk[b, KEY_HI] = k >> 32
    blk[b, SAME] = -1
    f, s = _family(tab, k)
    at = _page(tab, f, True)
    p = tab[at + s]
    if p >= 0:
        while blk[p, SAME] >= 0:
            p = blk[p, SAME]
        blk[p, SAME] = b
    else:
        tab[at + s] = b
        tab[at + tab[T_P]] += 1
    return True


@_leaf
def _cache(blk, tab, meta, blocks, keys):
    """Hash blocks[i] under keys[i], in order (a key's first block is what a hit takes)."""
    n = min(blocks.shape[0], keys.shape[0])
    for i in range(n):
        if i + AHEAD < n:
            prefetch(blk, blocks[i + AHEAD])
        _cache_one(blk, tab, meta, blocks[i], keys[i])


@_leaf
def _heap_push(heap, n, x):
    """Push x on the binary min-heap heap[:n]; returns n + 1."""
    i = n
    heap[i] = x
    while i > 0:
        p = (i - 1) >> 1
        if heap[p] <= x:
            break
        heap[i] = heap[p]
        heap[p] = x
        i = p
    return n + 1


@_leaf
def _heap_pop(heap, n):
    """Pop the smallest of heap[:n] (n > 0); returns it (the heap is heap[:n - 1] after)."""
    top = heap[0]
    n -= 1
    x = heap[n]
    i = 0
    while True:
        c = 2 * i + 1
        if c >= n:
            break
        if c + 1 < n and heap[c + 1] < heap[c]:
            c += 1
        if heap[c] >= x:
            break
        heap[i] = heap[c]
        i = c
    if n > 0:
        heap[i] = x
    return top


@_leaf
def _next_event(bs, caching, c1, t1, nb, cu):
    """The next decode step (1: the first after the one in flight) at which a request with these counts takes a
    block (its blocks are full) or hashes one (its next block is filled)."""
    i = nb * bs - c1 + 1
    if caching:
        i = min(i, (cu + 1) * bs - t1 + 1)
    return max(i, 1)


@_compiled
def _decode_run(blk, fq, tab, meta, m, bs, mml, caching, c1, t1, nb, cu, rid, nkeys, base, seg, soff, pk, koff,
                scratch, log, logging):
    """The block events of up to m decode steps of a running batch, in step order and, within a step, in running
    order (kvlab.serving.scheduler.VllmScheduler.skip_decodes): request j, at skipped step i, has computed
    c1[j] + i - 1 tokens of t1[j] + i - 1 and needs one more slot; a request whose blocks are full takes one, and
    each block it fills is hashed (prompt keys pk, output keys beyond nkeys[j]). Stops before a step whose takes the
    free queue cannot give. Request j's blocks from index base[j] on sit in seg[soff[j]:soff[j + 1]] (those it
    holds copied in, new ones written there); nb and cu (blocks held, blocks hashed) are updated. With `logging`,
    log[:, e] = (kind, step, key) records each evicted and hashed key in order. Returns (steps applied, log
    entries, the last step with events: 0 if none), or (-1, 0, 0) if a request outgrew its segment."""
    r = c1.shape[0]
    return _decode_steps(blk, fq, tab, meta, m, bs, mml, caching, c1, t1, nb, cu, rid, nkeys, base, seg, soff, pk, koff,
                         scratch, log, logging, np.empty(r, np.int64), np.empty(r, np.int64))


@_leaf
def _decode_steps(blk, fq, tab, meta, m, bs, mml, caching, c1, t1, nb, cu, rid, nkeys, base, seg, soff, pk, koff,
                  scratch, log, logging, heap, grp):
    """`_decode_run`'s loop, given its heap and group buffers ([r] each): without NRT, so that a take's slice of a
    segment costs no reference counting."""
    r = c1.shape[0]
    n = 0
    for j in range(r):
        n = _heap_push(heap, n, _next_event(bs, caching, c1[j], t1[j], nb[j], cu[j]) * r + j)
    ne = 0
    last = 0
    while n > 0 and heap[0] // r <= m:
        i = heap[0] // r
        g = 0
        takes = 0
        while n > 0 and heap[0] // r == i:
            j = _heap_pop(heap, n) - i * r
            n -= 1
            grp[g] = j
            g += 1
            takes += nb[j] * bs == c1[j] + i - 1
        if takes > meta[FREE]:  # the step loop would preempt at step i: stop before it
            return i - 1, ne, last
        last = i
        for q in range(g):
            j = grp[q]
            computed = c1[j] + i - 1
            new = (min(computed + 1, mml) + bs - 1) // bs - nb[j]
            if new > 0:
                at = soff[j] + nb[j] - base[j]
                if at + new > soff[j + 1]:
                    return -1, 0, 0
                nev = _take(blk, fq, tab, meta, seg[at:at + new], scratch)
                nb[j] += new
                if logging:
                    for e in range(nev):
                        log[0, ne] = EVICTED
                        log[1, ne] = i
                        log[2, ne] = scratch[e]
                        ne += 1
            full = min(computed + 1, t1[j] + i - 1) // bs
            for idx in range(cu[j], full):
                if not caching:
                    break
                k = pk[koff[j] + idx - base[j]] if idx < nkeys[j] else _output_key(rid[j], idx)
                _cache_one(blk, tab, meta, seg[soff[j] + idx - base[j]], k)
                if logging:
                    log[0, ne] = HASHED_KEY
                    log[1, ne] = i
                    log[2, ne] = k
                    ne += 1
            cu[j] = max(cu[j], full)
            n = _heap_push(heap, n, _next_event(bs, caching, c1[j], t1[j], nb[j], cu[j]) * r + j)
    return m, ne, last


@_leaf
def _free(blk, fq, meta, blocks):
    """Release one request's blocks, its last first: a hashed block no longer held joins the queue's tail, an
    unhashed one its head (so the head holds them last block first)."""
    n = blocks.shape[0]
    for i in range(n - 1, -1, -1):
        if i >= AHEAD:
            prefetch(blk, blocks[i - AHEAD])
        b = blocks[i]
        blk[b, REF] -= 1
        if blk[b, REF] == 0:
            meta[FREE] += 1
            if blk[b, HASHED]:
                _push_back(blk, fq, meta, b)
    for i in range(n):
        b = blocks[i]
        if blk[b, REF] == 0 and blk[b, HASHED] == 0:
            fq[meta[NSTK]] = b
            meta[NSTK] += 1


class BlockPool:
    """Blocks of one replica's KV pool. Blocks and keys go in as sequences of ints or int64 arrays (keys fit in 64
    bits: kvlab.serving.replica.prompt_keys, `output_key`); `take` hands out a list. `key_span`, `key_step`: the
    keys' families for the key table (`new_key_table`: prompt keys of a trace whose blocks hold key_span tokens, KV
    blocks of key_step tokens); the default, 1 and 1, takes any keys."""

    TABLE_PAGES = 512  # the key table's first room in pages (it doubles when a hash could find none free)

    def __init__(self, num_blocks: int, caching: bool = True, key_span: int = 1, key_step: int = 1):
        if num_blocks > MAX_BLOCKS:
            raise ParameterError(f"a KV pool of {num_blocks:,} blocks: the block pool numbers its blocks and their "
                                 f"places in the free queue's ring in 32 bits (at most {MAX_BLOCKS:,} blocks); use "
                                 "larger blocks or a smaller pool")
        self.num_blocks = num_blocks  # blocks in the pool, the null block included
        self.caching = caching  # prefix caching on
        raw = np.zeros((num_blocks + 1) * COLS, np.int32)  # zeros page in lazily: a big pool costs what it uses
        at = (-raw.ctypes.data % 32) // 4  # rows aligned to 32 bytes: none straddles two cache lines
        self.blk = raw[at:at + num_blocks * COLS].reshape(num_blocks, COLS)  # [N, COLS] per-block state
        ring = 1 << int(2 * num_blocks - 1).bit_length()  # R >= 2N places
        self.fq = np.empty(num_blocks + ring, np.int32)  # [N + R] the free queue: unhashed stack, hashed ring
        self.tab = new_key_table(self.TABLE_PAGES, key_span, key_step)  # the key table (`new_key_table`)
        # free blocks, next never-used (0: null), stack height, ring head, ring tail, ring mask
        self.meta = np.array([num_blocks - 1, 1, 0, 0, 0, ring - 1], np.int64)
        self._ev = np.empty(64, np.int64)  # keys evicted by the last take
        self.evicted: list | None = None  # when a list: keys whose last cached block `take` reused, appended in order
        # (host tiers behind the pool read them: kvlab.serving.hosttiers)

    # -- views (tests and inspection) ----------------------------------------------------------------------------
    @property
    def ref(self) -> dict:
        """block -> requests holding it, for blocks held."""
        refs = self.blk[:self.num_blocks, REF]
        b = np.flatnonzero(refs)
        return dict(zip(b.tolist(), refs[b].tolist()))

    @property
    def key(self) -> dict:
        """block -> the key it carries, for hashed blocks."""
        b = np.flatnonzero(self.blk[:self.num_blocks, HASHED])
        return dict(zip(b.tolist(), self._keys_of(b)))

    def _keys_of(self, b: np.ndarray) -> list[int]:
        """The keys blocks `b` carry (`_key`, over an array at once)."""
        return getattr(_key, "py_func", _key)(self.blk, b).tolist()

    @property
    def first(self) -> dict:
        """key -> the first block cached under it."""
        t = self.tab
        slots, p = int(t[T_DSLOTS]), int(t[T_P])
        pages = t[T_HEAD + 1:T_HEAD + 2 * slots:2]  # [S] each directory slot's page (-1: empty)
        at = T_HEAD + 2 * slots
        firsts = t[at:at + int(t[T_FRESHPG]) * (p + 1)].reshape(-1, p + 1)[pages[pages >= 0], :p]  # [live, P]
        b = firsts[firsts >= 0]  # [K] every key's first block
        return dict(zip(self._keys_of(b), b.tolist()))

    @property
    def cached(self) -> dict:
        """key -> [blocks cached under it], first cached first (vLLM keeps every block of a key)."""
        out = {}
        for k, b in self.first.items():
            bs = [b]
            while self.blk[bs[-1], SAME] >= 0:
                bs.append(int(self.blk[bs[-1], SAME]))
            out[k] = bs
        return out

    def queue(self) -> list[int]:
        """The free blocks in queue order (the head's unhashed, the never-used, the tail's hashed)."""
        n, mask = self.num_blocks, int(self.meta[QMASK])
        ring = [int(self.fq[n + (p & mask)]) for p in range(int(self.meta[QHEAD]), int(self.meta[QTAIL]))]
        return (self.fq[:self.meta[NSTK]][::-1].tolist() + list(range(int(self.meta[FRESH]), n))
                + [b for b in ring if b >= 0])

    # -- one key ----------------------------------------------------------------------------------------------------
    def has_key(self, k: int) -> bool:
        """Whether some block is cached under key k."""
        return bool(_first(self.tab, np.int64(k)) >= 0)

    def free_count(self) -> int:
        return int(self.meta[FREE])

    # -- hits -------------------------------------------------------------------------------------------------------
    def hit(self, keys) -> np.ndarray:
        """Blocks cached for the longest run of leading keys ([n] int64)."""
        if not self.caching or not len(keys):
            return NONE
        ks = np.asarray(keys, np.int64)  # [K]
        out = np.empty(len(ks), np.int64)  # [K]
        return out[:_hit(self.tab, ks, out)]

    def evictable(self, blocks) -> int:
        """How many of `blocks` (cache hits) sit in the free queue, so taking them uses free blocks."""
        return int(_idle(self.blk, np.asarray(blocks, np.int64)))

    def touch(self, blocks) -> None:
        """Hold each of `blocks` (cache hits, distinct) once more; a free one leaves the free queue."""
        _touch(self.blk, self.fq, self.meta, np.asarray(blocks, np.int64))

    # -- taking ---------------------------------------------------------------------------------------------------
    def take(self, n: int) -> list[int]:
        """`n` free blocks in free-queue order (the head's, then never-used ones, then the tail's, least recently
        freed first), each dropping the hash it carried; held once each."""
        return self.take_into(np.empty(n, np.int64)).tolist()

    def take_into(self, out: np.ndarray) -> np.ndarray:
        """`take(len(out))` written into `out` (int64; a request's block buffer), which is returned."""
        n = len(out)
        if n > self.meta[FREE]:
            raise RuntimeError(f"take({n}) with {int(self.meta[FREE])} free blocks")  # callers check free_count
        if len(self._ev) < n:
            self._ev = np.empty(2 * n, np.int64)
        nev = _take(self.blk, self.fq, self.tab, self.meta, out, self._ev)
        if nev and self.evicted is not None:
            self.evicted += self._ev[:nev].tolist()
        return out

    # -- hashing --------------------------------------------------------------------------------------------------
    def cache(self, b: int, k) -> None:
        """Hash full block `b` under key `k` (another block of the same key stays cached beside it)."""
        self.cache_many([b], [k])

    def cache_many(self, blocks, keys) -> None:
        """`cache(b, k)` for each pair, in order (a block hashed already keeps its hash)."""
        if not self.caching or not len(blocks):
            return
        ks = np.asarray(keys, np.int64)  # [n]
        self._room_for(len(ks))
        _cache(self.blk, self.tab, self.meta, np.asarray(blocks, np.int64), ks)

    def _room_for(self, n: int) -> None:
        """Grow the key table so that n more keys find pages (each may start one) and its directory stays at most
        half full."""
        t = self.tab
        live, fresh, pages = int(t[T_LIVE]), int(t[T_FRESHPG]), int(t[T_PAGES])
        if fresh + n > pages or 2 * (live + n) > int(t[T_DSLOTS]):
            tab = new_key_table(max(2 * pages, live + n), int(t[T_SPAN]), int(t[T_STEP]), page_max=int(t[T_P]))
            _regrow(t, tab)
            self.tab = tab

    # -- a decode stretch -------------------------------------------------------------------------------------------
    def decode_run(self, m: int, bs: int, mml: int, c1, t1, nb, cu, rid, nkeys, base, seg, soff, pk, koff,
                   logging: bool) -> tuple[int, np.ndarray, int]:
        """The block events of up to `m` decode steps of a running batch in one compiled loop (`_decode_run`; the
        arrays as it takes them, nb and cu updated). Returns (steps applied, [3, E] log of evicted and hashed keys:
        kind, step, key (empty unless `logging`), the last step with block events (0: none))."""
        self._room_for(len(seg))  # every block the run may hash
        scratch = np.empty(len(seg) + 1, np.int64)
        log = np.empty((3, 2 * len(seg) if logging else 0), np.int64)
        got, ne, last = _decode_run(self.blk, self.fq, self.tab, self.meta, m, bs, mml, self.caching, c1, t1, nb, cu,
                                    rid, nkeys, base, seg, soff, pk, koff, scratch, log, logging)
        if got < 0:
            raise RuntimeError("a decode run outgrew a request's block segment")  # skip_decodes sizes them
        return got, log[:, :ne], last

    # -- freeing ----------------------------------------------------------------------------------------------------
    def free(self, blocks) -> None:
        """Release one request's blocks, its last block first (vLLM frees in reverse, so the tail is evicted first):
        a block no longer held goes to the back of the free queue if it is hashed (LRU), to the front if not
        (vLLM reuses blocks that can never hit first: block_pool.py free_blocks)."""
        if len(blocks):
            _free(self.blk, self.fq, self.meta, np.asarray(blocks, np.int64))
