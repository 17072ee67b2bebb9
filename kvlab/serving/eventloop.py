"""The serving simulator's event loop: one run's clock over R replicas behind a router.

Events are arrivals (time, 1, request) and step ends (time, 0, replica), taken in one time order. A vLLM replica
(kvlab.serving.replica.VllmReplica, run by kvlab.serving.scheduler.VllmScheduler) steps once every event of its
time is in, so requests arriving in the same step are admitted together. Each step lasts what the StepModel says
(kvlab.serving.stepmodel: the one step-time protocol), plus the seconds its admissions spend loading prefix hits
from DRAM / SSD (kvlab.serving.hosttiers). With `fast_forward`, a replica whose batch only decodes and which
nothing can join before the run's next event applies its steps up to that event at once, priced by the model's
`decode_run_s` and added to its busy time and clock one by one in the step loop's order, so every figure equals the
step-by-step run's. A stretch takes the blocks its decodes grow into on the way (VllmScheduler.skip_decodes; host
tiers place what they evict at each skipped step's time) and, while requests wait that cannot be admitted until a
running one finishes, runs past arrivals (they only queue).
"""
from __future__ import annotations

import heapq
import math

from ..errors import ParameterError
from .router import route

FAST_FORWARD_STEPS = 4096  # most decode steps one fast-forward prices at once
FAST_FORWARD_CHUNK = 32  # decode steps a vLLM replica's fast-forward prices first (then twice as many, ...)


