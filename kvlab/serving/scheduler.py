"""vLLM 0.33's v1 scheduler as a class of its own: one replica's requests, step by step, on a BlockPool.

Rules follow vllm/v1/core/sched/scheduler.py (Scheduler.schedule, update_from_output), async_scheduler.py and
v1/core/kv_cache_manager.py (allocate_slots, get_computed_blocks), checked step for step against vLLM 0.33.0 itself
(tests/oracles/vllm_scheduler.py, tests/fixtures/vllm_scheduler.json):
- running requests first, in order, each taking min(tokens it still needs, long_prefill_token_threshold, the step's
  token budget, max_model_len - 1 - computed); when its blocks do not fit, the last running request is preempted by
  recompute (blocks freed, computed reset, back at the head of the waiting queue) until they do;
- then, unless the step preempted, waiting requests in FCFS order while budget and max_num_seqs allow: a request
  starting from nothing first takes its prefix-cache hit (whole cached blocks, never its last token); with
  `reserve_full_isl` (vLLM's default) it is admitted only if the free blocks hold its whole input, not only the first
  chunk; without chunked prefill a waiting request whose tokens exceed the budget stops admission;
- async scheduling (vLLM's default): a step is scheduled before the previous one's sampled tokens are applied, so a
  request that finishes returns its slot and blocks one step later, and a request whose previous step already
  produces its last token is not scheduled again;
- a request stops at max_tokens or when its sequence reaches max_model_len.
Left out: priorities, speculative decoding, structured output, LoRA, encoder inputs, KV connectors, pipeline
parallelism's several batches in flight.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

from ..checks import cdiv
from ..errors import ParameterError
from .blockpool import EVICTED, NONE, BlockPool, output_key


def _int64(xs) -> np.ndarray:
    """A list of ints as an int64 array (what the pool's compiled loops take)."""
    return np.array(xs, np.int64)


def _ints(xs) -> list:
    """Keys or blocks as a list of Python ints (host tiers and block tables hold Python ints)."""
    return xs.tolist() if isinstance(xs, np.ndarray) else list(xs)


@dataclass(frozen=True)
class SchedulerKnobs:
    """vLLM's scheduler and cache settings (vLLM's defaults except the sizes)."""

    num_blocks: int  # KV pool blocks, the null block included (vLLM's num_gpu_blocks)
    block_size: int = 16  # tokens per block
    max_num_seqs: int = 256  # requests running at once
    max_num_batched_tokens: int = 8192  # token budget of one step
    max_model_len: int = 1 << 30  # longest sequence (prompt + output)
    enable_prefix_caching: bool = True  # prefix caching
    async_scheduling: bool = True  # next step scheduled before the previous one's output is applied
    enable_chunked_prefill: bool = True  # a prompt may be split over steps
    long_prefill_token_threshold: int = 0  # most tokens of one prefill chunk (0: no limit)
    reserve_full_isl: bool = True  # admission needs blocks for the whole input (scheduler_reserve_full_isl)


@dataclass(eq=False)
class Req:
    """One request's scheduler state (compared by identity: the queues look requests up by it)."""

    id: int  # request index
    prompt: int  # prompt tokens
    max_tokens: int  # output tokens wanted
    keys: np.ndarray  # [K] hash key of each full prompt block (int64 >= 0; equal keys: equal tokens up to its end)
    computed: int = 0  # tokens in the KV cache (num_computed_tokens)
    out: int = 0  # output tokens applied
    placeholders: int = 0  # output tokens in flight (async scheduling)
    inflight: int = 0  # tokens scheduled in steps whose output is not applied yet
    stale: int = 0  # of those, tokens scheduled before a preemption (their output is still delivered)
    bt: np.ndarray = field(default_factory=lambda: NONE)  # [capacity] blocks held in bt[:nb], in order (a buffer)
    nb: int = 0  # blocks held
    cached_upto: int = 0  # blocks of this request already hashed
    finished: bool = False  # stopped
    hit_tokens: int = -1  # prefix-hit tokens at first admission (-1: not yet)
    preemptions: int = 0  # times preempted

    @property
    def tokens(self) -> int:
        return self.prompt + self.out

    @property
    def blocks(self) -> np.ndarray:
        """Pool blocks held, in order ([nb] int64, a view)."""
        return self.bt[:self.nb]

    def room(self, n: int, most: int) -> np.ndarray:
        """bt[nb:nb + n], grown first if needed (to `most` blocks, the longest the request can get, at least)."""
        if self.nb + n > len(self.bt):
            bt = np.empty(max(most, self.nb + n, 2 * len(self.bt)), np.int64)
            bt[:self.nb] = self.bt[:self.nb]
            self.bt = bt
        self.nb += n
        return self.bt[self.nb - n:self.nb]


@dataclass
class Batch:
    """One scheduled step."""

    tokens: dict  # request -> tokens scheduled
    samples: set  # requests that sample a token at the end of the step
    decode: set  # requests whose one token is a decode
    preempted: list  # requests preempted while forming it
    free_blocks: int  # free blocks after scheduling
    prefix_hit: dict  # request -> prefix-hit tokens, for requests taken from the waiting queue
    loaded: dict = field(default_factory=dict)  # request -> [blocks loaded from DRAM, from SSD] (in prefix_hit)


class VllmScheduler:
    """One replica's vLLM scheduler: add requests, schedule a Batch, apply it (`update`)."""

    def __init__(self, knobs: SchedulerKnobs, host=None):
        self.k = knobs  # settings
        self.pool = BlockPool(knobs.num_blocks, knobs.enable_prefix_caching)  # KV blocks
        self.host = host  # DRAM / SSD behind the pool (kvlab.serving.hosttiers.HostTiers), or None
        self.loaded = [0, 0]  # blocks the last admission loaded from DRAM, SSD
        if host is not None:
            if not knobs.enable_prefix_caching:
                raise ParameterError("host tiers (DRAM / SSD) hold prefix-cached blocks: they need prefix caching")
            self.pool.evicted = []
        self.waiting: deque[Req] = deque()  # FCFS
        self.running: list[Req] = []  # admission order
        self.preemptions = 0  # preemptions so far
        self.stuck = None  # (free blocks, running) after a step whose admission decode steps cannot reopen, or None

    def add(self, req: Req) -> None:
        self.waiting.append(req)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # -- blocks ---------------------------------------------------------------------------------------------------
    def _keys(self, r: Req, lo: int, hi: int):
        """Hash keys of blocks lo..hi-1 of r: prompt blocks' shared keys, then keys of blocks holding output tokens
        (unique to r); an array, or a list when all are output keys."""
        keys = r.keys
        if hi <= len(keys):
            return keys[lo:hi]
        out = [output_key(r.id, i) for i in range(max(lo, len(keys)), hi)]
        if lo >= len(keys):
            return out
        return np.concatenate([np.asarray(keys[lo:], np.int64), np.array(out, np.int64)])

    def _allocate(self, r: Req, n: int, hit: np.ndarray | None = None, reserve: bool = False, ext: int = 0,
                  admit: bool = False) -> bool:
        """Blocks for `n` more tokens of r (after `hit`, its cached blocks in the pool, and `ext` blocks found in the
        host tiers, loaded into new blocks), or False when they do not fit; `admit`: r is taken from the waiting
        queue with nothing computed (the host tiers count its blocks' access)."""
        if hit is None:
            hit = NONE
        bs = self.k.block_size
        computed = r.computed + (len(hit) + ext) * bs
        need = min(computed + n, self.k.max_model_len)
        new = cdiv(need, bs) - len(hit) - r.nb
        evict = self.pool.evictable(hit) if len(hit) else 0
        want = max(new, 0) + evict
        if reserve:  # full-input admission: the blocks the whole input needs must be free now
            full = max(cdiv(min(r.tokens, self.k.max_model_len), bs) - len(hit) - r.nb, 0)
            if full + evict > self.pool.free_count():
                return False
        if want > self.pool.free_count():
            return False
        host = self.host
        if admit and host is not None:
            self.loaded = host.admit(r.keys, len(hit), ext)
        known = r.cached_upto  # leading blocks of r hashed already
        if len(hit):
            self.pool.touch(hit)
            if r.nb == known:  # the hits follow them, each cached under r's key at its place
                known += len(hit)
            self._room(r, len(hit))[:] = hit
        if new > 0:
            self.pool.take_into(self._room(r, new))
            if host is not None and self.pool.evicted:
                host.evicted(self.pool.evicted)
                self.pool.evicted.clear()
        # hash the blocks this step fills (vLLM caches at allocation, for the tokens being computed)
        full_blocks = min(computed + n, r.tokens) // bs
        if full_blocks > r.cached_upto:
            keys = self._keys(r, r.cached_upto, full_blocks)
            lo = max(min(known, full_blocks) - r.cached_upto, 0)  # hits: cache_many would pass them by
            self.pool.cache_many(r.bt[r.cached_upto + lo:full_blocks], keys[lo:])
            if host is not None:
                host.hashed(_ints(keys))
            r.cached_upto = full_blocks
        return True

    def _room(self, r: Req, n: int) -> np.ndarray:
        """r's next n block slots (Req.room), its buffer sized for the most blocks r can hold when it grows."""
        return r.room(n, cdiv(min(r.prompt + r.max_tokens, self.k.max_model_len), self.k.block_size))

    def _free(self, r: Req) -> None:
        self.pool.free(r.blocks)
        r.bt, r.nb = NONE, 0
        r.cached_upto = 0

    # -- scheduling -----------------------------------------------------------------------------------------------
    def schedule(self) -> Batch:
        k = self.k
        budget = k.max_num_batched_tokens
        tokens, samples, decode, preempted, hits, loaded = {}, set(), set(), [], {}, {}
        # a long prefill is cut only when another request could use the budget (scheduler.py, schedule)
        threshold = k.long_prefill_token_threshold if len(self.running) + len(self.waiting) > 1 else 0
        bs, mml, caching = k.block_size, k.max_model_len, self.pool.caching
        i = 0
        running = self.running
        while i < len(running) and budget > 0:
            r = running[i]
            c, ph, tok = r.computed, r.placeholders, r.prompt + r.out
            if ph > 0 and c + 2 - ph >= r.prompt + r.max_tokens:
                i += 1  # async: the step in flight already produces its last token
                continue
            n = tok + ph - c
            if (n == 1 and c + 1 < mml and r.nb * bs > c
                    and (not caching or min(c + 1, tok) // bs <= r.cached_upto)):
                # a decode into a block it holds, nothing to hash (the hot path; _allocate would do nothing)
                tokens[r.id] = 1
                if tok + ph > r.prompt:
                    decode.add(r.id)
                budget -= 1
                i += 1
                continue
            if 0 < threshold < n:
                n = threshold
            n = min(n, budget, k.max_model_len - 1 - r.computed)
            if n <= 0:
                i += 1
                continue
            ok = True
            while not self._allocate(r, n):
                victim = self.running.pop()
                self._preempt(victim)
                preempted.append(victim.id)
                if victim is r:
                    ok = False
                    break
            if not ok:
                break
            tokens[r.id] = n
            if n == 1 and r.out + r.placeholders > 0:
                decode.add(r.id)
            budget -= n
            i += 1
        stuck = not preempted  # admission stopped for a reason that decode-only steps cannot lift
        if not preempted:
            skipped = []
            while self.waiting and budget > 0 and len(self.running) < k.max_num_seqs:
                r = self.waiting[0]
                if r.stale:  # preempted with output still in flight: passed over until it lands
                    skipped.append(self.waiting.popleft())
                    continue
                hit, ext = NONE, 0
                admit = r.computed == 0 and self.pool.caching
                if admit:
                    keys = self._keys(r, 0, (r.tokens - 1) // k.block_size)
                    hit = self.pool.hit(keys)
                    if self.host is not None:  # the run continues in DRAM / SSD
                        ext = self.host.run(_ints(keys[len(hit):]))
                n = whole = r.tokens - (len(hit) + ext) * k.block_size - r.computed
                if 0 < threshold < n:
                    n = threshold
                if not k.enable_chunked_prefill and n > budget:
                    break
                n = min(n, budget)
                if not self._allocate(r, n, hit, k.reserve_full_isl, ext, admit):
                    # the whole input's blocks did not fit: taking free blocks only shortens the head's hit and
                    # the free queue, so it stays out until blocks are freed (a cut chunk might fit later, and so
                    # might the whole input once a TTL shortens its host-tier run: not stuck then)
                    stuck = k.reserve_full_isl or (n == whole and not ext)
                    break
                self.waiting.popleft()
                r.computed += (len(hit) + ext) * k.block_size
                hits[r.id] = r.computed
                if ext:
                    loaded[r.id] = self.loaded
                if r.hit_tokens < 0:
                    r.hit_tokens = r.computed
                self.running.append(r)
                tokens[r.id] = n
                budget -= n
            for r in reversed(skipped):
                self.waiting.appendleft(r)
            stuck = stuck and not skipped
        for r in self.running:
            n = tokens.get(r.id)
            if n is None:
                continue
            r.computed += n
            r.inflight += n
            if r.computed >= r.tokens + r.placeholders:
                samples.add(r.id)
                if k.async_scheduling:
                    r.placeholders += 1
        free = self.pool.free_count()
        # what the fast-forward checks before skipping steps with requests waiting (decode_room)
        self.stuck = (free, len(self.running)) if stuck else None
        return Batch(tokens, samples, decode, preempted, free, hits, loaded)

    # -- fast-forward ---------------------------------------------------------------------------------------------
    def decode_room(self, batch: Batch | None, most: int) -> int:
        """Steps after `batch` (the step just scheduled, its predecessor applied) that the scheduler would form
        alike, at most `most` (0: none): `batch` decodes one token of every running request, nothing it did can
        change who runs (no request waits, or admission stopped for good: see `stuck`; nothing freed since), and
        no request is scheduled past its last token (max_tokens, or max_model_len): the stretch may end with a
        request's last token in flight; the step after it, where that request is passed over and finishes, is the
        step loop's (one more step would differ: tests/test_serve_skip.py). Block boundaries inside the stretch
        are `skip_decodes`' to take, in order."""
        if batch is None or len(batch.tokens) != len(self.running) or len(batch.decode) != len(batch.tokens):
            return 0
        if self.waiting and self.stuck != (self.pool.free_count(), len(self.running)):
            return 0
        mml, extra = self.k.max_model_len, 0 if self.k.async_scheduling else 1
        k = most
        for r in self.running:
            g = r.out + r.placeholders + extra  # samples applied or in flight
            k = min(k, min(r.max_tokens, mml - r.prompt) - g)
            if k <= 0:
                return 0
        return k

    def closed(self) -> bool:
        """Requests wait, and none can be admitted until a running one finishes (see `stuck`): a request arriving
        now only queues behind them."""
        return bool(self.waiting) and self.stuck == (self.pool.free_count(), len(self.running))

    def skip_decodes(self, m: int, starts=None) -> int:
        """Apply up to `m` decode steps of the whole running batch after the step in flight (`decode_room` allows
        them), as `schedule` and `update` would one by one: every request computes and lands one token a step;
        a request reaching a block boundary takes its next block and hashes the block it filled, in step order
        and, within a step, in running order (what the free queue hands out depends on it). Stops before a step
        whose new blocks the free queue cannot give (the step loop would preempt there). Returns the steps
        applied; the step in flight stays one like them. `starts[i]`: when skipped step i is scheduled, the time
        host tiers place the keys its blocks evict (as the step loop's `step(now)` sets it)."""
        bs, caching, host, mml = self.k.block_size, self.pool.caching, self.host, self.k.max_model_len
        extra = 0 if self.k.async_scheduling else 1
        running = self.running
        # request j's state at skipped step i's scheduling: computed c1 + i - 1, tokens t1 + i - 1
        c1 = [r.computed for r in running]
        t1 = [r.prompt + r.out + extra for r in running]
        act = []  # requests with block events in the stretch (running order): the first step at which each takes
        for j, r in enumerate(running):  # or hashes a block (_next_event) comes within m
            first = r.nb * bs - c1[j] + 1
            if caching:
                first = min(first, (r.cached_upto + 1) * bs - t1[j] + 1)
            if first <= m:
                act.append(j)
        if act:
            reqs = [running[j] for j in act]
            nb = [r.nb for r in reqs]  # blocks held
            cu = [r.cached_upto for r in reqs]  # blocks hashed
            cap = [n - c + m // bs + 2 for n, c in zip(nb, cu)]  # blocks from index cu on: held unhashed, and new
            nkeys = [len(r.keys) for r in reqs]
            kcap = [max(min(k, c + n) - c, 0) for k, c, n in zip(nkeys, cu, cap)]  # prompt keys from index cu on
            soff, koff = [0], [0]
            for n, k in zip(cap, kcap):
                soff.append(soff[-1] + n)
                koff.append(koff[-1] + k)
            seg = np.empty(soff[-1], np.int64)
            pk = np.empty(koff[-1], np.int64)
            for q, r in enumerate(reqs):
                lo, n = cu[q], nb[q] - cu[q]
                if n:
                    seg[soff[q]:soff[q] + n] = r.bt[lo:lo + n]
                if kcap[q]:
                    pk[koff[q]:koff[q + 1]] = r.keys[lo:lo + kcap[q]]
            nba, cua = _int64(nb), _int64(cu)  # [A] each, updated by the run
            m, log, last = self.pool.decode_run(
                m, bs, mml, _int64([c1[j] for j in act]), _int64([t1[j] for j in act]), nba, cua,
                _int64([r.id for r in reqs]), _int64(nkeys), _int64(cu), seg, _int64(soff), pk, _int64(koff),
                host is not None)
            for q, (r, n, c) in enumerate(zip(reqs, nba.tolist(), cua.tolist())):
                add = n - r.nb
                if add:
                    lo = soff[q] + r.nb - r.cached_upto
                    self._room(r, add)[:] = seg[lo:lo + add]
                r.cached_upto = c
            if host is not None:
                self._tell_host(log, last, starts)
        for j, r in enumerate(running):
            r.computed = c1[j] + m
            r.out = t1[j] - r.prompt - extra + m
        return m

    def _tell_host(self, log: np.ndarray, last: int, starts) -> None:
        """Pass a decode run's evicted and hashed keys ([3, E]: kind, step, key) to the host tiers in order, each at
        its step's time (`starts`), as the step loop would one step at a time."""
        host = self.host
        kind, step, key = log
        cut = (np.flatnonzero((np.diff(kind) != 0) | (np.diff(step) != 0)) + 1).tolist()
        for lo, hi in zip([0, *cut], [*cut, len(key)]) if len(key) else ():  # runs of one kind at one step
            if starts is not None:
                host.now = starts[int(step[lo])]
            (host.evicted if kind[lo] == EVICTED else host.hashed)(key[lo:hi].tolist())
        if last and starts is not None:
            host.now = starts[last]

    def _preempt(self, r: Req) -> None:
        self._free(r)
        r.computed = 0
        r.stale = r.inflight  # what is in flight still lands, without touching the reset counters
        r.placeholders = 0
        r.preemptions += 1
        self.preemptions += 1
        self.waiting.appendleft(r)

    def update(self, batch: Batch, reqs, firsts: list | None = None) -> list[int]:
        """Apply a step's sampled tokens; returns the requests it finished. `reqs`: request id -> Req; `firsts`, a
        list: the requests whose first output token this step gave are appended to it."""
        done = []
        for rid, n in batch.tokens.items():
            r = reqs[rid]
            r.inflight -= n
            stale = r.stale > 0
            if stale:
                r.stale -= n
            if r.finished or rid not in batch.samples:
                continue
            if not stale and r.placeholders > 0:
                r.placeholders -= 1
            r.out += 1
            if r.out == 1 and firsts is not None:
                firsts.append(rid)
            if r.out >= r.max_tokens or r.tokens >= self.k.max_model_len:
                r.finished = True
                done.append(rid)
                if r in self.running:
                    self.running.remove(r)
                    self._free(r)
                else:
                    self.waiting.remove(r)
                    self._free(r)
        return done


MODELLED = (
    "running requests first, in order; FCFS admission within max_num_batched_tokens and max_num_seqs",
    "admission needs free blocks for the whole input (scheduler_reserve_full_isl; off: the first chunk's)",
    "no admission in a step that preempted; preemption by recompute, the last running request first",
    "prefix caching: full 16-token blocks hashed with their prefix, shared blocks reference-counted, the cache is "
    "the pool's free-but-hashed blocks (evicted least recently freed first, unhashed blocks reused first)",
    "a hit stops before the prompt's last token, at a whole block; a resumed request re-hits whole cached blocks",
    "one block kept back as the null block",
    "async scheduling (default): a finished request's slot and blocks return one step later; sync on request",
    "chunked prefill on or off; long_prefill_token_threshold (only while another request waits or runs)",
    "max_model_len: longer prompts refused, outputs capped; arrivals of one step admitted together",
    "host tiers (--dram-gb, --ssd-gb): kvlab's tier stack behind the pool; a block the pool evicts moves to DRAM "
    "(then SSD), a hit continues there after the pool's and is loaded at the tiers' bandwidth in the admitting step "
    "(kvlab.serving.hosttiers)",
)
LEFT_OUT = (
    "priority scheduling, speculative decoding, structured output, LoRA, multimodal encoders",
    "KV connectors; vLLM's CPU offloading writes blocks through to the CPU tier and loads hits asynchronously, "
    "kvlab's host tiers take the pool's evictions (one copy per block) and load in the admitting step",
    "watermark (vLLM's default 0), prefill cadence, pipeline parallelism's several batches in flight",
    "a request that could never fit the pool is refused at arrival (vLLM would preempt it forever)",
    "hybrid models' KV cache groups: the pool pages full-attention KV only; sliding-window layers' and SSM states' "
    "blocks (vLLM's SlidingWindowManager, MambaManager) are not held, and a model with no full-attention layer "
    "is refused",
)


def explain() -> str:
    """What the serving simulator's scheduler models of vLLM 0.33's, and what it leaves out."""
    return ("scheduler: vLLM 0.33's v1 rules, checked step for step against vLLM itself "
            "(tests/fixtures/vllm_scheduler.json)\n  modelled: " + "\n  modelled: ".join(MODELLED)
            + "\n  left out: " + "\n  left out: ".join(LEFT_OUT))
