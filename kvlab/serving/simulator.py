"""A discrete-event serving simulator: a trace's requests through R replicas of one deployment behind a router.

Requests arrive at the trace's timestamps; with `closed_loop` (default for traces with session ids, i.e. the
synthetic agent workload) a session's next turn arrives its trace pause (think time / tool call) after the
previous turn finished, so slow service delays the session. Each replica runs `kvlab.serving.replica.VllmReplica`
(vLLM 0.33's scheduling rules) with a KV pool sized by kvlab's capacity rules for the engine and deployment
(`kvlab.serving.capacity.plan`: weights, activations, paging) and optional DRAM / SSD tiers behind it
(`kvlab.serving.hosttiers.HostTiers`); each step lasts what the StepModel says plus the time to bring its
DRAM / SSD prefix hits into HBM. A request with no prompt or no output token is refused, as vLLM refuses it
(vllm/v1/engine/input_processor.py _validate_prompt_len: "The decoder prompt cannot be empty"; sampling_params.py:
max_tokens must be at least 1). The step model's description (`kvlab.serving.stepmodel.describe`) travels with
every result. The scheduler is kvlab.serving.scheduler.VllmScheduler (vLLM 0.33's rules, checked step for step
against vLLM itself: docs/scheduler.md), whose HBM prefix cache is the pool's free-but-hashed blocks; DRAM / SSD
tiers behind it (`cache_blocks[1:]`) are kvlab's one tier stack, fed by the pool's evictions and searched where the
pool's hit stops (kvlab.serving.hosttiers).
"""
from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field

import numpy as np

from ..checks import cdiv, need_choice, need_int, need_number, need_type
from ..errors import NoEngineLayout, ParameterError
from ..sim.policies import ADMISSIONS, ONLINE
from ..sim.traces import Trace
from .hosttiers import HostTiers
from .replica import VllmReplica
from .router import ROUTERS
from .eventloop import EventLoop
from .stepmodel import StepModel, Target, as_step_model, check_target, describe

TIERS = ("hbm", "dram", "ssd")


