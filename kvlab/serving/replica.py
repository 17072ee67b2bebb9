"""One replica's vLLM-V1-like scheduler: continuous batching, chunked prefill under max_num_batched_tokens,
a paged KV pool, prefix caching and preemption by recompute.

Rules follow vllm/v1/core/sched/scheduler.py (Scheduler.schedule): running requests first, in order, each
taking min(tokens it still needs, the step's remaining token budget); when the pool cannot hold a running
request's new tokens the last running request is preempted (its blocks freed, num_computed_tokens reset to 0,
put back at the head of the waiting queue) until it fits; then waiting requests are admitted in FCFS order
while budget, max_num_seqs and free blocks allow, none after a preemption in the same step. A request whose
tokens are all computed samples one token at the end of the step (the first one ends its prefill).
"""
from __future__ import annotations

from collections import deque

import numpy as np

from ..checks import cdiv


class Replica:
    """Scheduler state of one replica; per-request arrays are shared with the simulator (index = request)."""

    def __init__(self, index: int, pool_blocks: int, page_tokens: int, max_batched: int, max_seqs: int, cache,
                 arrays):
        self.index = index  # replica number
        self.pool_blocks = pool_blocks  # KV pool pages on this replica
        self.page_tokens = page_tokens  # tokens per page (vLLM block_size)
        self.max_batched = max_batched  # max_num_batched_tokens
        self.max_seqs = max_seqs  # max_num_seqs
        self.cache = cache  # TierCache, or None without prefix information
        self.a = arrays  # the simulator's per-request arrays
        self.free = pool_blocks  # free pages
        self.waiting: deque[int] = deque()  # request ids, FCFS
        self.running: list[int] = []  # request ids in admission order
        self.busy_until = -1.0  # end of the step in flight (-1: idle)
        self.busy_s = 0.0  # seconds spent in steps
        self.steps = 0  # steps run
        self.preemptions = 0  # requests preempted (recomputed later)
        self.plan: list[tuple[int, int]] = []  # (request, tokens) scheduled in the step in flight
        self.head_blocked = False  # the planned step's admission stopped at a waiting head its free pages cannot hold

    def outstanding(self) -> int:
        return len(self.waiting) + len(self.running)

    def active_blocks(self) -> int:
        return self.pool_blocks - self.free + sum(cdiv(int(self.a.input[r]), self.page_tokens) for r in self.waiting)

    def _need(self, r: int) -> int:
        a = self.a
        return int(a.input[r] + a.generated[r] - a.computed[r])

    def _grow(self, r: int, n: int) -> bool:
        a = self.a
        want = cdiv(int(a.computed[r]) + n, self.page_tokens) - int(a.held[r])
        if want > self.free:
            return False
        self.free -= want
        a.held[r] += want
        return True

    def _release(self, r: int) -> None:
        self.free += int(self.a.held[r])
        self.a.held[r] = 0

    def schedule(self, now: float):
        """Form the next step: (prefill chunks (new, context), decode contexts, seconds of tier loads)."""
        a = self.a
        budget = self.max_batched
        plan, prefill, decode = [], [], []
        load_s = 0.0
        preempted = False
        self.head_blocked = False
        i = 0
        comp, gen, inp, held, pt = a.computed, a.generated, a.input, a.held, self.page_tokens
        running = self.running
        while i < len(running) and budget > 0:
            r = running[i]
            c = comp[r]
            need = inp[r] + gen[r] - c
            if need == 1 and c % pt and gen[r]:  # decode inside its last page: nothing to allocate (hot path)
                plan.append((r, 1))
                decode.append(c)
                budget -= 1
                i += 1
                continue
            n = min(need, budget)
            while not self._grow(r, n):
                victim = running.pop()
                self._release(victim)
                a.reached[victim] = max(a.reached[victim], comp[victim])
                comp[victim] = 0
                self.waiting.appendleft(victim)
                self.preemptions += 1
                a.preempted[victim] += 1
                preempted = True
                if victim == r:
                    break
            else:
                plan.append((r, n))
                if n == 1 and gen[r] and need == 1:
                    decode.append(c)
                else:
                    prefill.append((n, c))
                budget -= n
                i += 1
                continue
            break
        while (self.waiting and budget > 0 and len(self.running) < self.max_seqs and not preempted):
            r = self.waiting[0]
            if not a.looked[r]:  # first try: prefix lookup, hits count once
                a.looked[r] = True
                if self.cache is not None:
                    blocks = a.blocks_of(r)
                    hits, tier_tok = self.cache.access(blocks, a.tokens_of(r), now)
                    hit_tok = int(tier_tok.sum())
                    a.hit_blocks[r] = hits
                    a.hit_tier_tok[r] = tier_tok
                    a.hit_tok[r] = hit_tok
                    load_s += float((hits[1:] * self.cache.block_bytes / a.read_bw[1:]).sum())
                    a.computed[r] = max(0, min(hit_tok, a.input[r] - 1))
            elif a.started[r] < 0:  # looked up before, not admitted then
                a.computed[r] = max(0, min(int(a.hit_tok[r]), a.input[r] - 1))
            elif self.cache is not None:  # resumed after preemption: the pages it had computed may still be cached
                hb = self.cache.hbm_overlap(a.blocks_of(r))
                a.computed[r] = max(0, min(a.hit_tokens_of(r, hb), a.reached[r], a.input[r] - 1))
            n = min(self._need(r), budget)
            if not self._grow(r, n):
                self.head_blocked = True
                break
            if a.started[r] < 0:
                a.started[r] = now
            self.waiting.popleft()
            self.running.append(r)
            plan.append((r, n))
            c = a.computed[r]
            if n == 1 and a.generated[r] and self._need(r) == 1:
                decode.append(c)
            else:
                prefill.append((n, c))
            budget -= n
        self.plan = plan
        return prefill, decode, load_s

    def closed(self) -> bool:
        """No request can join this replica's batch until a running one finishes, whatever arrives: max_num_seqs
        are running, or the waiting head did not fit the free pages (FCFS: nobody passes it). Decode-only steps
        free no page and hold the head's need and the token budget, so it stays so until a completion."""
        return len(self.running) >= self.max_seqs or (bool(self.waiting) and self.head_blocked)

    def decode_only(self) -> bool:
        """The planned step decodes every running request, and no waiting request can join the batch until one of
        them finishes (none waits, or the replica is `closed`): the steps after it differ only in context."""
        return len(self.plan) == len(self.running) <= self.max_batched and (not self.waiting or self.closed())

    def decode_room(self, steps: int) -> int:
        """Most consecutive decode steps (the planned one first, at most `steps`) the running requests can take
        with no completion and with the pages they grow into free now (so none would be preempted)."""
        a, pt = self.a, self.page_tokens
        run = self.running
        left = min(a.output[r] - a.generated[r] for r in run)  # the step that generates a request's last token
        k = min(steps, left)
        if k <= 1:
            return k
        c0 = np.array([a.computed[r] for r in run], np.int64)  # [B] contexts at the planned step
        held = np.array([a.held[r] for r in run], np.int64)  # [B] pages held (the planned step's included)
        K = np.arange(1, k + 1, dtype=np.int64)[:, None]  # [k, 1] steps taken
        extra = np.maximum(cdiv(c0[None, :] + K, pt) - held[None, :], 0).sum(1)  # [k] pages to grow into
        return int(np.searchsorted(extra, self.free, side="right"))

    def advance_decode(self, steps: int) -> None:
        """Apply `steps` decode steps of the whole running batch at once (what `steps` rounds of finish_step and
        schedule would do when decode_only holds and decode_room allows), then plan the next one."""
        a, pt = self.a, self.page_tokens
        for r in self.running:
            c = a.computed[r] + steps
            a.computed[r] = c
            a.generated[r] += steps
            want = cdiv(c + 1, pt) - a.held[r]
            if want > 0:
                a.held[r] += want
                self.free -= want
        self.plan = [(r, 1) for r in self.running]

    def finish_step(self, now: float) -> list[int]:
        """Apply the step that ended at `now`; returns the requests it completed."""
        a = self.a
        done = []
        comp, gen, inp, out = a.computed, a.generated, a.input, a.output
        for r, n in self.plan:
            c = comp[r] + n
            comp[r] = c
            if c == inp[r] + gen[r]:
                g = gen[r] + 1
                gen[r] = g
                if g == 1:
                    a.first_token[r] = now
                if g >= out[r]:
                    a.finished[r] = now
                    done.append(r)
        if done:
            gone = set(done)
            for r in done:
                self._release(r)
            self.running = [r for r in self.running if r not in gone]
        self.plan = []
        return done


