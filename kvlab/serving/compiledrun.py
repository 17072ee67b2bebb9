"""The serving simulator's run as one compiled (numba) loop: the event loop, vLLM's scheduler, host tiers and the
step pricing of one replica, for the runs that need nothing Python-only.

kvlab.serving.eventloop.EventLoop driving kvlab.serving.scheduler.VllmScheduler (with kvlab.serving.hosttiers) is
the reference: this module follows it rule for rule, over the same compiled block pool (kvlab.serving.blockpool's
kernels, its decode stretch `_decode_steps` included), and gives the same figures to the last bit
(tests/test_compiled_run.py holds every per-request array, the step count, busy seconds, bytes moved between tiers
and the time-averaged requests in system equal on pressured, shared-prefix, async and sync, chunked and unchunked
streams with and without DRAM / SSD tiers, and vLLM's fixture streams request for request). What the Python loop
spends per step (a Batch of dicts and sets, pricing it, applying it) is a few array writes here, so a
million-request trace runs in about the time its block operations take.

Runs it covers (`unsupported` says why not, and the caller falls back to the Python loop): one replica, no per-step
log, host tiers without per-block history (admission "all", no TTL) under LRU or FIFO, steps priced by the affine
model (the unit model is one) or kvlab's roofline within its per-context tables (contexts below
kvlab.serving.steptime.roofline.TABLE_MAX). Request state lives in rows of int64 arrays (one row per request), the
waiting queue is a ring, running requests an array in admission order, a request's block table a row of one
[max_num_seqs + 1, most blocks] array (rows reused; lazily paged), the pool's key table sized once for the run;
host tiers are a ring per tier (DRAM's and SSD's keys in the order they came, with gaps where a key left from the
middle, closed when the ring fills) and a page of entries per trace block holding
keys there (an entry per KV block of the trace block: its ring place), found through a key table of trace blocks.
Without per-block history time plays no part in them, and an LRU tier behaves as a FIFO one: the pool places,
hashing and admission remove, nothing looks a host block up in place. Those walks go through a prompt's blocks in
order, so a trace block's page is looked up once for its run of keys, and a trace block without keys in a tier
(most of a prompt's new blocks) has no page: one probe answers for all its keys. The loop's state sits in arrays
between calls, so the caller runs it a slice of requests at a time (the progress
bar). From OFFLOAD_MIN requests on a machine of two cores or more, the host tiers' placements and drops go through
a log that a helper thread applies in order (`_h_worker`); the loop waits for it to drain before an admission reads
the tiers, so the run is the one-thread run's to the last bit, with about a fifth of the tier stack's work on the
other core.
"""
from __future__ import annotations

import math
import os

import numpy as np

from ..checks import cdiv
from ..sim.kernels import ENABLED
from .prefetch import load_acquire, store_release
from .blockpool import (EVICTED, FREE, _cache, _decode_steps, _free, _hit, _hit_held, _idle, _inline, _leaf,
                        _output_key, _probe, _take, _unprobe, _touch, BlockPool, PAGE_MAX, new_key_table,
                        shift_of)

# numba's on-disk cache checks only a kernel's own source file, yet a compiled caller embeds the kernels it calls:
# EMBEDS names the other sources whose kernels this module's embed, with their sha256 (first 16 hex digits), so that
# changing one of them means changing this file too, which recompiles it (tests/test_compiled_run.py checks)
EMBEDS = {"blockpool.py": "0705dd6460f20454", "prefetch.py": "0a22742b3b5766d2"}

if ENABLED:
    from numba import njit
    # NRT named, not left to the caller: a kernel without it (blockpool._leaf) passes that on to what it calls
    _compiled = njit(cache=True, nogil=True, _nrt=True)
    # the step's kernels, called once or more a step with dozens of arrays: without NRT, so that binding those
    # arguments costs no reference counting (they allocate nothing; what they call that allocates names NRT), and
    # called from compiled code only
    _stepper = njit(cache=True, nogil=True, _nrt=False, no_cpython_wrapper=True)
else:  # pragma: no cover - without numba the Python loop runs every case
    def _compiled(f):
        return f
    _stepper = _compiled

# columns of the per-request int64 rows (rq)
(PROMPT, MAXT, COMP, OUT, PH, INFL, STALE, NB, CU, FIN, HIT, PRE, SLOT, WHERE, NKEYS, GEN, APRE, HITTOK,
 FAILED) = range(19)
TIERTOK, TIERBLK = 19, 22  # prefix-hit tokens and trace blocks per tier (HBM, DRAM, SSD): three columns each
RQ_COLS = 25
# columns of the per-request float rows (rt)
ARR, START, FIRST, FINISH = range(4)
# knobs (kn)
(BS, MNS, MNBT, MML, CACHING, ASYNC, CHUNKED, LPT, RESERVE, TB, HAS_PREFIXES, KIND, FAST, NBMAX) = range(14)
# integer loop state (ist)
(IN_SYS, STEPS, DUE, HAS_END, NARR, HAVE_T0, PREEMPTS, WHEAD, WCOUNT, NRUN, INFL_ON, INFL_B, STUCK, STUCK_FREE,
 STUCK_NRUN, DONE, NPRE, NSLOT, OVER) = range(19)  # NSLOT: free rows of the block tables; OVER: a row overflowed
# float loop state (fst)
(LAST_T, T0, AREA, T_END, DUE_T, END_T, BUSY_UNTIL, BUSY_S, MIN_GAP) = range(9)
# batch entry fields (bat[b, e])
B_RID, B_N, B_SAMPLE, B_DECODE, B_HIT, B_DRAM, B_SSD = range(7)  # B_DRAM, B_SSD: blocks loaded (-1: none)
# host tiers: hring holds DRAM's ring, then SSD's (keys in the order they came, least recent at the head, TOMB where a
# key left from the middle; positions count up from 0 and a ring's index is the position's low bits), then per page
# its trace block and its keys in tiers, then the stack of free pages; hpage holds a page per trace block with keys
# in a tier (an entry per block offset: ring index << 2 | tier, -1 for none), htab maps a trace block to its page.
# hmeta entries: per tier its keys, ring head, ring tail, ring base and mask, then blocks dropped past the last tier,
# blocks moved (HBM to DRAM, DRAM to SSD, DRAM to HBM, SSD to HBM, HBM to SSD), the trace's block tokens (a prompt
# key's trace block: key // tokens), the KV block size, log2 of a page's entries, where hring's page owners, page
# counts and free pages start, how many pages are free, two memos (trace block, its page), and log2 of the block
# tokens and of the block size where they are powers of two (-1 where not: a page's arithmetic then divides)
(H_COUNT1, H_COUNT2, H_HEAD1, H_HEAD2, H_TAIL1, H_TAIL2, H_BASE1, H_BASE2, H_MASK1, H_MASK2, H_DROPPED, M_HD, M_DS,
 M_DH, M_SH, M_HS, H_TB, H_BS, H_WSH, H_OWN, H_PCNT, H_FREE, H_NFREE, H_MID, H_MPG, H_VID, H_VPG, H_TSH,
 H_BSH, H_QON, H_QBASE, H_QMASK) = range(32)
# the host-tier log a helper thread applies (`_h_worker`): the loop's write position and its last read of the
# helper's (one cache line), the published write position, the helper's read position, the stop flag (a line each)
H_QWL, H_QRC, H_QW, H_QR, H_QSTOP, H_SIZE = 32, 33, 40, 48, 56, 64
QLOG = 1 << 16  # entries of the host-tier log
OFFLOAD_MIN = 50_000  # requests from which host tiers run on a helper thread (when the machine has two cores)
RING_MAX = 1 << 29  # the most places of a ring (an int32 entry holds index << 2 | tier)
TOMB = -1  # a ring's gap (prompt keys are non-negative)
# step pricing kinds and their float parameters (pp)
AFFINE, ROOFLINE, ROOFLINE_V4 = range(3)
# affine: overhead, per prefill token, per decode request, per context token
# roofline: overhead ms, 2 x active params, TP, memory B/s, compute FLOP/s
FAST_FORWARD_STEPS = 4096  # as kvlab.serving.eventloop's
FAST_FORWARD_CHUNK = 16  # steps of a stretch priced first (then twice as many, ...)
KEY_PAGES_BYTES = 1 << 28  # the most room (virtual) for the key table's pages (`key_table`)
STRETCH_ROOM = 4  # blocks a decode stretch's buffers hold per running request beyond what its steps can take


# -- exact float sum (math.fsum, for the roofline's FLOPs) --------------------------------------------------------
@_leaf
def _fsum(xs, n, parts):
    """The correctly rounded sum of xs[:n] (finite floats): Shewchuk's exact partials (in `parts`, at least n + 1
    long), rounded half-even at the end, which is the figure math.fsum gives."""
    m = 0
    for k in range(n):
        x = xs[k]
        i = 0
        for j in range(m):
            y = parts[j]
            if abs(x) < abs(y):
                x, y = y, x
            hi = x + y
            lo = y - (hi - x)
            if lo != 0.0:
                parts[i] = lo
                i += 1
            x = hi
        parts[i] = x
        m = i + 1
    if m == 0:
        return 0.0
    m -= 1
    hi = parts[m]
    lo = 0.0
    while m > 0:
        x = hi
        m -= 1
        y = parts[m]
        hi = x + y
        yr = hi - x
        lo = y - yr
        if lo != 0.0:
            break
    if m > 0 and ((lo < 0.0 and parts[m - 1] < 0.0) or (lo > 0.0 and parts[m - 1] > 0.0)):
        y = lo * 2.0
        x = hi + y
        yr = x - hi
        if y == yr:
            hi = x
    return hi