@dataclass(frozen=True)
class ServeConfig:
    """One deployment's replicas and their scheduler settings."""

    replicas: int = 1  # R identical replicas (data parallel) behind the router
    pool_tokens: int = 1_000_000  # KV pool of one replica, tokens (from_deployment sizes it by kvlab's rules)
    page_tokens: int = 16  # tokens per KV page (vLLM block_size)
    max_num_batched_tokens: int = 8192  # token budget of one step (vLLM chunked prefill)
    max_num_seqs: int = 256  # requests running at once per replica (vLLM max_num_seqs)
    max_model_len: int | None = None  # vLLM's: longer prompts refused, outputs capped (None: the pool's size)
    router: str = "round_robin"  # round_robin, least_loaded or prefix
    overlap_weight: float = 1.0  # prefix router: weight of uncached prefill blocks against active blocks
    cache_blocks: tuple[int, int, int] | None = None  # prefix-cache budget per tier in trace blocks (HBM's unused:
    # the pool is HBM); DRAM and SSD above 0 put host tiers behind the pool (trace blocks x their tokens / page_tokens
    # KV blocks each); None: no host tiers
    block_bytes: int = 1  # bytes of one trace block (tier transfers)
    read_bytes_per_s: tuple[float, float, float] = (3.35e12, 64e9, 7e9)  # into HBM from each tier (H100 defaults)
    ttl_s: float = math.inf  # host DRAM copies expire this long after last use (to SSD: kvlab.sim.tierstack)
    policy: str = "lru"  # eviction policy of every host tier (an online one: kvlab.sim.policies.ONLINE)
    admission: str = "all"  # host tiers' admission rule: "all", or "second" (stored from a block's second access)
    gpus_per_replica: int = 1  # GPUs of one replica (TP x PP), for GPU-seconds
    closed_loop: bool | None = None  # sessions wait for their previous turn; None: when the trace has sessions
    layout_note: str = ""  # how the KV pool was counted, when not by the engine's own layout (deployment_config)
    pool_note: str = ""  # the memory rule that budgeted the pool and where the weights came from (deployment_config)
    target: Target | None = None  # the deployment deployment_config sized (None: a bare configuration)
    num_blocks: int | None = None  # KV pool blocks per replica, vLLM's null block included (None: pool_tokens / page)
    prefix_caching: bool = True  # vLLM's enable_prefix_caching (needs a trace with prefix information)
    async_scheduling: bool = True  # vLLM's default: a step is scheduled before the previous one's output lands
    chunked_prefill: bool = True  # vLLM's enable_chunked_prefill
    long_prefill_token_threshold: int = 0  # most tokens of one prefill chunk when others wait (0: no limit)
    reserve_full_isl: bool = True  # vLLM's scheduler_reserve_full_isl: admit only when the whole input fits

    def __post_init__(self):
        need_int("replicas", self.replicas, 1)
        need_int("pool_tokens", self.pool_tokens, 1)
        need_int("page_tokens", self.page_tokens, 1)
        need_int("max_num_batched_tokens", self.max_num_batched_tokens, 1)
        need_int("max_num_seqs", self.max_num_seqs, 1)
        need_int("long_prefill_token_threshold", self.long_prefill_token_threshold, 0)
        if self.num_blocks is not None:
            need_int("num_blocks", self.num_blocks, 2)  # one is vLLM's null block
        elif self.pool_tokens < 2 * self.page_tokens:
            raise ParameterError(f"a pool of {self.pool_tokens:,} tokens holds {self.pool_tokens // self.page_tokens} "
                                 f"blocks of {self.page_tokens} tokens: vLLM needs two at least (one is its null "
                                 "block)")
        if self.max_num_batched_tokens < self.page_tokens:
            raise ParameterError(f"max_num_batched_tokens ({self.max_num_batched_tokens:,}) is below one block "
                                 f"({self.page_tokens} tokens): a step could not fill a block")
        if (not self.chunked_prefill and self.max_model_len is not None
                and self.max_num_batched_tokens < self.max_model_len):
            raise ParameterError(f"without chunked prefill max_num_batched_tokens ({self.max_num_batched_tokens:,}) "
                                 f"must be at least max_model_len ({self.max_model_len:,}), as vLLM requires")
        if self.max_model_len is not None:
            need_int("max_model_len", self.max_model_len, 1)
        need_choice("router", self.router, ROUTERS)
        need_number("overlap_weight", self.overlap_weight, 0.0)
        need_int("gpus_per_replica", self.gpus_per_replica, 1)
        need_number("ttl_s", self.ttl_s, 0.0, lo_open=True, finite=False)
        need_choice("policy", self.policy, ONLINE)
        need_choice("admission", self.admission, tuple(ADMISSIONS))
        if self.cache_blocks is not None:
            if len(self.cache_blocks) != 3:
                raise ParameterError("cache_blocks needs one capacity per tier (hbm, dram, ssd)")
            for t, c in zip(TIERS, self.cache_blocks):
                need_int(f"{t} cache blocks", c, 0)
            if not self.prefix_caching and (self.cache_blocks[1] or self.cache_blocks[2]):
                raise ParameterError("DRAM / SSD tiers hold prefix-cached blocks: they need prefix caching "
                                     "(drop --no-prefix-caching, or the host tiers)")
        for t, bw in zip(TIERS, self.read_bytes_per_s):
            need_number(f"{t} read bandwidth (B/s)", bw, 0.0, lo_open=True)