def prompt_keys(ids: np.ndarray, prompt: int, block_size: int, trace_block: int) -> list[int]:
    """Hash key of every full KV block of a prompt whose trace blocks are `ids` ([T], each naming its tokens and
    everything before them): trace block t holding the KV block's last token, at offset o in it, as the int
    t_id * trace_block + o, so equal keys mean equal tokens up to the block's end (keys stop where the trace's
    blocks do)."""
    last = np.arange(block_size - 1, (prompt // block_size) * block_size, block_size, dtype=np.int64)  # [K]
    t = last // trace_block  # [K] trace block of each KV block's last token
    last = last[t < len(ids)]
    t = t[:len(last)]
    return (np.asarray(ids, np.int64)[t] * trace_block + last % trace_block).tolist()


class VllmReplica:
    """One replica run by kvlab.serving.scheduler.VllmScheduler (vLLM 0.33's rules, checked step for step against
    vLLM itself); the simulator drives it with `add` and `step`. Its prefix cache is the pool's free-but-hashed
    blocks; the per-request arrays are shared with the simulator (index = request)."""

    def __init__(self, index: int, knobs, arrays, caching: bool, record: list | None = None):
        from .scheduler import VllmScheduler
        self.index = index  # replica number
        self.sched = VllmScheduler(knobs)  # vLLM's scheduler over this replica's pool
        self.a = arrays  # the simulator's per-request arrays
        self.caching = caching  # prefix keys from the trace's hashed blocks
        self.reqs: dict = {}  # request -> scheduler state
        self.inflight = None  # the step whose output is not applied yet (async scheduling)
        self.busy_until = -1.0  # end of the step in flight (-1: idle)
        self.busy_s = 0.0  # seconds spent in steps
        self.steps = 0  # steps run
        self.cache = _PoolPeek(self) if caching else None  # what the prefix router asks (the pool is the cache)
        self.record = record  # list to append one dict per step to (None: no log)

    @property
    def preemptions(self) -> int:
        return self.sched.preemptions

    def outstanding(self) -> int:
        return len(self.sched.waiting) + len(self.sched.running)

    def active_blocks(self) -> int:
        s = self.sched
        bs = s.k.block_size
        return s.k.num_blocks - 1 - s.pool.free_count() + sum(cdiv(r.tokens, bs) for r in s.waiting)

    def _keys(self, r: int) -> list:
        """Hash key of every full prompt block of request r (prompt_keys)."""
        if not self.caching:
            return []
        a = self.a
        return prompt_keys(a.ids[a.off[r]:a.off[r + 1]], int(a.input[r]), self.sched.k.block_size,
                           a.trace.block_tokens)

    def add(self, r: int) -> None:
        from .scheduler import Req
        q = Req(r, int(self.a.input[r]), int(self.a.output[r]), self._keys(r))
        self.reqs[r] = q
        self.sched.add(q)

    def decode_room(self, most: int) -> int:
        """Decode steps after the one just scheduled that the scheduler would form alike (0: none; at most
        `most`): VllmScheduler.decode_room."""
        return self.sched.decode_room(self.inflight, most)

    def closed(self) -> bool:
        """No request can join this replica's batch until a running one finishes (VllmScheduler.closed)."""
        return self.sched.closed()

    def skip_decodes(self, m: int) -> int:
        """Apply up to `m` such steps at once (VllmScheduler.skip_decodes: fewer where the free queue runs short
        of the blocks they grow into); returns how many were applied. The step in flight stays one like them."""
        return self.sched.skip_decodes(m)

    def _apply(self, batch, now: float) -> list[int]:
        a = self.a
        before = {r: self.reqs[r].out for r in batch.samples}
        done = self.sched.update(batch, self.reqs)
        for r in batch.samples:
            if before[r] == 0 and self.reqs[r].out > 0:
                a.first_token[r] = now
        for r in done:
            a.finished[r] = now
            a.generated[r] = self.reqs[r].out
            del self.reqs[r]
        return done

    def step(self, now: float):
        """At `now` (an idle replica's arrival, or the end of its step): apply what is due and schedule the next
        step. Returns (requests completed, prefill chunks (new, context), decode contexts) of the new step (empty:
        nothing to run)."""
        s, a = self.sched, self.a
        done = []
        if self.inflight is not None and not s.k.async_scheduling:
            done += self._apply(self.inflight, now)
            self.inflight = None
        before = {r.id: r.computed for r in s.running}
        b = s.schedule()
        if not b.tokens and self.inflight is not None:  # async, nothing to add: wait for the step in flight
            done += self._apply(self.inflight, now)
            self.inflight = None
            before = {r.id: r.computed for r in s.running}
            b = s.schedule()
        if self.inflight is not None:
            done += self._apply(self.inflight, now)
        self.inflight = b if b.tokens else None
        prefill, decode = [], []
        for r, n in b.tokens.items():
            q = self.reqs[r]
            if r in b.prefix_hit:
                c = b.prefix_hit[r]
                if a.started[r] < 0:
                    a.started[r] = now
                    a.hit_tok[r] = c
                    a.hit_tier_tok[r, 0] = c
                    a.hit_blocks[r, 0] = c // a.trace.block_tokens if a.trace.has_prefixes else 0
            else:
                c = before[r]
            if r in b.decode:
                decode.append(c)
            else:
                prefill.append((n, c))
        for r in b.preempted:
            a.preempted[r] += 1
        if self.record is not None and (b.tokens or b.preempted):
            self.record.append(dict(time=now, replica=self.index,
                                    tokens={r: ([0, 1] if r in b.decode else [n, 0]) for r, n in b.tokens.items()},
                                    preempted=list(b.preempted), free_blocks=b.free_blocks,
                                    prefix_hit=dict(b.prefix_hit)))
        return done, prefill, decode


class _PoolPeek:
    """A VllmReplica's prefix hits as the prefix router asks for them: leading trace blocks whose last full KV block
    is cached in the pool (no state change)."""

    def __init__(self, rep: VllmReplica):
        self.rep = rep  # the replica
        self.moved: dict = {}  # bytes moved between tiers (none: one tier)

    def peek(self, blocks) -> int:
        bt, bs = self.rep.a.trace.block_tokens, self.rep.sched.k.block_size
        cached = self.rep.sched.pool.first  # the keys cached
        end = (bt // bs) * bs - 1  # where in a trace block its last full KV block ends
        if end < 0:  # trace blocks shorter than a KV block: no key ends inside one
            return 0
        n = 0
        for b in blocks:
            if int(b) * bt + end not in cached:
                break
            n += 1
        return n