# -- step pricing -------------------------------------------------------------------------------------------------
@_leaf
def _price(kind, pp, wbt, kv_at, fl_at, win, whole, pn, pc, npf, dc, nd, add, flbuf):
    """Seconds of one step: prefill chunks (pn[i] new tokens over pc[i] cached), decodes at contexts dc[:nd] + add;
    the figure the model's step_s gives (AffineStepModel, Roofline: the same operations in the same order; FLOP
    sums correctly rounded, as math.fsum: decode FLOPs that are whole numbers (`whole`) summed exactly in int64)."""
    if kind == AFFINE:
        new = 0
        ctx = 0
        for i in range(npf):
            new += pn[i]
            ctx += pc[i]
        for i in range(nd):
            ctx += dc[i] + add
        return pp[0] + pp[1] * new + pp[2] * nd + pp[3] * ctx
    tokens = nd
    kv = 0
    for i in range(npf):
        tokens += pn[i]
        if pc[i]:
            kv += kv_at[pc[i]]
    k = 0
    exact = 0
    for i in range(nd):
        c = max(dc[i] + add, 1)
        kv += kv_at[c]
        if whole:
            exact += np.int64(fl_at[c])
        else:
            flbuf[k] = fl_at[c]
            k += 1
    if whole:  # the exact sum as two floats that add up to it exactly
        flbuf[0] = float(exact)
        flbuf[1] = float(exact - np.int64(flbuf[0]))
        k = 2
    for i in range(npf):
        n, c = pn[i], pc[i]
        if kind == ROOFLINE_V4:
            flbuf[k] = fl_at[max(c + n // 2, 1)] * n
        else:  # Roofline._keys_flops at the chunk's middle key count, layers grouped by window
            keys = c + (n + 1) / 2
            out = 0.0
            for w in range(win.shape[0]):
                if win[w, 0]:
                    out += win[w, 1] * min(keys, float(win[w, 0]))
                else:
                    out += win[w, 1] * keys
            flbuf[k] = pp[5] * out * n
        k += 1
    flops = float(exact) if whole and npf == 0 else _fsum(flbuf, k, flbuf[k:])
    return _roof_s(pp, wbt[tokens] + kv, (pp[1] * tokens + flops) / pp[2])


@_leaf
def _roof_s(pp, nbytes, fl):
    """The roofline's seconds from a step's bytes read and FLOPs (Roofline.step_s's last lines)."""
    mem_ms = nbytes / pp[3] * 1e3
    cmp_ms = fl / pp[4] * 1e3
    return (pp[0] + max(mem_ms, cmp_ms)) / 1e3


@_leaf
def _price_run(kind, pp, wbt, kv_at, fl_at, win, whole, pn, pc, dc, nd, j0, cnt, out, kvs, fls, flbuf):
    """out[j0:j0 + cnt]: seconds of decode-only steps j0..j0 + cnt - 1 of a stretch (step j at contexts dc[:nd] +
    j), each `_price`'s figure; the roofline's whole-number sums run request by request over its contexts."""
    if kind == AFFINE or not whole:
        for j in range(j0, j0 + cnt):
            out[j] = _price(kind, pp, wbt, kv_at, fl_at, win, whole, pn, pc, 0, dc, nd, j, flbuf)
        return
    kvs[:cnt] = 0
    fls[:cnt] = 0
    for i in range(nd):
        base = dc[i] + j0
        for q in range(cnt):
            c = max(base + q, 1)
            kvs[q] += kv_at[c]
            fls[q] += np.int64(fl_at[c])
    wb = wbt[nd]
    for q in range(cnt):
        out[j0 + q] = _roof_s(pp, wb + kvs[q], (pp[1] * nd + float(fls[q])) / pp[2])


# -- keys and block tables ----------------------------------------------------------------------------------------
@_leaf
def _keys(out, rq, ids, off, r, lo, hi, tb, bs):
    """Hash keys of blocks lo..hi-1 of request r in out[:hi - lo] (kvlab.serving.replica.prompt_keys, then
    blockpool.output_key beyond its prompt's keys); a block's last token walks the trace blocks without dividing."""
    nk = min(rq[r, NKEYS], hi)
    i = lo
    if i < nk:
        last = i * bs + bs - 1
        t = off[r] + last // tb  # trace block of the block's last token
        at = last % tb  # its offset there
        while i < nk:
            out[i - lo] = ids[t] * tb + at
            at += bs
            while at >= tb:
                at -= tb
                t += 1
            i += 1
    for i in range(max(lo, nk), hi):
        out[i - lo] = _output_key(np.int64(r), np.int64(i))


@_inline
def _room(rq, bt, slots, ist, r, n):
    """(row, first column) of request r's next n block slots in bt (VllmScheduler._room): a row of its own, taken
    from the free rows (slots[:ist[NSLOT]]) on its first block. A request past its row (which `longest_request`
    sizes, so never) sets ist[OVER] and writes at its row's start (the run then stops with an error)."""
    s = rq[r, SLOT]
    if s < 0:
        ist[NSLOT] -= 1
        s = slots[ist[NSLOT]]
        rq[r, SLOT] = s
    nb = rq[r, NB]
    rq[r, NB] = nb + n
    if nb + n > bt.shape[1]:
        ist[OVER] = 1
        return s, 0
    return s, nb


@_inline
def _release(rq, bt, slots, blk, fq, meta, ist, r):
    """Free request r's blocks (VllmScheduler._free) and give its row back."""
    s = rq[r, SLOT]
    if s >= 0:
        if rq[r, NB]:
            _free(blk, fq, meta, bt[s, :min(rq[r, NB], bt.shape[1])])
        slots[ist[NSLOT]] = s
        ist[NSLOT] += 1
        rq[r, SLOT] = -1
    rq[r, NB] = 0
    rq[r, CU] = 0


@_inline
def _keys_upto(kbuf, kv, upto, rq, ids, off, r, kn):
    """kbuf[:upto] made to hold request r's keys from block 0, kbuf[:kv] holding them already; returns how many it
    holds."""
    if upto > kv:
        _keys(kbuf[kv:upto], rq, ids, off, r, kv, upto, kn[TB], kn[BS])
        return upto
    return kv


@_stepper
def _allocate(rq, bt, slots, blk, fq, tab, meta, kn, ids, off, kbuf, kv, evbuf, host, htab, hring, hpage, hmeta, hcap,
              ist, r, n, hit, evict, reserve, ext, admit, got):
    """VllmScheduler._allocate: blocks for n more tokens of r after its cache hits `hit` (of which `evict` sit in the
    free queue: `_hit`'s count) and `ext` blocks found in host tiers, or False when they do not fit. `admit`: r
    is taken from the waiting queue with nothing computed (host tiers take its blocks out: got = [loaded from
    DRAM, from SSD]); kbuf[:kv] holds its first kv keys then (the admission's lookup computed them)."""
    bs, mml = kn[BS], kn[MML]
    nh = hit.shape[0]
    computed = rq[r, COMP] + (nh + ext) * bs
    need = min(computed + n, mml)
    nb = rq[r, NB]
    new = (need + bs - 1) // bs - nh - nb
    want = max(new, 0) + evict
    free = meta[FREE]
    tokens = rq[r, PROMPT] + rq[r, OUT]
    if reserve:
        full = max((min(tokens, mml) + bs - 1) // bs - nh - nb, 0)
        if full + evict > free:
            return False
    if want > free:
        return False
    if admit and host:  # the prompt's keys past the pool hit
        nk = rq[r, NKEYS]
        kv = _keys_upto(kbuf, kv, nk, rq, ids, off, r, kn)
        _hq_drain(hmeta)
        _h_admit(htab, hpage, hring, hmeta, kbuf[nh:max(nk, nh)], ext, got)
    known = rq[r, CU]
    if nh:
        _touch(blk, fq, meta, hit)
        if nb == known:
            known += nh
        s, at = _room(rq, bt, slots, ist, r, nh)
        for i in range(nh):  # (a slice assignment would need NRT: it may copy)
            bt[s, at + i] = hit[i]
    if new > 0:
        s, at = _room(rq, bt, slots, ist, r, new)
        nev = _take(blk, fq, tab, meta, bt[s, at:at + new], evbuf)
        if host:
            for e in range(nev):
                _h_place_or_log(htab, hpage, hring, hmeta, hcap, evbuf[e])
    full_blocks = min(computed + n, tokens) // bs
    cu = rq[r, CU]
    if full_blocks > cu:
        lo = cu + max(min(known, full_blocks) - cu, 0)
        if kn[CACHING] and (full_blocks > lo or host):
            if admit:  # cu is 0: the keys are kbuf's, from block 0
                kv = _keys_upto(kbuf, kv, full_blocks, rq, ids, off, r, kn)
                keys = kbuf[:full_blocks]
            else:
                keys = kbuf[:full_blocks - cu]
                _keys(keys, rq, ids, off, r, cu, full_blocks, kn[TB], bs)
            _cache(blk, tab, meta, bt[rq[r, SLOT], lo:full_blocks], keys[lo - cu:])
            if host:  # HostTiers.hashed; the hits' keys are in the pool, which leaves them no host copy
                for i in range(lo - cu, keys.shape[0]):
                    _h_drop_or_log(htab, hpage, hring, hmeta, keys[i])
        rq[r, CU] = full_blocks
    return True


# -- host tiers (kvlab.serving.hosttiers.HostTiers under LRU or FIFO, no per-block history) -------------------------
# A key's place is found in two steps: its trace block (key // block tokens) names a page through the directory
# (htab, a key table of trace blocks), and its offset there an entry of that page (hpage: ring index << 2 | tier,
# -1 where the key is in no tier). A page lives while one of its keys is in a tier. Walks go key after key through
# one trace block, so each remembers the last trace block it looked up (a memo in hmeta: H_MID for placements and
# lookups, H_VID for the keys leaving a ring) and probes the directory once per trace block, not once per key.
@_inline
def _h_at(hmeta, pg, tid, key):
    """Entry of key (of trace block tid) in page pg: the page's first entry + its offset // block size."""
    off = key - tid * hmeta[H_TB]
    s = hmeta[H_BSH]
    return (pg << hmeta[H_WSH]) + (off >> s if s >= 0 else off // hmeta[H_BS])


@_inline
def _h_tid(hmeta, key):
    """Trace block of prompt key `key` (key // block tokens; a shift where they are a power of two: a division is
    some tens of cycles, and host tiers split every key they place, drop or look up)."""
    s = hmeta[H_TSH]
    return key >> s if s >= 0 else key // hmeta[H_TB]


@_inline
def _h_mask(htab):
    """The trace block directory's slot mask (htab: its slots' pairs, blockpool._probe)."""
    return (htab.shape[0] >> 1) - 1


@_inline
def _h_find(htab, hmeta, key, memo):
    """key's entry in hpage (-1: its trace block has no page); memo: H_MID or H_VID."""
    if key < 0:  # an output block's key: never in a host tier
        return -1
    tid = _h_tid(hmeta, key)
    if hmeta[memo] == tid:
        pg = hmeta[memo + 1]
    else:
        e, found = _probe(htab, 0, _h_mask(htab), tid)
        if not found:
            return -1
        pg = htab[e + 1]
        hmeta[memo] = tid
        hmeta[memo + 1] = pg
    return _h_at(hmeta, pg, tid, key)


@_inline
def _h_entry(htab, hpage, hring, hmeta, key):
    """`_h_find` for a key about to be placed: its trace block gets a page (every entry empty) if it has none."""
    e = _h_find(htab, hmeta, key, H_MID)
    if e >= 0:
        return e
    tid = _h_tid(hmeta, key)
    s, _ = _probe(htab, 0, _h_mask(htab), tid)
    nf = hmeta[H_NFREE] - 1
    hmeta[H_NFREE] = nf
    pg = hring[hmeta[H_FREE] + nf]
    w = hmeta[H_WSH]
    for j in range(pg << w, (pg + 1) << w):
        hpage[j] = -1
    htab[s] = tid
    htab[s + 1] = pg
    hring[hmeta[H_OWN] + pg] = tid
    hmeta[H_MID] = tid
    hmeta[H_MPG] = pg
    return _h_at(hmeta, pg, tid, key)


@_inline
def _h_clear(htab, hpage, hring, hmeta, e):
    """Empty entry e; a page left without keys goes back to the free pages and leaves the directory."""
    hpage[e] = -1
    pg = e >> hmeta[H_WSH]
    c = hring[hmeta[H_PCNT] + pg] - 1
    hring[hmeta[H_PCNT] + pg] = c
    if c == 0:
        tid = hring[hmeta[H_OWN] + pg]
        s, _ = _probe(htab, 0, _h_mask(htab), tid)
        _unprobe(htab, 0, _h_mask(htab), s)
        hring[hmeta[H_FREE] + hmeta[H_NFREE]] = pg
        hmeta[H_NFREE] += 1
        if hmeta[H_MID] == tid:
            hmeta[H_MID] = -1
        if hmeta[H_VID] == tid:
            hmeta[H_VID] = -1


@_leaf
def _h_compact(htab, hpage, hring, hmeta, i):
    """Close the gaps (TOMB) of tier i + 1's ring, keeping its order; the pages learn the keys' new places."""
    base, mask = hmeta[H_BASE1 + i], hmeta[H_MASK1 + i]
    w = hmeta[H_HEAD1 + i]
    for p in range(w, hmeta[H_TAIL1 + i]):
        k = hring[base + (p & mask)]
        if k != TOMB:
            if p != w:
                hring[base + (w & mask)] = k
                hpage[_h_find(htab, hmeta, k, H_VID)] = (w & mask) << 2 | (i + 1)
            w += 1
    hmeta[H_TAIL1 + i] = w


@_inline
def _h_append(htab, hpage, hring, hmeta, t, key, e):
    """key (its entry: e) becomes tier t's most recent (t: 1 DRAM, 2 SSD)."""
    i = t - 1
    if hmeta[H_TAIL1 + i] - hmeta[H_HEAD1 + i] > hmeta[H_MASK1 + i]:  # the ring is full: close its gaps
        _h_compact(htab, hpage, hring, hmeta, i)
    p = hmeta[H_TAIL1 + i]
    ix = p & hmeta[H_MASK1 + i]
    hring[hmeta[H_BASE1 + i] + ix] = key
    hmeta[H_TAIL1 + i] = p + 1
    hpage[e] = ix << 2 | t
    hmeta[H_COUNT1 + i] += 1


@_inline
def _h_pop(hring, hmeta, t):
    """Tier t's least recent key, taken off its ring (its entry still names its place)."""
    i = t - 1
    base, mask = hmeta[H_BASE1 + i], hmeta[H_MASK1 + i]
    p = hmeta[H_HEAD1 + i]
    k = hring[base + (p & mask)]
    while k == TOMB:
        p += 1
        k = hring[base + (p & mask)]
    hmeta[H_HEAD1 + i] = p + 1
    hmeta[H_COUNT1 + i] -= 1
    return k


@_inline
def _h_release(htab, hpage, hring, hmeta, e):
    """Take the key of entry e out of its tier (a gap in its ring); returns its tier."""
    v = hpage[e]
    t = v & 3
    i = t - 1
    hring[hmeta[H_BASE1 + i] + (v >> 2)] = TOMB
    hmeta[H_COUNT1 + i] -= 1
    _h_clear(htab, hpage, hring, hmeta, e)
    return t


@_leaf
def _h_place(htab, hpage, hring, hmeta, hcap, key):
    """TierStack.place_many of one key the pool evicted (a prompt block): stored as DRAM's most recent (else SSD's),
    the least recent of a full tier sinking to the next one or dropped past the last."""
    t = 1 if hcap[1] else 2 if hcap[2] else 3
    if t == 3:
        hmeta[H_DROPPED] += 1
        return
    hmeta[M_HD if t == 1 else M_HS] += 1
    e = _h_entry(htab, hpage, hring, hmeta, key)
    hring[hmeta[H_PCNT] + (e >> hmeta[H_WSH])] += 1
    _h_append(htab, hpage, hring, hmeta, t, key, e)
    while hmeta[H_COUNT1 + t - 1] > hcap[t]:  # the tier's least recent leaves
        v = _h_pop(hring, hmeta, t)
        ev = _h_find(htab, hmeta, v, H_VID)
        if t == 1 and hcap[2]:
            hmeta[M_DS] += 1
            _h_append(htab, hpage, hring, hmeta, 2, v, ev)
            t = 2
        else:
            _h_clear(htab, hpage, hring, hmeta, ev)
            hmeta[H_DROPPED] += 1


@_leaf
def _h_drop(htab, hpage, hring, hmeta, key):
    """HostTiers.hashed of one key: the pool hashed it, so a host copy is stale and dropped."""
    e = _h_find(htab, hmeta, key, H_MID)
    if e >= 0 and hpage[e] >= 0:
        _h_release(htab, hpage, hring, hmeta, e)


@_leaf
def _h_run(htab, hpage, hmeta, keys):
    """HostTiers.run: how many leading keys sit in DRAM or SSD."""
    for i in range(keys.shape[0]):
        e = _h_find(htab, hmeta, keys[i], H_MID)
        if e < 0 or hpage[e] < 0:
            return i
    return keys.shape[0]


@_leaf
def _h_admit(htab, hpage, hring, hmeta, keys, run, got):
    """HostTiers.admit without history: every key of keys (the prompt's past its pool hit) found in a host tier is
    taken out; got = [blocks of the first `run` loaded from DRAM, from SSD]."""
    got[0] = 0
    got[1] = 0
    for i in range(keys.shape[0]):
        e = _h_find(htab, hmeta, keys[i], H_MID)
        if e >= 0 and hpage[e] >= 0:
            t = _h_release(htab, hpage, hring, hmeta, e)
            if i < run:
                got[t - 1] += 1
                hmeta[M_DH if t == 1 else M_SH] += 1


@_inline
def _hq_publish(hmeta):
    store_release(hmeta, H_QW, hmeta[H_QWL])


@_inline
def _hq_push(hring, hmeta, v):
    """Log v for the helper (a key to place; ~key: a key to drop), waiting while the log is full."""
    w = hmeta[H_QWL]
    if w - hmeta[H_QRC] > hmeta[H_QMASK]:
        _hq_publish(hmeta)
        r = load_acquire(hmeta, H_QR)
        while w - r > hmeta[H_QMASK]:
            r = load_acquire(hmeta, H_QR)
        hmeta[H_QRC] = r
    hring[hmeta[H_QBASE] + (w & hmeta[H_QMASK])] = v
    hmeta[H_QWL] = w + 1
    if (w + 1) & 63 == 0:
        _hq_publish(hmeta)


@_inline
def _hq_drain(hmeta):
    """Wait until the helper has applied every logged entry (the tiers are then this thread's to read)."""
    if hmeta[H_QON]:
        _hq_publish(hmeta)
        w = hmeta[H_QWL]
        while load_acquire(hmeta, H_QR) != w:
            pass
        hmeta[H_QRC] = w


@_inline
def _h_place_or_log(htab, hpage, hring, hmeta, hcap, key):
    """HostTiers.evicted for one key the pool evicted: placed now, or logged for the helper."""
    if key >= 0:  # prompt blocks: output blocks never reach host tiers
        if hmeta[H_QON]:
            _hq_push(hring, hmeta, key)
        else:
            _h_place(htab, hpage, hring, hmeta, hcap, key)


@_inline
def _h_drop_or_log(htab, hpage, hring, hmeta, key):
    """HostTiers.hashed for one key the pool hashed: dropped now, or logged for the helper."""
    if key >= 0:  # (an output key is in no tier)
        if hmeta[H_QON]:
            _hq_push(hring, hmeta, ~key)
        else:
            _h_drop(htab, hpage, hring, hmeta, key)


@_compiled
def _h_worker(htab, hpage, hring, hmeta, hcap):
    """The helper thread: applies the log in order until told to stop and the log is empty."""
    base, mask = hmeta[H_QBASE], hmeta[H_QMASK]
    r = load_acquire(hmeta, H_QR)
    while True:
        w = load_acquire(hmeta, H_QW)
        if r == w:
            if load_acquire(hmeta, H_QSTOP) and load_acquire(hmeta, H_QW) == r:
                return r
            continue
        while r < w:
            v = hring[base + (r & mask)]
            if v >= 0:
                _h_place(htab, hpage, hring, hmeta, hcap, v)
            else:
                _h_drop(htab, hpage, hring, hmeta, ~v)
            r += 1
        store_release(hmeta, H_QR, r)


# -- queues -------------------------------------------------------------------------------------------------------
@_leaf
def _wq_append(wq, ist, r, left):
    c = wq.shape[0]
    if left:
        ist[WHEAD] = (ist[WHEAD] - 1) % c
        wq[ist[WHEAD]] = r
    else:
        wq[(ist[WHEAD] + ist[WCOUNT]) % c] = r
    ist[WCOUNT] += 1


@_leaf
def _wq_popleft(wq, ist):
    r = wq[ist[WHEAD]]
    ist[WHEAD] = (ist[WHEAD] + 1) % wq.shape[0]
    ist[WCOUNT] -= 1
    return r


@_leaf
def _wq_remove(wq, ist, r):
    c = wq.shape[0]
    h, n = ist[WHEAD], ist[WCOUNT]
    j = 0
    while wq[(h + j) % c] != r:
        j += 1
    for i in range(j, n - 1):
        wq[(h + i) % c] = wq[(h + i + 1) % c]
    ist[WCOUNT] -= 1


@_leaf
def _run_remove(run, ist, r):
    n = ist[NRUN]
    j = 0
    while run[j] != r:
        j += 1
    for i in range(j, n - 1):
        run[i] = run[i + 1]
    ist[NRUN] -= 1


# -- the heap of arrivals (time, request) -------------------------------------------------------------------------
@_leaf
def _less(ht, hr, i, j):
    return ht[i] < ht[j] or (ht[i] == ht[j] and hr[i] < hr[j])


@_leaf
def _push(ht, hr, ist, t, r):
    i = ist[NARR]
    ist[NARR] += 1
    ht[i] = t
    hr[i] = r
    while i > 0:
        p = (i - 1) >> 1
        if not _less(ht, hr, i, p):
            break
        ht[i], ht[p] = ht[p], ht[i]
        hr[i], hr[p] = hr[p], hr[i]
        i = p


@_leaf
def _pop(ht, hr, ist):
    t, r = ht[0], hr[0]
    n = ist[NARR] - 1
    ist[NARR] = n
    ht[0], hr[0] = ht[n], hr[n]
    i = 0
    while True:
        c = 2 * i + 1
        if c >= n:
            break
        if c + 1 < n and _less(ht, hr, c + 1, c):
            c += 1
        if not _less(ht, hr, c, i):
            break
        ht[i], ht[c] = ht[c], ht[i]
        hr[i], hr[c] = hr[c], hr[i]
        i = c
    return t, r


# -- the scheduler (VllmScheduler) --------------------------------------------------------------------------------
@_stepper
def _preempt(rq, bt, slots, blk, fq, meta, wq, ist, r):
    _release(rq, bt, slots, blk, fq, meta, ist, r)
    rq[r, COMP] = 0
    rq[r, STALE] = rq[r, INFL]
    rq[r, PH] = 0
    rq[r, PRE] += 1
    ist[PREEMPTS] += 1
    rq[r, WHERE] = 1
    _wq_append(wq, ist, r, True)


@_leaf
def _entry(bat, bcnt, b, r, n, decode, hit):
    e = bcnt[b]
    bat[b, e, B_RID] = r
    bat[b, e, B_N] = n
    bat[b, e, B_SAMPLE] = 0
    bat[b, e, B_DECODE] = decode
    bat[b, e, B_HIT] = hit
    bat[b, e, B_DRAM] = -1
    bcnt[b] = e + 1


@_stepper
def _schedule(rq, bt, slots, blk, fq, tab, meta, kn, ids, off, kbuf, hbuf, evbuf, skip, host, htab, hring, hpage, hmeta,
              hcap, got, wq, run, ist, bat, bcnt, b, pre):
    """VllmScheduler.schedule into batch buffer b; the requests it preempted go to pre[:ist[NPRE]]."""
    bcnt[b] = 0
    ist[NPRE] = 0
    bs, mml, caching = kn[BS], kn[MML], kn[CACHING]
    budget = kn[MNBT]
    threshold = kn[LPT] if ist[NRUN] + ist[WCOUNT] > 1 else 0
    i = 0
    while i < ist[NRUN] and budget > 0:
        r = run[i]
        c, ph, tok = rq[r, COMP], rq[r, PH], rq[r, PROMPT] + rq[r, OUT]
        if ph > 0 and c + 2 - ph >= rq[r, PROMPT] + rq[r, MAXT]:
            i += 1  # async: the step in flight already produces its last token
            continue
        n = tok + ph - c
        if (n == 1 and c + 1 < mml and rq[r, NB] * bs > c
                and (not caching or min(c + 1, tok) // bs <= rq[r, CU])):
            _entry(bat, bcnt, b, r, 1, 1 if tok + ph > rq[r, PROMPT] else 0, -1)
            budget -= 1
            i += 1
            continue
        if 0 < threshold < n:
            n = threshold
        n = min(n, budget, mml - 1 - rq[r, COMP])
        if n <= 0:
            i += 1
            continue
        ok = True
        while not _allocate(rq, bt, slots, blk, fq, tab, meta, kn, ids, off, kbuf, 0, evbuf, host, htab, hring, hpage,
                            hmeta, hcap, ist, r, n, hbuf[:0], 0, False, 0, False, got):
            ist[NRUN] -= 1
            victim = run[ist[NRUN]]
            _preempt(rq, bt, slots, blk, fq, meta, wq, ist, victim)
            pre[ist[NPRE]] = victim
            ist[NPRE] += 1
            if victim == r:
                ok = False
                break
        if not ok:
            break
        _entry(bat, bcnt, b, r, n, 1 if n == 1 and rq[r, OUT] + rq[r, PH] > 0 else 0, -1)
        budget -= n
        i += 1
    stuck = ist[NPRE] == 0
    if ist[NPRE] == 0:
        nskip = 0
        while ist[WCOUNT] > 0 and budget > 0 and ist[NRUN] < kn[MNS]:
            r = wq[ist[WHEAD]]
            if rq[r, STALE]:  # preempted with output still in flight: passed over until it lands
                _wq_popleft(wq, ist)
                skip[nskip] = r
                nskip += 1
                continue
            tokens = rq[r, PROMPT] + rq[r, OUT]
            nh = held = ext = kv = 0
            admit = rq[r, COMP] == 0 and caching != 0
            if admit:
                kv = (tokens - 1) // bs
                keys = kbuf[:kv]
                _keys(keys, rq, ids, off, r, 0, keys.shape[0], kn[TB], bs)
                if rq[r, FAILED] and kn[RESERVE]:
                    # full-input admission fails iff its blocks less the hits held exceed the free blocks: a head
                    # that failed before stops its walk once that is certain (a failed admission changes nothing
                    # and stops admission, as this does)
                    need = (min(tokens, mml) + bs - 1) // bs - meta[FREE]
                    nh, held, short = _hit_held(tab, blk, keys, hbuf, need)
                    if short:
                        break
                else:
                    nh = _hit(tab, keys, hbuf)
                    held = nh - _idle(blk, hbuf[:nh])
                if host:  # the run continues in DRAM / SSD
                    _hq_drain(hmeta)
                    ext = _h_run(htab, hpage, hmeta, keys[nh:])
            n = whole = tokens - (nh + ext) * bs - rq[r, COMP]
            if 0 < threshold < n:
                n = threshold
            if not kn[CHUNKED] and n > budget:
                break
            n = min(n, budget)
            if not _allocate(rq, bt, slots, blk, fq, tab, meta, kn, ids, off, kbuf, kv, evbuf, host, htab, hring,
                             hpage, hmeta, hcap, ist, r, n, hbuf[:nh], nh - held, kn[RESERVE] != 0, ext, admit, got):
                stuck = kn[RESERVE] != 0 or (n == whole and ext == 0)
                rq[r, FAILED] = 1
                break
            _wq_popleft(wq, ist)
            rq[r, COMP] += (nh + ext) * bs
            if rq[r, HIT] < 0:
                rq[r, HIT] = rq[r, COMP]
            run[ist[NRUN]] = r
            ist[NRUN] += 1
            rq[r, WHERE] = 2
            _entry(bat, bcnt, b, r, n, 0, rq[r, COMP])
            if ext:
                bat[b, bcnt[b] - 1, B_DRAM] = got[0]
                bat[b, bcnt[b] - 1, B_SSD] = got[1]
            budget -= n
        for q in range(nskip - 1, -1, -1):
            _wq_append(wq, ist, skip[q], True)
        stuck = stuck and nskip == 0
    for e in range(bcnt[b]):
        r, n = bat[b, e, B_RID], bat[b, e, B_N]
        rq[r, COMP] += n
        rq[r, INFL] += n
        if rq[r, COMP] >= rq[r, PROMPT] + rq[r, OUT] + rq[r, PH]:
            bat[b, e, B_SAMPLE] = 1
            if kn[ASYNC]:
                rq[r, PH] += 1
    ist[STUCK] = 1 if stuck else 0
    ist[STUCK_FREE] = meta[FREE]
    ist[STUCK_NRUN] = ist[NRUN]


@_leaf
def _leave(rq, rt, nxt, gap, ht, hr, ist, fst, r, now):
    """Request r leaves the system at `now` (EventLoop.leave): its session's next turn is pushed."""
    fst[AREA] += ist[IN_SYS] * (now - fst[LAST_T])
    fst[LAST_T] = now
    ist[IN_SYS] -= 1
    if nxt[r] >= 0:
        _push(ht, hr, ist, now + gap[r], nxt[r])
    ist[DONE] += 1


@_stepper
def _update(rq, rt, bt, slots, blk, fq, meta, kn, wq, run, ist, fst, bat, bcnt, b, nxt, gap, ht, hr, now):
    """VllmScheduler.update of batch b at `now`, with VllmReplica._apply's and EventLoop.finish's bookkeeping."""
    for e in range(bcnt[b]):
        r, n = bat[b, e, B_RID], bat[b, e, B_N]
        rq[r, INFL] -= n
        stale = rq[r, STALE] > 0
        if stale:
            rq[r, STALE] -= n
        if rq[r, FIN] or not bat[b, e, B_SAMPLE]:
            continue
        if not stale and rq[r, PH] > 0:
            rq[r, PH] -= 1
        rq[r, OUT] += 1
        if rq[r, OUT] == 1:
            rt[r, FIRST] = now
        if rq[r, OUT] >= rq[r, MAXT] or rq[r, PROMPT] + rq[r, OUT] >= kn[MML]:
            rq[r, FIN] = 1
            rt[r, FINISH] = now
            rq[r, GEN] = rq[r, OUT]
            if rq[r, WHERE] == 2:
                _run_remove(run, ist, r)
            else:
                _wq_remove(wq, ist, r)
            rq[r, WHERE] = 0
            _release(rq, bt, slots, blk, fq, meta, ist, r)
            fst[T_END] = max(fst[T_END], now)
            _leave(rq, rt, nxt, gap, ht, hr, ist, fst, r, now)


@_leaf
def _decode_room(rq, kn, run, ist, meta, bat, bcnt, most):
    """VllmScheduler.decode_room for the step in flight."""
    if not ist[INFL_ON]:
        return 0
    b = ist[INFL_B]
    if bcnt[b] != ist[NRUN]:
        return 0
    for e in range(bcnt[b]):
        if not bat[b, e, B_DECODE]:
            return 0
    if ist[WCOUNT] and not (ist[STUCK] and ist[STUCK_FREE] == meta[FREE] and ist[STUCK_NRUN] == ist[NRUN]):
        return 0
    extra = 0 if kn[ASYNC] else 1
    mml = kn[MML]
    k = most
    for i in range(ist[NRUN]):
        r = run[i]
        g = rq[r, OUT] + rq[r, PH] + extra
        k = min(k, min(rq[r, MAXT], mml - rq[r, PROMPT]) - g)
        if k <= 0:
            return 0
    return k


# rows of a decode stretch's work array (`_skip_decodes`): per request taking part (in running order) its id, tokens
# computed, tokens it will hold (prompt + output, + 1 when synchronous), blocks held, blocks hashed, blocks hashed
# when the stretch began (its segment's first), prompt keys, then the segments' and prompt keys' offsets ([na + 1])
(W_RID, W_C1, W_T1, W_NB, W_CU, W_CU0, W_NK, W_SOFF, W_KOFF) = range(9)


@_leaf
def _stretch_rows(rq, kn, run, ist, m, w):
    """The requests of a decode stretch of up to m steps that take or hash a block in it, into w's rows; returns
    how many."""
    bs, caching = kn[BS], kn[CACHING]
    extra = 0 if kn[ASYNC] else 1
    na = 0
    w[W_SOFF, 0] = w[W_KOFF, 0] = 0
    for j in range(ist[NRUN]):
        r = run[j]
        first = rq[r, NB] * bs - rq[r, COMP] + 1
        if caching:
            first = min(first, (rq[r, CU] + 1) * bs - (rq[r, PROMPT] + rq[r, OUT] + extra) + 1)
        if first > m:
            continue
        w[W_RID, na] = r
        w[W_C1, na] = rq[r, COMP]
        w[W_T1, na] = rq[r, PROMPT] + rq[r, OUT] + extra
        w[W_NB, na] = rq[r, NB]
        w[W_CU, na] = w[W_CU0, na] = rq[r, CU]
        w[W_NK, na] = rq[r, NKEYS]
        cap = rq[r, NB] - rq[r, CU] + m // bs + 2
        w[W_SOFF, na + 1] = w[W_SOFF, na] + cap
        w[W_KOFF, na + 1] = w[W_KOFF, na] + max(min(rq[r, NKEYS], rq[r, CU] + cap) - rq[r, CU], 0)
        na += 1
    return na


@_leaf
def _stretch_fill(rq, bt, ids, off, kn, w, na, seg, pk):
    """Each request's segment (its blocks from the first unhashed on) and the prompt keys it may hash."""
    for q in range(na):
        r, lo = w[W_RID, q], w[W_CU0, q]
        s0, k0, k1 = w[W_SOFF, q], w[W_KOFF, q], w[W_KOFF, q + 1]
        n = w[W_NB, q] - lo
        s = rq[r, SLOT]
        for i in range(n):
            seg[s0 + i] = bt[s, lo + i]
        if k1 > k0:
            _keys(pk[k0:k1], rq, ids, off, r, lo, lo + k1 - k0, kn[TB], kn[BS])


@_leaf
def _stretch_back(rq, bt, slots, ist, w, na, seg, log, ne, htab, hring, hpage, hmeta, hcap):
    """A stretch's outcome back into the requests' rows, and its log (keys evicted, keys hashed, in order) told to
    the host tiers (ne: log entries; 0 without host tiers)."""
    for e in range(ne):
        if log[0, e] == EVICTED:
            _h_place_or_log(htab, hpage, hring, hmeta, hcap, log[2, e])
        else:
            _h_drop_or_log(htab, hpage, hring, hmeta, log[2, e])
    for q in range(na):
        r = w[W_RID, q]
        add = w[W_NB, q] - rq[r, NB]
        if add:
            lo = w[W_SOFF, q] + rq[r, NB] - w[W_CU0, q]
            s, at = _room(rq, bt, slots, ist, r, add)
            for i in range(add):
                bt[s, at + i] = seg[lo + i]
        rq[r, CU] = w[W_CU, q]


@_leaf
def _stretch_end(rq, run, ist, m):
    for j in range(ist[NRUN]):
        r = run[j]
        rq[r, COMP] += m
        rq[r, OUT] += m


@_leaf
def _stretch(rq, bt, slots, blk, fq, tab, meta, kn, ids, off, ist, m, host, htab, hring, hpage, hmeta, hcap, w, na,
             seg, pk, scratch, log, heap, grp):
    """A stretch of up to m decode steps for the na requests in w, given buffers of its size: returns the steps
    applied, or -1."""
    _stretch_fill(rq, bt, ids, off, kn, w, na, seg, pk)
    m, ne, _ = _decode_steps(blk, fq, tab, meta, m, kn[BS], kn[MML], kn[CACHING] != 0, w[W_C1, :na], w[W_T1, :na],
                             w[W_NB, :na], w[W_CU, :na], w[W_RID, :na], w[W_NK, :na], w[W_CU0, :na], seg, w[W_SOFF],
                             pk, w[W_KOFF], scratch, log, host != 0, heap, grp)
    if m >= 0:
        _stretch_back(rq, bt, slots, ist, w, na, seg, log, ne, htab, hring, hpage, hmeta, hcap)
    return m


@_compiled
def _stretch_sized(rq, bt, slots, blk, fq, tab, meta, kn, ids, off, ist, m, host, htab, hring, hpage, hmeta, hcap, w,
                   na, heap, grp):
    """`_stretch` with buffers allocated to its size: for a stretch past the loop's (prefix caching off, say)."""
    n = w[W_SOFF, na]
    return _stretch(rq, bt, slots, blk, fq, tab, meta, kn, ids, off, ist, m, host, htab, hring, hpage, hmeta, hcap, w,
                    na, np.empty(n, np.int64), np.empty(w[W_KOFF, na], np.int64), np.empty(n + 1, np.int64),
                    np.empty((3, 2 * n if host else 0), np.int64), heap, grp)


@_stepper
def _skip_decodes(rq, bt, slots, blk, fq, tab, meta, kn, ids, off, run, ist, m, host, htab, hring, hpage, hmeta, hcap,
                  sw, sbuf, slog):
    """VllmScheduler.skip_decodes: up to m decode steps of the running batch at once; returns how many (fewer
    where the free queue runs short), or -1 when a request outgrew its segment. The loop's buffers (sw: the work
    rows, then a heap and a group of [MNS + 2]; sbuf: segments, prompt keys and scratch of S, S and S + 1; slog:
    [3, 2S] or [3, 0] without host tiers) hold a stretch of every running request's next S / (MNS + 1) blocks; a
    longer one allocates its own."""
    na = _stretch_rows(rq, kn, run, ist, m, sw)
    if na:
        size = (sbuf.shape[0] - 1) // 3
        heap, grp = sw[W_KOFF + 1, :na], sw[W_KOFF + 2, :na]
        if sw[W_SOFF, na] <= size and sw[W_KOFF, na] <= size:
            m = _stretch(rq, bt, slots, blk, fq, tab, meta, kn, ids, off, ist, m, host, htab, hring, hpage, hmeta,
                         hcap, sw, na, sbuf[:size], sbuf[size:2 * size], sbuf[2 * size:], slog, heap, grp)
        else:
            m = _stretch_sized(rq, bt, slots, blk, fq, tab, meta, kn, ids, off, ist, m, host, htab, hring, hpage,
                               hmeta, hcap, sw, na, heap, grp)
        if m < 0:
            return -1
    _stretch_end(rq, run, ist, m)
    return m


# -- the replica's step and the event loop ------------------------------------------------------------------------
@_stepper
def _step(rq, rt, bt, slots, blk, fq, tab, meta, kn, ids, off, kbuf, hbuf, evbuf, skip, host, htab, hring, hpage, hmeta,
          hcap, hread, got, wq, run, ist, fst, bat, bcnt, pre, nxt, gap, ht, hr, kind, pp, wbt, kv_at, fl_at, win,
          whole, pn, pc, dc, flbuf, dts, kvs, fls, sw, sbuf, slog, now):
    """VllmReplica.step and EventLoop.step_vllm at `now`: apply what is due, schedule, price, fast-forward."""
    asy = kn[ASYNC]
    if ist[INFL_ON] and not asy:
        _update(rq, rt, bt, slots, blk, fq, meta, kn, wq, run, ist, fst, bat, bcnt, ist[INFL_B], nxt, gap, ht, hr, now)
        ist[INFL_ON] = 0
    b = 1 - ist[INFL_B]
    _schedule(rq, bt, slots, blk, fq, tab, meta, kn, ids, off, kbuf, hbuf, evbuf, skip, host, htab, hring, hpage, hmeta,
              hcap, got, wq, run, ist, bat, bcnt, b, pre)
    if bcnt[b] == 0 and ist[INFL_ON]:
        for q in range(ist[NPRE]):  # a first try may preempt and still schedule nothing: those preemptions stand
            rq[pre[q], APRE] += 1
        _update(rq, rt, bt, slots, blk, fq, meta, kn, wq, run, ist, fst, bat, bcnt, ist[INFL_B], nxt, gap, ht, hr, now)
        ist[INFL_ON] = 0
        _schedule(rq, bt, slots, blk, fq, tab, meta, kn, ids, off, kbuf, hbuf, evbuf, skip, host, htab, hring, hpage,
                  hmeta, hcap, got, wq, run, ist, bat, bcnt, b, pre)
    if ist[INFL_ON]:
        _update(rq, rt, bt, slots, blk, fq, meta, kn, wq, run, ist, fst, bat, bcnt, ist[INFL_B], nxt, gap, ht, hr, now)
    if bcnt[b] > 0:
        ist[INFL_ON] = 1
        ist[INFL_B] = b
    else:
        ist[INFL_ON] = 0
    npf = 0
    nd = 0
    tb = kn[TB]
    load_s = 0.0  # seconds loading host-tier hits into HBM
    for e in range(bcnt[b]):
        r, n = bat[b, e, B_RID], bat[b, e, B_N]
        if bat[b, e, B_HIT] >= 0:
            c = bat[b, e, B_HIT]
            d, sd = bat[b, e, B_DRAM], bat[b, e, B_SSD]
            if rt[r, START] < 0:
                rt[r, START] = now
                rq[r, HITTOK] = c
                if d >= 0:  # the run's tail came from DRAM / SSD
                    bs = kn[BS]
                    rq[r, TIERTOK] = c - (d + sd) * bs
                    rq[r, TIERTOK + 1] = d * bs
                    rq[r, TIERTOK + 2] = sd * bs
                    for q in range(3):
                        rq[r, TIERBLK + q] = rq[r, TIERTOK + q] // tb
                else:
                    rq[r, TIERTOK] = c
                    rq[r, TIERBLK] = c // tb if kn[HAS_PREFIXES] else 0
            if d >= 0:
                load_s += d * hread[1] + sd * hread[2]
        else:
            c = rq[r, COMP] - n
        if bat[b, e, B_DECODE]:
            dc[nd] = c
            nd += 1
        else:
            pn[npf] = n
            pc[npf] = c
            npf += 1
    for q in range(ist[NPRE]):
        rq[pre[q], APRE] += 1
    if npf == 0 and nd == 0:
        fst[BUSY_UNTIL] = -1.0
        return 0
    dt = _price(kind, pp, wbt, kv_at, fl_at, win, whole, pn, pc, npf, dc, nd, 0, flbuf) + load_s
    if kn[FAST] and npf == 0:
        k = _decode_room(rq, kn, run, ist, meta, bat, bcnt, FAST_FORWARD_STEPS)
        if k > 0:
            closed = ist[WCOUNT] > 0 and ist[STUCK] and ist[STUCK_FREE] == meta[FREE] and ist[STUCK_NRUN] == ist[NRUN]
            h = math.inf if closed or ist[NARR] == 0 else ht[0]
            if now + dt < h:  # EventLoop.skip_vllm
                dts[0] = dt
                m = 0
                t = now + dt
                priced = 0  # dts[1:priced + 1] are priced, in growing chunks (a stretch often ends early)
                chunk = FAST_FORWARD_CHUNK
                while m < k and t < h:
                    m += 1
                    if m > priced:
                        cnt = min(chunk, k - priced)
                        _price_run(kind, pp, wbt, kv_at, fl_at, win, whole, pn, pc, dc, nd, priced + 1, cnt, dts,
                                   kvs, fls, flbuf)
                        priced += cnt
                        chunk *= 2
                    t += dts[m]
                m = _skip_decodes(rq, bt, slots, blk, fq, tab, meta, kn, ids, off, run, ist, m, host, htab, hring,
                                  hpage, hmeta, hcap, sw, sbuf, slog)
                if m < 0:
                    return -1
                if m:
                    for j in range(m):
                        fst[BUSY_S] += dts[j]
                        now += dts[j]
                    ist[STEPS] += m
                    dt = dts[m]
    fst[BUSY_UNTIL] = now + dt
    fst[BUSY_S] += dt
    ist[STEPS] += 1
    fst[END_T] = now + dt
    ist[HAS_END] = 1
    return 0


@_compiled
def _run(rq, rt, refuse, nxt, gap, ids, off, kn, kind, pp, wbt, kv_at, fl_at, win, whole, ht, hr, wq, run, bat, bcnt,
         pre, blk, fq, tab, meta, bt, slots, htab, hring, hpage, hmeta, hcap, hread, ist, fst, sw, sbuf, slog,
         stop_done):
    """EventLoop.run for one replica until `stop_done` requests have left or nothing is left; returns 0 when the
    run is over, 1 when stopped early (call again to go on), 2 when requests are left that can never be scheduled,
    3 when a decode stretch outgrew its segment. sw, sbuf, slog: a decode stretch's buffers (`stretch_buffers`)."""
    nbmax = kn[NBMAX]
    kbuf = np.empty(nbmax, np.int64)  # keys of one request's blocks
    hbuf = np.empty(nbmax, np.int64)  # its cache hits
    evbuf = np.empty(nbmax, np.int64)  # keys a take evicts (unread without host tiers)
    skip = np.empty(wq.shape[0], np.int64)  # waiting requests an admission passes over
    host = hcap[1] + hcap[2] > 0  # DRAM / SSD behind the pool
    got = np.zeros(2, np.int64)  # blocks an admission loaded from DRAM, SSD
    mns = kn[MNS] + 1
    pn, pc, dc = np.empty(mns, np.int64), np.empty(mns, np.int64), np.empty(mns, np.int64)
    flbuf = np.empty(2 * mns + 8, np.float64)  # a step's FLOP terms, then fsum's partials
    dts = np.empty(FAST_FORWARD_STEPS + 2, np.float64)  # a stretch's step seconds
    kvs, fls = np.empty(FAST_FORWARD_STEPS + 2, np.int64), np.empty(FAST_FORWARD_STEPS + 2, np.int64)
    while ist[NARR] > 0 or ist[HAS_END] or ist[DUE]:
        if ist[DONE] >= stop_done:
            return 1
        t_arr = ht[0] if ist[NARR] > 0 else math.inf
        t_next = min(t_arr, fst[END_T] if ist[HAS_END] else math.inf)
        if ist[DUE] and t_next > fst[DUE_T]:
            ist[DUE] = 0
            if _step(rq, rt, bt, slots, blk, fq, tab, meta, kn, ids, off, kbuf, hbuf, evbuf, skip, host, htab, hring,
                     hpage, hmeta, hcap, hread, got, wq, run, ist, fst, bat, bcnt, pre, nxt, gap, ht, hr, kind, pp, wbt,
                     kv_at, fl_at, win, whole, pn, pc, dc, flbuf, dts, kvs, fls, sw, sbuf, slog, fst[DUE_T]) < 0 or \
                    ist[OVER]:
                return 3
            continue
        if ist[HAS_END] and (ist[NARR] == 0 or fst[END_T] <= t_arr):  # ends before arrivals of the same time
            now = fst[END_T]
            ist[HAS_END] = 0
            r = -1
        else:
            now, r = _pop(ht, hr, ist)
        if not ist[HAVE_T0]:
            ist[HAVE_T0] = 1
            fst[LAST_T] = fst[T0] = now
        fst[DUE_T] = now
        if r < 0:
            ist[DUE] = 1
            continue
        # EventLoop.arrive
        rt[r, ARR] = now
        fst[AREA] += ist[IN_SYS] * (now - fst[LAST_T])
        fst[LAST_T] = now
        ist[IN_SYS] += 1
        if refuse[r]:
            rq[r, FIN] = 2
            _leave(rq, rt, nxt, gap, ht, hr, ist, fst, r, now)
            continue
        rq[r, WHERE] = 1
        _wq_append(wq, ist, r, False)
        if fst[BUSY_UNTIL] < 0:
            ist[DUE] = 1
    if ist[NRUN] or ist[WCOUNT]:
        return 2
    return 0


# -- the Python side ----------------------------------------------------------------------------------------------
def request_tokens(trace, knobs) -> np.ndarray:
    """[R] the most tokens each request of `trace` can hold (prompt + output, capped at max_model_len)."""
    return np.minimum(np.asarray(trace.input_tokens, np.int64)
                      + np.maximum(np.asarray(trace.output_tokens, np.int64), 1), knobs.max_model_len)


def longest_request(trace, knobs) -> int:
    """The most tokens a request of `trace` can hold."""
    return int(np.max(request_tokens(trace, knobs))) if len(trace) else 1


def unsupported(cfg, model, trace, knobs, *, host, logging: bool) -> str | None:
    """Why this run needs the Python loop (None: the compiled loop runs it). `host`: the replica's HostTiers or
    None."""
    from .stepmodel import AffineStepModel
    from .steptime.roofline import TABLE_MAX, Roofline
    if not ENABLED:
        return "numba is off"
    if cfg.replicas != 1:
        return "several replicas"
    if host is not None and (host.stack.history or set(host.stack.policies[1:]) - {"lru", "fifo"}):
        return "host tiers with an admission rule, a TTL or a policy other than LRU / FIFO"
    if host is not None and (max(host.stack.cap[1:]) >= RING_MAX // 4 or not _pages_fit(trace, knobs)):
        return "host tiers past 2^27 blocks, or trace blocks whose KV block offsets differ between requests"
    if logging:
        return "a per-step log"
    if type(model) is Roofline:
        if longest_request(trace, knobs) + 1 >= TABLE_MAX:
            return "contexts past the roofline's tables"
        return None
    if type(model) is AffineStepModel:
        return None
    return f"step times from {type(model).__name__}"


def _pages_fit(trace, knobs) -> bool:
    """Whether each trace block's prompt keys fall on distinct entries of its host-tier or key-table page (offset
    // block size): always when the block size divides the trace's block tokens, else when every trace block sits at
    one place in the requests naming it (as kvlab's traces do: a trace block names everything before it too)."""
    tb, bs = trace.block_tokens, knobs.block_size
    if tb % bs == 0 or trace.block_ids is None or not len(trace.block_ids):
        return True
    off = np.asarray(trace.block_offsets, np.int64)
    ids = np.asarray(trace.block_ids, np.int64)
    pos = np.arange(len(ids)) - np.repeat(off[:-1], np.diff(off))  # [A] each access's place in its request
    res = (pos * tb) % bs  # [A] its keys' offsets, modulo the block size, are a function of this
    order = np.lexsort((res, ids))
    ids, res = ids[order], res[order]
    return not np.any((ids[1:] == ids[:-1]) & (res[1:] != res[:-1]))


def _pricing(model, trace, knobs):
    """(kind, float parameters, weight bytes by step tokens, KV bytes by context, decode FLOPs by context, windows)
    for the compiled pricing of `model` (AffineStepModel or Roofline)."""
    from .stepmodel import AffineStepModel
    none_i, none_f = np.zeros(1, np.int64), np.zeros(1)
    win = np.zeros((0, 2), np.int64)
    if isinstance(model, AffineStepModel):
        pp = np.array([model.overhead_s, model.prefill_token_s, model.decode_request_s, model.context_token_s, 0, 0],
                      float)
        return AFFINE, pp, none_f, none_i, none_f, win
    model._tables([longest_request(trace, knobs) + 1], [])  # every context a step of this trace can price
    kv_at, fl_at = model._kv_np, model._fl_np
    if kv_at.dtype != np.int64:
        kv_at = kv_at.astype(np.int64)
    wbt = np.array([model.weight_read_bytes(t) for t in range(knobs.max_num_batched_tokens + 1)], float)
    kind = ROOFLINE_V4 if model.v4 is not None else ROOFLINE
    per_key = 0
    if model.v4 is None:
        model._keys_flops(np.ones(1))  # groups the layers by window
        win = np.array([[w or 0, n] for w, n in model._windows.items()], np.int64).reshape(-1, 2)
        per_key = model._per_key
    pp = np.array([model.overhead_ms, 2 * model.active_params(), model.tp,
                   model.gpu.hbm_bytes_per_s * model.memory_efficiency, model.peak * model.compute_efficiency,
                   per_key], float)
    return kind, pp, wbt, kv_at, np.asarray(fl_at, float), win


def prompt_key_counts(trace, block_size: int, caching: bool) -> np.ndarray:
    """[R] how many full prompt blocks of each request have keys (len(kvlab.serving.replica.prompt_keys)); 0
    without prefix information."""
    R = len(trace)
    if not caching:
        return np.zeros(R, np.int64)
    inp = np.asarray(trace.input_tokens, np.int64)
    T = np.diff(np.asarray(trace.block_offsets, np.int64))  # [R] trace blocks per request
    span = T * trace.block_tokens - block_size  # keys end at or before the trace's last block
    return np.where(span >= 0, np.minimum(inp // block_size, span // block_size + 1), 0).astype(np.int64)


def stretch_buffers(knobs, host: bool):
    """A decode stretch's buffers for `_skip_decodes`: work rows, heap and group for every running request, and
    segments, prompt keys, scratch and log (host tiers only) for each one's next FAST_FORWARD_STEPS // block size +
    STRETCH_ROOM blocks (a stretch needing more, prefix caching off say, allocates its own)."""
    mns = knobs.max_num_seqs + 1
    size = mns * max(FAST_FORWARD_STEPS // knobs.block_size + STRETCH_ROOM, 0)
    return (np.empty((W_KOFF + 3, mns + 1), np.int64), np.empty(3 * size + 1, np.int64),
            np.empty((3, 2 * size if host else 0), np.int64))


def key_table(trace, knobs) -> np.ndarray:
    """The pool's key table for a whole run (blockpool.new_key_table: pages of a trace block's keys), sized once: a
    page lives while a block is cached under one of its keys, so there are never more pages than the pool has
    blocks, nor than the trace has blocks to hash; the directory is at most half full and nothing grows in the
    loop. Pages hold up to a trace block's keys, fewer where the pages' room would pass KEY_PAGES_BYTES (it is
    allocated lazily: what the run touches is its live pages). A trace block's keys step by the block size when
    it sits at one place in every request naming it (`_pages_fit`), else by one token."""
    bs = knobs.block_size
    blocks = int(np.sum((request_tokens(trace, knobs) + bs - 1) // bs))
    pages = min(knobs.num_blocks, blocks) + 1
    p = max(min(PAGE_MAX, KEY_PAGES_BYTES // (8 * pages) - 1), 1)
    return new_key_table(pages, max(int(trace.block_tokens or 1), 1), bs if _pages_fit(trace, knobs) else 1,
                         page_max=p)


def host_state(hcap, block_tokens: int, block_size: int, trace_blocks: int):
    """The compiled host tiers' empty state for tiers of hcap[1], hcap[2] blocks: (trace block directory, rings
    and page records, pages, hmeta); `block_tokens`: the trace's block tokens; `block_size`: the pool's tokens per
    KV block; `trace_blocks`: at most how many trace blocks the run names (pages: one per trace block with a key in
    a tier, so at most the tiers' blocks or this, whichever is fewer). Pages are allocated lazily (np.empty): a page
    is written when a trace block first takes it."""
    size = [1 << int(2 * c + 2).bit_length() for c in hcap[1:]]  # a ring per tier, over twice its blocks
    if max(size) > RING_MAX:  # `unsupported` sends such runs to the Python loop
        raise ValueError(f"host tiers of {int(hcap[1]):,} and {int(hcap[2]):,} blocks: past the compiled rings")
    pages = int(min(hcap[1] + hcap[2], max(trace_blocks, 0))) + 1
    width = max(-(-block_tokens // block_size) - 1, 0).bit_length()  # log2 of a page's entries
    slots = 1 << max(int(2 * (pages + 2)).bit_length(), 4)  # the directory, at most half full
    htab = np.full(2 * slots, -1, np.int64)  # [2S] the directory (blockpool._probe): trace block, page
    hmeta = np.zeros(H_SIZE, np.int64)
    hmeta[H_BASE2] = size[0]
    hmeta[H_MASK1], hmeta[H_MASK2] = size[0] - 1, size[1] - 1
    hmeta[H_TB], hmeta[H_BS], hmeta[H_WSH] = block_tokens, block_size, width
    hmeta[H_TSH], hmeta[H_BSH] = shift_of(int(block_tokens)), shift_of(int(block_size))
    hmeta[H_OWN] = sum(size)
    hmeta[H_PCNT] = hmeta[H_OWN] + pages
    hmeta[H_FREE] = hmeta[H_PCNT] + pages
    hmeta[H_NFREE] = pages
    hmeta[H_MID] = hmeta[H_VID] = -1
    hring = np.empty(sum(size) + 3 * pages + QLOG, np.int64)
    hmeta[H_QBASE], hmeta[H_QMASK] = sum(size) + 3 * pages, QLOG - 1
    hring[hmeta[H_PCNT]:hmeta[H_FREE]] = 0
    hring[hmeta[H_FREE]:hmeta[H_FREE] + pages] = np.arange(pages - 1, -1, -1)  # page 0 taken first
    return htab, hring, np.empty(pages << width, np.int32), hmeta


def run_compiled(trace, a, knobs, model, arrivals, nxt, gap, refuse, *, caching: bool, fast_forward: bool, host=None,
                 progress=None):
    """Run the whole trace through one replica in the compiled loop, filling the simulator's arrays `a`; returns
    (steps, area, t0, t_end, busy seconds, preemptions, bytes moved between tiers). `host`: the replica's HostTiers
    (None: no host tier); `progress`: an object with update(n) (tqdm)."""
    from ..errors import ParameterError
    R = len(trace)
    rq = np.zeros((R, RQ_COLS), np.int64)
    rq[:, PROMPT] = a.input
    rq[:, MAXT] = a.output
    rq[:, HIT] = -1
    rq[:, SLOT] = -1
    rq[:, NKEYS] = prompt_key_counts(trace, knobs.block_size, caching)
    rt = np.full((R, 4), np.nan)
    rt[:, START] = -1.0
    kind, pp, wbt, kv_at, fl_at, win = _pricing(model, trace, knobs)
    # decode FLOPs summed exactly in int64: whole numbers, and no batch's sum can reach 2^63
    whole = kind != AFFINE and bool(np.all(np.floor(fl_at) == fl_at)) and \
        float(fl_at.max()) * (knobs.max_num_seqs + 1) < 2.0 ** 62
    kn = np.array([knobs.block_size, knobs.max_num_seqs, knobs.max_num_batched_tokens, knobs.max_model_len,
                   knobs.enable_prefix_caching, knobs.async_scheduling, knobs.enable_chunked_prefill,
                   knobs.long_prefill_token_threshold, knobs.reserve_full_isl, trace.block_tokens,
                   trace.has_prefixes, kind, fast_forward, cdiv(longest_request(trace, knobs), knobs.block_size) + 2],
                  np.int64)
    ids = np.asarray(trace.block_ids if trace.block_ids is not None else np.zeros(1), np.int64)
    off = np.asarray(trace.block_offsets if trace.block_offsets is not None else np.zeros(R + 1), np.int64)
    ht, hr = np.empty(R + 1), np.empty(R + 1, np.int64)
    ist = np.zeros(19, np.int64)
    fst = np.zeros(9)
    fst[BUSY_UNTIL] = -1.0
    t0 = np.array([t for t, _, _ in arrivals], float)
    r0 = np.array([r for _, _, r in arrivals], np.int64)
    order = np.lexsort((r0, t0))  # sorted by (time, request): a binary heap already
    ht[:len(order)], hr[:len(order)] = t0[order], r0[order]
    ist[NARR] = len(order)
    ist[NSLOT] = knobs.max_num_seqs + 1
    wq = np.empty(R + 1, np.int64)
    run = np.empty(knobs.max_num_seqs + 1, np.int64)
    bat = np.zeros((2, knobs.max_num_seqs + 1, 7), np.int64)
    bcnt = np.zeros(2, np.int64)
    pre = np.empty(knobs.max_num_seqs + 1, np.int64)
    pool = BlockPool(knobs.num_blocks, knobs.enable_prefix_caching)
    tab = key_table(trace, knobs)
    # [MNS + 1, NBMAX] a row of block ids per request holding blocks (np.empty: a row's pages are touched as it
    # grows, so a long-context bound costs what requests use); the free rows are a stack, slots[:ist[NSLOT]]
    bt = np.empty((knobs.max_num_seqs + 1, kn[NBMAX]), np.int64)
    slots = np.arange(knobs.max_num_seqs, -1, -1, dtype=np.int64)
    refuse = np.asarray(refuse, np.bool_)
    hcap = np.zeros(3, np.int64)  # blocks per host tier: HBM (the pool's), DRAM, SSD
    hread = np.zeros(3)  # seconds to load one block from each tier
    if host is not None:
        hcap[1:] = host.stack.cap[1:]
        hread[:] = host.read_s
    htab, hring, hpage, hmeta = host_state(
        hcap, trace.block_tokens, knobs.block_size,
        min(int(ids.max()) + 1, ids.shape[0]) if host is not None and ids.shape[0] else 0)
    nxt, gap = np.asarray(nxt, np.int64), np.asarray(gap, float)
    sw, sbuf, slog = stretch_buffers(knobs, host is not None)
    chunk = max(2_000, R // 100)  # requests finished between progress updates
    worker = None
    if host is not None and R >= OFFLOAD_MIN and (os.cpu_count() or 1) >= 2:
        import threading
        hmeta[H_QON] = 1
        worker = threading.Thread(target=_h_worker, args=(htab, hpage, hring, hmeta, hcap), daemon=True)
        worker.start()
    try:
        while True:
            before = int(ist[DONE])
            code = _run(rq, rt, refuse, nxt, gap, ids, off, kn, kind, pp, wbt, kv_at, fl_at, win, whole, ht, hr, wq,
                        run, bat, bcnt, pre, pool.blk, pool.fq, tab, pool.meta, bt, slots, htab, hring, hpage, hmeta,
                        hcap, hread, ist, fst, sw, sbuf, slog, before + chunk)
            if progress is not None:
                progress.update(int(ist[DONE]) - before)
            if code != 1:
                break
    finally:
        if worker is not None:
            hmeta[H_QW] = hmeta[H_QWL]
            hmeta[H_QSTOP] = 1
            worker.join()
    if code == 2:
        raise ParameterError("replica 0 stopped with requests it can never schedule")
    if code == 3:
        raise RuntimeError("a decode run outgrew a request's block segment")
    a.arrival[:] = rt[:, ARR]
    a.started = rt[:, START].tolist()
    a.first_token = rt[:, FIRST].tolist()
    a.finished = rt[:, FINISH].tolist()
    a.generated = rq[:, GEN].tolist()
    a.preempted = rq[:, APRE].tolist()
    a.rejected[:] = rq[:, FIN] == 2
    a.replica[:] = np.where(rq[:, FIN] == 2, -1, np.where(np.isnan(rt[:, ARR]), -1, 0))
    a.hit_tok[:] = rq[:, HITTOK]
    a.hit_tier_tok[:] = rq[:, TIERTOK:TIERTOK + 3]
    a.hit_blocks[:] = rq[:, TIERBLK:TIERBLK + 3]
    moved = {}
    if host is not None:  # TierStack.moved: bytes per route, in its order (HBM to SSD only once it happened)
        bb = host.stack.block_bytes
        moved = {"hbm->dram": bb * int(hmeta[M_HD]), "dram->ssd": bb * int(hmeta[M_DS]),
                 "dram->hbm": bb * int(hmeta[M_DH]), "ssd->hbm": bb * int(hmeta[M_SH])}
        if hmeta[M_HS]:
            moved["hbm->ssd"] = bb * int(hmeta[M_HS])
    return (int(ist[STEPS]), float(fst[AREA]), float(fst[T0]) if ist[HAVE_T0] else None, float(fst[T_END]),
            float(fst[BUSY_S]), int(ist[PREEMPTS]), moved)
