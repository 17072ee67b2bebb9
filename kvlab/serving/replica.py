"""One replica of the serving simulator: kvlab.serving.scheduler.VllmScheduler (vLLM 0.33's rules, checked step for
step against vLLM itself) over its KV pool, with optional DRAM / SSD tiers behind the pool
(kvlab.serving.hosttiers), and the block keys of a trace's prompts (`prompt_keys`).
"""
from __future__ import annotations

import numpy as np

from ..checks import cdiv


def prompt_keys(ids: np.ndarray, prompt: int, block_size: int, trace_block: int) -> np.ndarray:
    """Hash key of every full KV block of a prompt whose trace blocks are `ids` ([T], each naming its tokens and
    everything before them): trace block t holding the KV block's last token, at offset o in it, as the int
    t_id * trace_block + o, so equal keys mean equal tokens up to the block's end (keys stop where the trace's
    blocks do)."""
    last = np.arange(block_size - 1, (prompt // block_size) * block_size, block_size, dtype=np.int64)  # [K]
    t = last // trace_block  # [K] trace block of each KV block's last token
    last = last[t < len(ids)]
    t = t[:len(last)]
    return np.asarray(ids, np.int64)[t] * trace_block + last % trace_block  # [K]


class VllmReplica:
    """One replica run by kvlab.serving.scheduler.VllmScheduler (vLLM 0.33's rules, checked step for step against
    vLLM itself); the simulator drives it with `add` and `step`. Its prefix cache is the pool's free-but-hashed
    blocks; the per-request arrays are shared with the simulator (index = request)."""

    def __init__(self, index: int, knobs, arrays, caching: bool, record: list | None = None, host=None):
        from .scheduler import VllmScheduler
        self.index = index  # replica number
        self.host = host  # DRAM / SSD behind the pool (kvlab.serving.hosttiers.HostTiers), or None
        self.sched = VllmScheduler(knobs, host)  # vLLM's scheduler over this replica's pool
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

    def _keys(self, r: int) -> np.ndarray:
        """Hash key of every full prompt block of request r (prompt_keys)."""
        if not self.caching:
            return np.zeros(0, np.int64)
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

    def skip_decodes(self, m: int, starts=None) -> int:
        """Apply up to `m` such steps at once (VllmScheduler.skip_decodes: fewer where the free queue runs short
        of the blocks they grow into; `starts[i]`: when skipped step i is scheduled); returns how many were
        applied. The step in flight stays one like them."""
        return self.sched.skip_decodes(m, starts)

    def _apply(self, batch, now: float) -> list[int]:
        a = self.a
        firsts = []
        done = self.sched.update(batch, self.reqs, firsts)
        for r in firsts:
            a.first_token[r] = now
        for r in done:
            a.finished[r] = now
            a.generated[r] = self.reqs[r].out
            del self.reqs[r]
        return done

    def step(self, now: float):
        """At `now` (an idle replica's arrival, or the end of its step): apply what is due and schedule the next
        step. Returns (requests completed, prefill chunks (new, context), decode contexts, seconds loading host-tier
        hits into HBM) of the new step (no chunk and no context: nothing to run)."""
        s, a = self.sched, self.a
        done = []
        load_s = 0.0
        if self.host is not None:
            self.host.now = now
        if self.inflight is not None and not s.k.async_scheduling:
            done += self._apply(self.inflight, now)
            self.inflight = None
        b = s.schedule()
        if not b.tokens and self.inflight is not None:  # async, nothing to add: wait for the step in flight
            done += self._apply(self.inflight, now)
            self.inflight = None
            first = b.preempted  # a first try may preempt and still schedule nothing: those preemptions stand
            b = s.schedule()
            b.preempted[:0] = first
        if self.inflight is not None:
            done += self._apply(self.inflight, now)
        self.inflight = b if b.tokens else None
        prefill, decode = [], []
        reqs = self.reqs
        for r, n in b.tokens.items():
            if r in b.prefix_hit:
                c = b.prefix_hit[r]
                if a.started[r] < 0:
                    a.started[r] = now
                    a.hit_tok[r] = c
                    bt = a.trace.block_tokens
                    if r in b.loaded:  # the run's tail came from DRAM / SSD
                        bs = s.k.block_size
                        dram, ssd = b.loaded[r]
                        a.hit_tier_tok[r] = (c - (dram + ssd) * bs, dram * bs, ssd * bs)
                        a.hit_blocks[r] = a.hit_tier_tok[r] // bt
                    else:
                        a.hit_tier_tok[r, 0] = c
                        a.hit_blocks[r, 0] = c // bt if a.trace.has_prefixes else 0
                if r in b.loaded:
                    load_s += self.host.load_s(b.loaded[r])
            else:
                c = reqs[r].computed - n  # its context before the step (schedule added n)
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
        return done, prefill, decode, load_s


class _PoolPeek:
    """A VllmReplica's prefix hits as the prefix router asks for them: leading trace blocks whose last full KV block
    is cached in the pool (no state change)."""

    def __init__(self, rep: VllmReplica):
        self.rep = rep  # the replica
        self.moved: dict = rep.host.moved if rep.host is not None else {}  # bytes moved between tiers

    def peek(self, blocks) -> int:
        bt, bs = self.rep.a.trace.block_tokens, self.rep.sched.k.block_size
        pool = self.rep.sched.pool  # the keys cached
        where = self.rep.host.stack.where if self.rep.host is not None else {}  # DRAM / SSD residents
        end = (bt // bs) * bs - 1  # where in a trace block its last full KV block ends
        if end < 0:  # trace blocks shorter than a KV block: no key ends inside one
            return 0
        n = 0
        for b in blocks:
            key = int(b) * bt + end
            if not pool.has_key(key) and key not in where:
                break
            n += 1
        return n