class _Arrays:
    """Per-request state in flat arrays (index = request)."""

    def __init__(self, trace: Trace):
        R = len(trace)
        self.trace = trace
        # scalar state the scheduler touches every step lives in Python lists (faster to index than arrays)
        self.input = trace.input_tokens.astype(np.int64).tolist()  # prompt tokens
        self.output = np.maximum(trace.output_tokens.astype(np.int64), 1).tolist()  # tokens to generate (>= 1)
        self.arrival = np.full(R, np.nan)  # arrival time (closed loop: set when the previous turn ends)
        self.generated = [0] * R  # tokens sampled so far
        self.preempted = [0] * R  # times preempted
        self.started = [-1.0] * R  # first admission time (-1: not yet)
        self.first_token = [math.nan] * R  # time of the first output token
        self.finished = [math.nan] * R  # time of the last output token
        self.rejected = np.zeros(R, bool)  # can never fit: refused at arrival
        self.replica = np.full(R, -1, np.int64)  # replica the router chose
        self.hit_blocks = np.zeros((R, 3), np.int64)  # prefix-hit blocks per tier
        self.hit_tok = np.zeros(R, np.int64)  # prefix-hit tokens
        self.hit_tier_tok = np.zeros((R, 3), np.int64)  # prefix-hit tokens per tier
        self.off = trace.block_offsets
        self.ids = trace.block_ids

    def blocks_of(self, r: int):
        return self.ids[self.off[r]:self.off[r + 1]].tolist() if self.ids is not None else []


@dataclass
class ServeResult:
    """Per request and per run outcomes."""

    config: ServeConfig  # what was simulated
    arrival_s: np.ndarray  # [R] arrival times
    queue_s: np.ndarray  # [R] arrival to first admission (NaN: rejected)
    ttft_s: np.ndarray  # [R] arrival to first token
    tpot_s: np.ndarray  # [R] mean time per output token after the first (NaN: one output token)
    e2e_s: np.ndarray  # [R] arrival to last token
    rejected: np.ndarray  # [R] refused: the request can never fit
    output_tokens: np.ndarray  # [R] tokens generated
    input_tokens: np.ndarray  # [R] prompt tokens
    hit_blocks: np.ndarray  # [3] prefix-hit blocks per tier
    hit_tokens: np.ndarray  # [3] prefix-hit tokens per tier
    moved_bytes: dict  # "src->dst" -> bytes over all replicas
    makespan_s: float  # first arrival to last completion
    busy_s: np.ndarray  # [replicas] seconds each replica spent in steps
    steps: int  # steps run over all replicas
    preemptions: int  # preemptions by recompute
    mean_in_system: float  # time-average requests in the system, integrated by the event loop
    slo: dict = field(default_factory=dict)  # ttft_s / tpot_s limits used for goodput
    step_time: dict = field(default_factory=dict)  # where the step times come from (stepmodel.describe)
    request_preemptions: np.ndarray | None = None  # [R] times each request was preempted
    prefix_hit_tokens: np.ndarray | None = None  # [R] prefix-hit tokens of each request at its first admission
    steps_log: list | None = None  # one dict per step (record_steps=True): time, replica, tokens, preempted, free
    loop: str = "python"  # which loop ran it: "compiled" (kvlab.serving.compiledrun), or "python (why not compiled)"

    @property
    def completed(self) -> np.ndarray:
        return ~self.rejected & np.isfinite(self.e2e_s)

    def goodput(self, ttft_s: float = math.inf, tpot_s: float = math.inf) -> float:
        """Completed requests per second meeting both SLOs."""
        ok = self.completed & (self.ttft_s <= ttft_s) & ~(self.tpot_s > tpot_s)
        return float(ok.sum() / self.makespan_s) if self.makespan_s > 0 else 0.0

    def summary(self) -> dict:
        c = self.completed
        pct = lambda x, q: float(np.nanpercentile(x[c], q)) if c.any() and np.isfinite(x[c]).any() else None
        inp = int(self.input_tokens[~self.rejected].sum())
        out_tok = int(self.output_tokens[c].sum())
        span = self.makespan_s
        d = dict(requests=len(self.e2e_s), completed=int(c.sum()), rejected=int(self.rejected.sum()),
                 queue_mean_s=float(self.queue_s[c].mean()) if c.any() else None,
                 ttft_mean_s=float(self.ttft_s[c].mean()) if c.any() else None,
                 ttft_p50_s=pct(self.ttft_s, 50), ttft_p99_s=pct(self.ttft_s, 99),
                 tpot_p50_s=pct(self.tpot_s, 50), tpot_p99_s=pct(self.tpot_s, 99),
                 e2e_mean_s=float(self.e2e_s[c].mean()) if c.any() else None,
                 e2e_p99_s=pct(self.e2e_s, 99), makespan_s=span,
                 throughput_tokens_per_s=out_tok / span if span > 0 else 0.0,
                 throughput_requests_per_s=float(c.sum()) / span if span > 0 else 0.0,
                 goodput_requests_per_s=self.goodput(**self.slo), slo=dict(self.slo),
                 token_hit_rate=float(self.hit_tokens.sum() / inp) if inp else 0.0,
                 mean_in_system=self.mean_in_system, steps=self.steps, preemptions=self.preemptions,
                 gpu_seconds=span * len(self.busy_s) * self.config.gpus_per_replica,
                 busy_gpu_seconds=float(self.busy_s.sum()) * self.config.gpus_per_replica,
                 moved_bytes=dict(self.moved_bytes), step_time=dict(self.step_time))
        for i, t in enumerate(TIERS):
            d[f"{t}_hit_blocks"] = int(self.hit_blocks[i])
            d[f"{t}_hit_tokens"] = int(self.hit_tokens[i])
            d[f"{t}_token_hit_rate"] = float(self.hit_tokens[i] / inp) if inp else 0.0
        return d


