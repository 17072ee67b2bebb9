"""How many GPUs a trace needs (notebook 09): deployments of a model and KV format, run through the serving simulator
(kvlab.serving.simulator) on one step-time source, at offered loads, with and without a host-DRAM tier, and the
fewest replicas meeting an SLO (kvlab.serving.plan).

A deployment is written 'MODEL[:KV_FORMAT][@tpN]' ('qwen3-8b:fp8_e4m3', 'deepseek-v4-flash@tp4'). Offered load is a
multiple of the trace's own: `load=4` divides every arrival time by four, and requests arrive at those times (open
loop: a session's next turn does not wait for its last one to finish, so the load really is four times the trace's;
closed_loop=True makes turns wait, which bounds the load by the number of sessions). Every figure is a simulation under the assumptions `assumptions()` lists; the step times are the source's
(the roofline: an estimate, a lower bound for MoE models; aiconfigurator: NVIDIA's measured kernel data).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace

from ..checks import need_int, need_number
from ..errors import ParameterError
from ..sim.traces import Trace, load_trace
from .plan import Plan, fewest_replicas, goodput_limits
from .simulator import ServeResult, deployment_config, simulate_serving

_DEPLOYMENT = re.compile(r"^\s*([^:@\s]+)(?::([^@\s]+))?(?:@tp(\d+))?\s*$")


@dataclass(frozen=True)
class Deployment:
    """One model on one GPU type: its KV format and tensor-parallel size per replica."""

    model: str  # catalog name, config.json path or Hub id
    kv_format: str | None = None  # KV number format (None: the model's own)
    tp: int = 1  # GPUs per replica (tensor parallel)

    @classmethod
    def parse(cls, text: str) -> "Deployment":
        """'MODEL[:KV_FORMAT][@tpN]' -> Deployment."""
        m = _DEPLOYMENT.match(text) if isinstance(text, str) else None
        if not m:
            raise ParameterError(f"deployment {text!r}: write MODEL[:KV_FORMAT][@tpN], e.g. qwen3-8b:fp8_e4m3 or "
                                 "deepseek-v4-flash@tp4")
        return cls(m[1], m[2], need_int(f"deployment {text!r} tp", int(m[3] or 1), 1))

    @property
    def label(self) -> str:
        return f"{self.model} {self.kv_format or 'own format'}" + (f" TP{self.tp}" if self.tp > 1 else "")


def scaled(trace: Trace, load: float) -> Trace:
    """The trace at `load` times its offered load: arrival times divided by it (requests then arrive at those times:
    open loop)."""
    load = need_number("load", load, 0.0, lo_open=True)
    return trace if load == 1 else replace(trace, timestamps=trace.timestamps / load)


MAX_SESSIONS = 100_000  # most synthetic sessions generated (about 10 requests each): bounds what --load can ask for


def synthetic_at(load: float, sessions: int, seed: int = 0, **workload) -> Trace:
    """The synthetic agent workload at `load` times its users: `load` x the sessions, arriving `load` x as fast
    (the same hour of traffic from more users, each session's turns still waiting for the last: closed loop)."""
    from ..sim.traces import AgentWorkload
    load = need_number("load", load, 0.0, lo_open=True)
    n = max(1, round(need_int("sessions", sessions, 1) * load))
    if n > MAX_SESSIONS:
        raise ParameterError(f"the synthetic workload at load {load:g} x {sessions:,} sessions is {n:,} sessions; at "
                             f"most {MAX_SESSIONS:,} are generated (about ten requests each): lower the load or the "
                             "sessions")
    rate = workload.pop("session_rate_per_s", AgentWorkload.session_rate_per_s)
    return load_trace("synthetic", seed=seed, sessions=n, session_rate_per_s=rate * load, **workload)


def trace_at(name, load: float = 1.0, *, limit: int | None = None, seed: int = 0, block_tokens: int | None = None,
             **workload) -> Trace:
    """A trace by name at `load` x its offered load, built as notebook 09 builds it and `kvlab plan --load` does: the
    synthetic workload grows by users (synthetic_at; `workload` its knobs: sessions, human_pause_median_s, ...), a
    recorded trace is replayed faster (scaled). `limit` keeps the first requests; `block_tokens` is a Mooncake
    file's hashing block size (or the synthetic workload's), 512 when not given."""
    load = need_number("load", load, 0.0, lo_open=True)
    if str(name) == "synthetic":
        from ..sim.traces import AgentWorkload
        if block_tokens is not None:
            workload["block_tokens"] = block_tokens
        tr = synthetic_at(load, workload.pop("sessions", AgentWorkload.sessions), seed, **workload)
        return tr if limit is None else tr.head(need_int("limit", limit, 1))
    if workload:
        raise ParameterError(f"{sorted(workload)[0]} applies to the synthetic workload only, not to trace {name}")
    kw = {} if block_tokens is None else {"block_tokens": block_tokens}
    return scaled(load_trace(name, limit=limit, **kw), load)


class Study:
    """One trace, GPU, engine and step-time source; simulator runs per deployment, replica count, load and tiers,
    each run once (kept by its arguments). Offered load: a trace with sessions from the synthetic workload
    (`synthetic={"sessions": N, "seed": S, ...}`) grows by more users (synthetic_at); a recorded trace is replayed
    faster (scaled)."""

    def __init__(self, trace: Trace, gpu: str, engine: str = "vllm", step_time: str = "roofline",
                 max_num_batched_tokens: int = 8192, max_num_seqs: int = 256, synthetic: dict | None = None):
        self.trace, self.gpu, self.engine, self.step_time = trace, gpu, engine, step_time
        self.scheduler = dict(max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs)
        self.synthetic = synthetic  # the synthetic workload's knobs (sessions, seed, ...), or None: a recorded trace
        self._models: dict = {}
        self._runs: dict = {}
        self._traces: dict = {1.0: trace}

    def trace_at(self, load: float) -> Trace:
        """The trace at `load` x its offered load (built once)."""
        load = float(need_number("load", load, 0.0, lo_open=True))
        if load not in self._traces:
            self._traces[load] = (synthetic_at(load, **self.synthetic) if self.synthetic is not None
                                  else scaled(self.trace, load))
        return self._traces[load]

    def step_model(self, d: Deployment):
        """The step-time source of a deployment (kvlab.serving.steptime), built once."""
        if d not in self._models:
            from .steptime import step_time
            self._models[d] = step_time(d.model, self.gpu, self.engine, d.tp, d.kv_format, source=self.step_time)
        return self._models[d]

    def config(self, d: Deployment, replicas: int = 1, dram_gb: float = 0.0, load: float = 1.0):
        return deployment_config(d.model, self.gpu, self.trace_at(load), engine=self.engine, tp=d.tp,
                                 replicas=replicas, kv_format=d.kv_format, dram_gb=dram_gb, **self.scheduler)

    def run(self, d: Deployment, replicas: int = 1, load: float = 1.0, dram_gb: float = 0.0,
            slo: dict | None = None) -> ServeResult:
        """The simulator's run of `replicas` replicas of `d` at `load` x the trace's offered load."""
        key = (d, replicas, load, dram_gb)
        if key not in self._runs:
            self._runs[key] = simulate_serving(self.trace_at(load), self.config(d, replicas, dram_gb, load),
                                               self.step_model(d), goodput_limits(slo))
        return self._runs[key]

    def load_curve(self, d: Deployment, loads, replicas: int = 1) -> list[dict]:
        """One row per offered load: throughput asked and served, TTFT / TPOT percentiles, queueing."""
        rows = []
        for x in loads:
            s = self.run(d, replicas, x).summary()
            tr = self.trace_at(x)
            span = float(tr.timestamps[-1] - tr.timestamps[0]) if len(tr) > 1 else 0.0
            asked = float(tr.output_tokens.sum()) / span if span > 0 else math.nan
            rows.append(dict(deployment=d.label, replicas=replicas, load=x, requests=len(tr), offered_tokens_per_s=asked,
                             **{k: s[k] for k in ("throughput_tokens_per_s", "ttft_p50_s", "ttft_p99_s",
                                                  "tpot_p50_s", "tpot_p99_s", "queue_mean_s", "token_hit_rate",
                                                  "preemptions", "rejected")}))
        return rows

    def fewest(self, d: Deployment, slo: dict, load: float = 1.0, dram_gb: float = 0.0,
               max_replicas: int = 256) -> Plan:
        """The fewest replicas of `d` meeting `slo` at `load` (kvlab.serving.plan's search over this study's runs)."""
        p = fewest_replicas(lambda r: self.run(d, r, load, dram_gb, slo).summary(), slo, d.tp,
                            max_replicas=max_replicas)
        p.tp = d.tp
        return p

    def assumptions(self, deployments) -> list[str]:
        """What every figure of the study rests on, one line each (printed by the notebook)."""
        out = [f"trace: {self.trace.name} ({len(self.trace):,} requests; {self.trace.source or 'file'})",
               f"GPU {self.gpu}, {self.engine} scheduler (continuous batching, chunked prefill under "
               f"{self.scheduler['max_num_batched_tokens']:,} tokens, at most {self.scheduler['max_num_seqs']} "
               "running), KV pool by kvlab's allocation rules (vLLM's 0.9 memory fraction, 4 GB activations)"]
        for d in deployments:
            sm, cfg = self.step_model(d), self.config(d)
            note = getattr(sm, "layout_note", "") or ""
            est = "an estimate" if getattr(sm, "estimate", True) else "measured kernel data"
            line = f"{d.label}: step times from {sm.name} ({est}); KV pool {cfg.pool_tokens:,} tokens per replica"
            if cfg.layout_note:
                line += f"; {cfg.layout_note}"
            elif note:
                line += note
            if sm.name == "roofline" and getattr(sm, "experts", 0):
                line += "; MoE: the roofline runs far low against aiconfigurator (a lower bound on step time)"
            out.append(line)
        return out


__all__ = ["Deployment", "Study", "scaled", "synthetic_at", "trace_at"]