class EventLoop:
    """Arrivals and step ends of one run, in time order; `run()` drives the replicas until both are exhausted."""

    def __init__(self, cfg, arrays, reps, model, arrivals: list, nxt, gap, refuses, *, min_gap: float,
                 fast_forward: bool = True, logging: bool = False, progress=None):
        self.cfg = cfg  # the ServeConfig (router, its weight)
        self.a = arrays  # per-request state (kvlab.serving.simulator._Arrays)
        self.reps = reps  # the replicas (kvlab.serving.replica.VllmReplica)
        self.model = model  # the StepModel pricing every step
        self.arrivals = arrivals  # heap of (time, 1, request)
        self.ends: list = []  # heap of (time, 0, replica): the step in flight on each busy replica
        self.nxt = nxt  # [R] closed loop: the session's next turn (-1: none)
        self.gap = gap  # [R] and the pause before it
        self.refuses = refuses  # request -> True when it is refused at arrival
        self.min_gap = min_gap  # shortest pause before a session's next turn (inf: open loop)
        self.fast_forward = fast_forward  # apply decode-only stretches at once
        self.logging = logging  # steps are logged one by one (no fast-forward on vLLM replicas)
        self.progress = progress  # object with update(n) told of every request that leaves, or None
        self.in_sys, self.area, self.last_t, self.t0, self.t_end = 0, 0.0, None, None, 0.0
        self.counter = 0  # requests routed
        self.steps = 0  # steps run over all replicas

    # -- bookkeeping ----------------------------------------------------------------------------------------------
    def horizon(self) -> float:
        """The earliest time a request could next reach any replica: the next arrival, or the next turn of a
        session that another replica's step could complete. Nothing before it reads or changes a busy replica."""
        h = self.arrivals[0][0] if self.arrivals else math.inf
        if self.ends and self.min_gap < math.inf:
            h = min(h, self.ends[0][0] + self.min_gap)
        return h

    def count(self, now: float, change: int) -> None:
        """Requests in the system change (an arrival, a departure): integrate the count up to now."""
        self.area += self.in_sys * (now - self.last_t)
        self.last_t = now
        self.in_sys += change

    def leave(self, r: int, now: float) -> None:
        self.count(now, -1)
        if self.nxt[r] >= 0:
            heapq.heappush(self.arrivals, (now + self.gap[r], 1, int(self.nxt[r])))
        if self.progress is not None:
            self.progress.update(1)

    def finish(self, done, now: float) -> None:
        for r in done:
            self.t_end = max(self.t_end, now)
            self.leave(r, now)

    def busy(self, rep, now: float, dt: float) -> None:
        """`rep` runs a step of `dt` seconds from `now`."""
        rep.busy_until = now + dt
        rep.busy_s += dt
        rep.steps += 1
        self.steps += 1
        heapq.heappush(self.ends, (now + dt, 0, rep.index))

    # -- the replicas' steps --------------------------------------------------------------------------------------
    def step_vllm(self, rep, now: float) -> None:
        """Apply what is due on `rep` at `now` and start its next step (every event of `now` is in)."""
        done, prefill, decode, load_s = rep.step(now)
        self.finish(done, now)
        if not prefill and not decode:
            rep.busy_until = -1.0
            return
        model = self.model
        dt = model.step_s(prefill, decode) + load_s
        if self.fast_forward and not prefill and not self.logging:
            k = rep.decode_room(FAST_FORWARD_STEPS)
            if k > 0:
                # a closed replica's stretch runs past arrivals (they queue behind requests that cannot join),
                # unless the prefix router reads its pool when routing them
                h = math.inf if rep.closed() and (self.cfg.router != "prefix" or len(self.reps) == 1) \
                    else self.horizon()
                if now + dt < h:
                    now, dt = self.skip_vllm(rep, decode, now, dt, k, h)
        self.busy(rep, now, dt)

    def skip_vllm(self, rep, decode: list, now: float, dt: float, k: int, h: float) -> tuple[float, float]:
        """Skip up to `k` decode steps after the one starting at `now` (lasting `dt`), each starting before `h`
        (the horizon); returns the start and length of the last one, which becomes the step in flight. Step times are
        priced in growing chunks (a stretch often ends well before `k`), their sums taken one by one in the step
        loop's order, so the clock and busy time equal the step-by-step run's to the last bit."""
        model = self.model
        dts = [dt]  # dts[j]: step j of the stretch (step 0 the one just scheduled)
        m, t = 0, now + dt  # t: start of step m + 1
        starts = [now]  # starts[j]: when step j of the stretch is scheduled (host tiers place evictions then)
        chunk = FAST_FORWARD_CHUNK
        while m < k and t < h:
            starts.append(t)
            if m + 1 >= len(dts):
                n = min(chunk, k + 1 - len(dts))
                dts += model.decode_run_s([c + len(dts) for c in decode], n).tolist()
                chunk *= 2
            m += 1
            t += dts[m]
        m = rep.skip_decodes(m, starts)  # fewer where the free queue runs short
        if not m:
            return now, dt
        for j in range(m):  # summed in the step loop's order, to the last bit
            rep.busy_s += dts[j]
            now += dts[j]
        rep.steps += m
        self.steps += m
        return now, dts[m]

    def arrive(self, r: int, now: float, due: dict) -> None:
        """Request r arrives at `now`: refused, or routed to a replica (a vLLM replica idle until now is due)."""
        a, cfg = self.a, self.cfg
        a.arrival[r] = now
        self.count(now, +1)
        if self.refuses(r):
            a.rejected[r] = True
            self.leave(r, now)
            return
        i = route(cfg.router, self.reps, a.blocks_of(r) if cfg.router == "prefix" else (), self.counter,
                  cfg.overlap_weight)
        self.counter += 1
        a.replica[r] = i
        rep = self.reps[i]
        rep.add(r)
        if rep.busy_until < 0:
            due[rep.index] = rep

    # -- the clock ------------------------------------------------------------------------------------------------
    def run(self) -> "EventLoop":
        arrivals, ends = self.arrivals, self.ends
        due: dict = {}  # vLLM replicas to step once every event at due_t is in (arrivals of a step join it together)
        due_t = None
        while arrivals or ends or due:
            t_next = min(arrivals[0][0] if arrivals else math.inf, ends[0][0] if ends else math.inf)
            if due and t_next > due_t:
                for i in sorted(due):
                    self.step_vllm(due[i], due_t)
                due = {}
                continue
            if ends and (not arrivals or ends[0] < arrivals[0]):  # one time order: (time, kind, index)
                now, kind, x = heapq.heappop(ends)
            else:
                now, kind, x = heapq.heappop(arrivals)
            if self.last_t is None:
                self.last_t = self.t0 = now
            due_t = now
            if kind == 1:
                self.arrive(x, now, due)
            else:
                due[x] = self.reps[x]
        for rep in self.reps:
            if rep.sched.has_work():
                raise ParameterError(f"replica {rep.index} stopped with requests it can never schedule")
        return self