def simulate_serving(trace: Trace, config: ServeConfig | None = None, step_model: StepModel | None = None,
                     slo: dict | None = None, fast_forward: bool = True, record_steps: bool = False,
                     progress: bool = False, compiled: bool | None = None) -> ServeResult:
    """Run `trace` through `config.replicas` replicas; `step_model` times each step (None: for a deployment_config,
    kvlab.serving.steptime.step_time(..., "auto") of its deployment; a bare ServeConfig needs one given). A step
    model that prices one deployment (`target`: the affine fit, a step-time source) is refused for another.
    `slo` = dict(ttft_s=, tpot_s=) for goodput. Deterministic: no randomness beyond the trace's own.

    `fast_forward`: a replica whose batch only decodes, with nothing able to join it, applies its steps up to the
    next event of the run (an arrival, another replica's step, a completion, a page it cannot grow into) at once,
    their times priced in one vectorized call: every figure equals the step-by-step loop's (`False`; tests hold
    the two equal), at a fraction of its cost on lightly loaded replicas. The loop is
    kvlab.serving.eventloop.EventLoop; `progress` shows a tqdm bar of requests done on stderr.
    `record_steps` keeps one dict per step (`steps_log`), every step run one by one.

    `compiled`: run the loop in kvlab.serving.compiledrun (one replica, no host tiers, no step log, affine or
    roofline step times: the same figures to the last bit, many times faster); None uses it wherever it applies,
    False runs the Python loop (the reference), True refuses a run it does not cover."""
    need_type("trace", trace, Trace, "a kvlab.sim.traces.Trace")
    cfg = ServeConfig() if config is None else need_type("config", config, ServeConfig, "a ServeConfig")
    model = step_model if step_model is not None else default_step_model(cfg)
    steps_model = as_step_model(model)  # the one step-time protocol (a third party's step_s adapted once)
    check_target(model, cfg.target)
    check_requests(trace)
    slo = dict(slo or {})
    for k in slo:
        if k not in ("ttft_s", "tpot_s"):
            raise ParameterError(f"slo takes ttft_s and tpot_s, got {k!r}")
        need_number(f"slo {k}", slo[k], 0.0, lo_open=True)
    N = len(trace)
    a = _Arrays(trace)
    log = [] if record_steps else None
    knobs = scheduler_knobs(cfg)
    caching = cfg.prefix_caching and trace.has_prefixes
    reps = [VllmReplica(i, knobs, a, caching, log, host_tiers(cfg, trace) if caching else None)
            for i in range(cfg.replicas)]
    refused = never_fits(np.asarray(a.input, np.int64), np.asarray(a.output, np.int64), knobs)  # [R]
    refuses = refused.__getitem__
    closed = cfg.closed_loop if cfg.closed_loop is not None else trace.session_ids is not None
    if closed and trace.session_ids is None:
        raise ParameterError(f"closed_loop needs a trace with session ids; {trace.name!r} has none")
    arrivals, nxt, gap = _arrivals(trace, closed)
    # a completion at time t makes the session's next turn arrive at t + gap or later (closed loop)
    min_gap = float(gap[nxt >= 0].min()) if closed and (nxt >= 0).any() else math.inf
    from . import compiledrun
    why = compiledrun.unsupported(cfg, steps_model, trace, knobs, host=reps[0].host, logging=log is not None)
    if compiled and why:
        raise ParameterError(f"the compiled loop does not run this: {why}")
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=N, unit="request", desc="serve-sim", mininterval=0.5, smoothing=0.05)
    try:
        if compiled is not False and not why:
            steps, area, t0, t_end, busy, preemptions, moved = compiledrun.run_compiled(
                trace, a, knobs, steps_model, arrivals, nxt, gap, refused, caching=caching,
                fast_forward=fast_forward, host=reps[0].host, progress=bar)
            busy_s, preempt = np.array([busy]), preemptions
        else:
            loop = EventLoop(cfg, a, reps, steps_model, arrivals, nxt, gap, refuses, min_gap=min_gap,
                             fast_forward=fast_forward, logging=log is not None, progress=bar).run()
            steps, area, t0, t_end = loop.steps, loop.area, loop.t0, loop.t_end
            busy_s, preempt = np.array([r.busy_s for r in reps]), int(sum(r.preemptions for r in reps))
            moved = {}
            for rep in reps:
                if rep.cache is not None:
                    for k, v in rep.cache.moved.items():
                        moved[k] = moved.get(k, 0) + v
    finally:
        if bar is not None:
            bar.close()
    fin, first, started = np.array(a.finished), np.array(a.first_token), np.array(a.started)
    outn, inp = np.array(a.output, np.int64), np.array(a.input, np.int64)
    ok = ~a.rejected & np.isfinite(fin)
    queue = np.where(ok, started - a.arrival, np.nan)
    ttft = np.where(ok, first - a.arrival, np.nan)
    e2e = np.where(ok, fin - a.arrival, np.nan)
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(ok & (outn > 1), (fin - first) / (outn - 1), np.nan)
    hit_blocks = a.hit_blocks.sum(0)
    hit_tokens = a.hit_tier_tok.sum(0)
    span = float(t_end - t0) if t0 is not None else 0.0
    return ServeResult(cfg, a.arrival, queue, ttft, tpot, e2e, a.rejected.copy(),
                       np.where(ok, outn, 0), inp, hit_blocks, hit_tokens, moved, span, busy_s, steps, preempt,
                       float(area / span) if span > 0 else 0.0, slo, describe(model), np.array(a.preempted, np.int64),
                       a.hit_tok.copy(), log, "compiled" if compiled is not False and not why else
                       f"python ({why or 'asked for'})")


def _arrivals(trace: Trace, closed: bool):
    """(heap of first arrivals (time, 1, request), [R] each request's next turn in its session (-1: none), [R] the
    pause before it): closed loop, a session's later turns wait for its previous one (pushed when it leaves)."""
    N = len(trace)
    nxt = np.full(N, -1, np.int64)  # closed loop: the session's next turn
    gap = np.zeros(N)  # and the pause before it
    ts = trace.timestamps.astype(float)
    if closed:
        sid = trace.session_ids
        order = np.lexsort((np.arange(N), sid))
        first = np.ones(N, bool)
        same = sid[order[1:]] == sid[order[:-1]]
        nxt[order[:-1][same]] = order[1:][same]
        gap[order[:-1][same]] = ts[order[1:][same]] - ts[order[:-1][same]]
        first[order[1:][same]] = False
        arrivals = [(ts[r], 1, int(r)) for r in np.flatnonzero(first)]
    else:
        arrivals = [(ts[r], 1, r) for r in range(N)]
    heapq.heapify(arrivals)
    return arrivals, nxt, gap


def host_tiers(cfg: ServeConfig, trace: Trace) -> HostTiers | None:
    """One replica's DRAM / SSD tiers (None when `cfg` gives neither): `cache_blocks` counts trace blocks, the
    tiers hold KV blocks of `page_tokens`, so each trace block is trace.block_tokens / page_tokens of them, at that
    share of `block_bytes`."""
    if cfg.cache_blocks is None or not (cfg.cache_blocks[1] or cfg.cache_blocks[2]):
        return None
    bt, pt = trace.block_tokens, cfg.page_tokens
    dram, ssd = (c * bt // pt for c in cfg.cache_blocks[1:])
    return HostTiers(dram, ssd, max(1, round(cfg.block_bytes * pt / bt)), cfg.read_bytes_per_s, cfg.ttl_s,
                     cfg.policy, cfg.admission)


def scheduler_blocks(cfg: ServeConfig) -> int:
    """KV pool blocks of one replica, vLLM's null block included."""
    return cfg.num_blocks if cfg.num_blocks is not None else max(cfg.pool_tokens // cfg.page_tokens, 2)


def scheduler_knobs(cfg: ServeConfig):
    """The VllmScheduler settings of one replica of `cfg`."""
    from .scheduler import SchedulerKnobs
    nb = scheduler_blocks(cfg)
    return SchedulerKnobs(num_blocks=nb, block_size=cfg.page_tokens, max_num_seqs=cfg.max_num_seqs,
                          max_num_batched_tokens=cfg.max_num_batched_tokens,
                          max_model_len=cfg.max_model_len or (nb - 1) * cfg.page_tokens,
                          enable_prefix_caching=cfg.prefix_caching, async_scheduling=cfg.async_scheduling,
                          enable_chunked_prefill=cfg.chunked_prefill,
                          long_prefill_token_threshold=cfg.long_prefill_token_threshold,
                          reserve_full_isl=cfg.reserve_full_isl)


def never_fits(inp, out, k):
    """A request vLLM would refuse (a prompt longer than max_model_len: vllm/v1/engine/input_processor.py) or could
    never finish (its sequence needs more blocks than the pool has, less the null block: vLLM would preempt it
    forever; kvlab refuses it at arrival). Ints, or int arrays of prompts and outputs ([R] bools)."""
    return (inp > k.max_model_len) | (cdiv(np.minimum(inp + out - 1, k.max_model_len), k.block_size) > k.num_blocks - 1)


def default_step_model(cfg: ServeConfig):
    """The step model a deployment_config runs on when none is given: step_time(..., "auto") of its deployment
    (aiconfigurator where it covers it, else the roofline). A bare ServeConfig names no deployment to price."""
    if cfg.target is None:
        raise ParameterError("give a step_model: a bare ServeConfig names no model or GPU to price steps for "
                             "(deployment_config(...) does; or AffineStepModel(...), kvlab.serving.steptime.step_time)")
    from .steptime import step_time
    t = cfg.target
    if t.engine is None or t.pp > 1:
        raise ParameterError(f"no step-time source prices {t.label()}: give a step_model")
    return step_time(t.model, t.gpu, t.engine, t.tp, t.kv_format)


def check_requests(trace: Trace) -> None:
    """Refuse a trace with a request of no prompt or no output token (vLLM refuses both), naming the first such
    request and how many there are; `empty_requests` finds them."""
    bad = empty_requests(trace)
    if len(bad):
        r = int(bad[0])
        more = len(bad) - 1
        raise ParameterError(
            f"trace {trace.name}: request {r + 1:,} (of {len(trace):,}) has {int(trace.input_tokens[r]):,} input and "
            f"{int(trace.output_tokens[r]):,} output tokens" + (f" ({more:,} more like it)" if more else "")
            + ": an engine serves no empty prompt and generates at least one token (vLLM refuses both)")


def empty_requests(trace: Trace) -> np.ndarray:
    """[K] indices of the requests with no input or no output token, in order."""
    return np.flatnonzero((np.asarray(trace.input_tokens) < 1) | (np.asarray(trace.output_tokens) < 1))


def replica_capacity(model, gpu, par, engine: str | None, kv_format=None, utilization: float = 0.9,
                     activation_gb: float = 4.0, weights: int | None = None):
    """(kvlab.serving.capacity.plan for one replica, the engine whose rule it used, a note): a model the engine
    has no published layout for is counted as it stores it, under vLLM's memory rule, and the note says so. Refuses
    a deployment whose weights leave no KV memory (a ParameterError naming it). `weights`: whole-model weight bytes
    (None: kvlab's estimate, data/weights.json)."""
    from .capacity import plan
    kw = dict(parallel=par, kv_format=kv_format, utilization=utilization, activation_gb=activation_gb,
              weights=weights)
    try:
        return plan(model, gpu, 1, engine=engine, **kw), engine, ""
    except NoEngineLayout as e:
        if engine is None:
            raise
        note = f"KV pool counted as the model stores it, under vLLM's memory rule ({str(e).split(';')[0]})"
        return plan(model, gpu, 1, engine=None, **kw), None, note


BOUNDED_PROBE_TOKENS = 1 << 20  # a context past every window: the bounded state a request can hold at most


def deployment_config(model, gpu, trace: Trace, *, engine: str | None = "vllm", tp: int = 1, pp: int = 1,
                      replicas: int = 1, kv_format=None, hbm_gb: float | None = None, dram_gb: float = 0.0,
                      ssd_gb: float = 0.0, ttl_s: float = math.inf, utilization: float = 0.9,
                      activation_gb: float = 4.0, block_size: int | None = None, num_blocks: int | None = None,
                      pool_tokens: int | None = None, weights: int | None = None, **scheduler) -> ServeConfig:
    """A ServeConfig for `replicas` copies of `model` on `gpu` under TP x PP: the KV pool of one replica is
    kvlab.serving.capacity.plan's usable KV bytes over its per-GPU bytes per token (the engine's paging and memory
    rule); its free-but-hashed blocks are the HBM prefix cache (vLLM's), with `dram_gb` / `ssd_gb` of host tiers
    behind it (kvlab.serving.hosttiers), in trace blocks, at the GPU's bandwidths (kvlab.sim.tiering.make_tiers).
    `hbm_gb` is refused: the pool is the HBM tier (size it with num_blocks or pool_tokens). `weights`: whole-model
    weight bytes (None: kvlab's estimate; a model it has none for needs them). `scheduler`: other ServeConfig
    fields.
    A model the engine has no published layout for (V4.1-Flash under vLLM) is counted as the model stores it,
    under vLLM's memory rule, and `layout_note` says so (as the roofline's step times do)."""
    from ..hardware import get_gpu
    from .parallel import Parallelism
    from ..sim.tiering import make_tiers
    if hbm_gb is not None:
        raise ParameterError(f"hbm_gb {hbm_gb:g}: under vLLM's rules the HBM prefix cache is the KV pool's free blocks; "
                             "size the pool with num_blocks or pool_tokens (--num-blocks, --pool-tokens)")
    par = Parallelism(tp=need_int("tp", tp, 1), pp=need_int("pp", pp, 1))
    target = Target.of(model, gpu, engine, tp, pp, kv_format)
    cap, engine, note = replica_capacity(model, gpu, par, engine, kv_format, utilization, activation_gb, weights)
    per_token = float(cap.session.bytes_per_token)
    from ..engines import allocate
    alloc = allocate(model, kv_format=kv_format, engine=engine)
    bounded = alloc.session(BOUNDED_PROBE_TOKENS).bounded  # B a long request holds in windows and fixed states
    if per_token <= 0:
        raise ParameterError(f"{cap.model}: no KV grows with the context (every layer holds a window or a fixed "
                             f"state, {bounded:,} B a request); serve-sim's scheduler pages growing KV in blocks "
                             "(vLLM's full-attention manager), and vLLM's sliding-window and state managers are not "
                             "modelled: use `kvlab sessions` for this model's capacity")
    whole = float(alloc.bytes_per_token)  # whole-model growing bytes per token (per_token: one GPU's share)
    if bounded >= whole * (alloc.engine.block_tokens or 16):  # windows or states (not a format's few scales)
        note = "; ".join(n for n in (note, (
            f"the pool pages growing KV ({whole:,.0f} B a token, whole model); the up to {bounded:,} B a request holds in "
            "sliding windows and fixed states is left out of it (vLLM's sliding-window and state groups are not "
            "modelled), so the pool is overstated by that much for each request running")) if n)
    pool = int(cap.usable_kv_bytes // per_token)
    if num_blocks is None and pool_tokens is None and cap.budget is not None:
        from .capacity import weight_bytes
        pool_note = (f"KV pool per GPU ({cap.budget.engine}'s rule): {cap.budget.rule}; weights "
                     + ("given" if weights is not None else f"estimated, {weight_bytes(model).note}"))
    else:
        pool_note = "KV pool given (num_blocks / pool_tokens)" if num_blocks or pool_tokens else ""
    if pool < 1:
        raise ParameterError(f"{cap.model} on {cap.gpu.name}: the KV pool holds no token")
    page = alloc.engine.block_tokens or 16  # exact storage: vLLM's 16
    if block_size is not None:
        page = need_int("block_size", block_size, 1)
    if num_blocks is not None and pool_tokens is not None:
        raise ParameterError(f"give the pool as num_blocks ({num_blocks:,}) or pool_tokens ({pool_tokens:,}), not both")
    if pool_tokens is not None:
        pool = need_int("pool_tokens", pool_tokens, 1)
        if pool % page:
            raise ParameterError(f"block size {page} does not divide the pool of {pool:,} tokens "
                                 f"({pool // page:,} blocks and {pool % page} tokens over)")
    if num_blocks is not None:
        pool = need_int("num_blocks", num_blocks, 2) * page
    g = get_gpu(gpu)
    bt = trace.block_tokens
    hbm = cap.usable_kv_bytes * par.gpus / 1e9  # the replica's GPUs hold the pool (the HBM tier)
    tiers = make_tiers(model, hbm, dram_gb, ssd_gb, gpu=g, block_tokens=bt, ttl_s=ttl_s, kv_format=kv_format)
    return ServeConfig(replicas=need_int("replicas", replicas, 1), pool_tokens=pool, page_tokens=page,
                       num_blocks=num_blocks,
                       cache_blocks=tiers.capacity_blocks if trace.has_prefixes else None,
                       block_bytes=tiers.block_bytes, read_bytes_per_s=tiers.read_bytes_per_s, ttl_s=ttl_s,
                       gpus_per_replica=par.gpus, layout_note=note, pool_note=pool_note, target=target,
                       **scheduler)
