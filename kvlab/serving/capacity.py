"""Capacity planning: what one session costs and how many fit on a GPU and on a deployment.

Session cost (the 1M-token article's checklist, made exact):
  bytes/token x tokens - bytes of prefix-cache hits + expected replayed state after a miss + bounded state.
Bytes come from `kvlab.engines.allocate` only, on the GPU that holds the most (kvlab.serving.parallel): under
tensor parallelism KV heads split over the ranks but an MLA latent is replicated on every one unless decode
context parallelism interleaves it, pipeline stages hold their own layers, and data-parallel attention gives each
rank whole sessions of its own -- so the per-GPU figure is not the whole-model ratio. A model family with a bounded
replay (V4.1 keeps its sliding-window state in host RAM with a TTL) charges the expected replay after a miss.
Usable KV memory per GPU follows the chosen engine's rule (kvlab.serving.budget: vLLM's gpu_memory_utilization of
the total, SGLang's mem_fraction_static, TensorRT-LLM's fraction of the free memory), after this GPU's share of the
weights and an activations reserve (or the KV memory given, as vLLM's --kv-cache-memory-bytes gives it).
These sessions are counted as *held while decoding*: the bytes a session holds once it runs. vLLM plans its pool
by what a request *reserves at admission* (sliding windows with the tokens in flight, hybrid state blocks, blocks
floored): kvlab.serving.vllm_plan gives that figure, as vLLM logs it, beside this one.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from fractions import Fraction

from ..checks import cdiv, need_int, need_number, need_type
from ..engines import ENGINES, Allocation, allocate
from ..errors import ParameterError
from .budget import KvBudget, given_budget, kv_budget
from ..hardware import Gpu, get_gpu
from .parallel import ONE_GPU, Parallelism, PerGpu, per_gpu
from ..layout import check_tokens
from ..models import DATA_DIR, ModelSpec, load_model, read_config
from ..registry import get_family

WEIGHTS_FILE = DATA_DIR / "weights.json"
DEFAULT_UTILIZATION = 0.9  # vLLM's default gpu_memory_utilization (vLLM engine arguments)
DEFAULT_ACTIVATION_GB = 4.0  # assumption: peak activations + non-torch memory per GPU; vLLM profiles it per model
SHARD_CHOICES = (1, 2, 4, 8)  # weight-sharding degrees tried by the automatic choice


def _frac(x: float, name: str, lo: float = 0.0, hi: float = 1.0) -> float:
    return need_number(name, x, lo, hi)


def _alloc(model, scheme: str = "storage", kv_format=None) -> Allocation:
    return model if isinstance(model, Allocation) else allocate(model, scheme, kv_format)


# --- weights ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class WeightEstimate:
    """Bytes of a model's weights and how they were estimated."""

    model: str  # model name
    params: float  # total parameters
    nbytes: int  # weight bytes
    note: str  # which dtype was applied to which parameters, and the source of the count


def _expert_params(c: dict) -> int:
    """Routed + shared expert FFN parameters from a MoE config (gate, up and down matrices)."""
    experts = (c.get("n_routed_experts") or 0) + (c.get("n_shared_experts") or 0)
    dense = c.get("first_k_dense_replace") or 0
    return (c["num_hidden_layers"] - dense) * experts * 3 * c["hidden_size"] * c["moe_intermediate_size"]


def param_bits(quant: dict | None, dtype: str, expert: bool) -> float:
    """Bits per parameter from a config's quantization_config (block scales of 1 B included) or dtype."""
    if quant:
        block = quant.get("weight_block_size") or [1, 1]
        scale_bits = 8 / (block[0] * block[1]) if quant.get("scale_fmt") == "ue8m0" else 32 / (block[0] * block[1])
        if expert and quant.get("expert_dtype") == "fp4":
            return 4 + scale_bits
        if quant.get("quant_method") == "fp8":
            return 8 + scale_bits
    return {"float32": 32}.get(dtype, 16)


def weight_bytes(model: str | ModelSpec) -> WeightEstimate:
    """Estimate a catalog model's weight bytes: parameters from data/weights.json, bits from its config."""
    spec = load_model(model)
    table = json.loads(WEIGHTS_FILE.read_text())["models"]
    if spec.name not in table:
        raise ParameterError(f"no weight estimate for {spec.name!r} (known: {', '.join(table)}); "
                             "pass weights= (bytes) or --weight-gb")
    entry = table[spec.name]
    _, raw = read_config(spec.name)
    quant = raw.get("quantization_config") or spec.config.get("quantization_config")
    c = spec.config
    params = float(entry["params"])
    if c.get("n_routed_experts") and c.get("moe_intermediate_size"):
        ep = min(_expert_params(c), params)
        eb, ob = param_bits(quant, spec.torch_dtype, True), param_bits(quant, spec.torch_dtype, False)
        nbytes = int(ep * eb / 8 + (params - ep) * ob / 8)
        note = (f"{ep / 1e9:.1f}B expert parameters (from config) at {eb:g} bits, the other "
                f"{(params - ep) / 1e9:.1f}B at {ob:g} bits; total from: {entry['source']}")
    else:
        b = param_bits(quant, spec.torch_dtype, False)
        nbytes = int(params * b / 8)
        note = f"{params / 1e9:.2f}B parameters at {b:g} bits ({spec.torch_dtype}); from: {entry['source']}"
    return WeightEstimate(spec.name, params, nbytes, note)


def replicated_attention_bytes(spec: ModelSpec) -> int | None:
    """Bytes of the attention projections, which data-parallel attention keeps whole on every rank (the family
    counts the parameters; bits per parameter from the config's quantization_config or dtype), or None when the
    family does not count them."""
    params = get_family(spec.family).attention_params(spec)
    if params is None:
        return None
    quant = spec.config.get("quantization_config")
    return cdiv(int(params * param_bits(quant if isinstance(quant, dict) else None, spec.torch_dtype, False)), 8)


# --- one session -------------------------------------------------------------------------------
def replay_window(model) -> int:
    """Tokens a host-cache miss replays: the model family's bounded replay (V4.1: its `sliding_window`), else 0."""
    if isinstance(model, Allocation):
        return model.layout.family.replay_window(model.layout.model)
    spec = load_model(model)
    return get_family(spec.family).replay_window(spec)


@dataclass(frozen=True)
class SessionCost:
    """Bytes one session holds, step by step."""

    tokens: int  # context length
    bytes_per_token: Fraction  # allocated bytes per token (engine padding included)
    growing_bytes: int  # bytes/token x tokens (whole pages when paged)
    prefix_hit_tokens: int  # tokens served from a shared prefix cache
    prefix_hit_bytes: int  # their bytes: shared, so not charged to this session
    replay_tokens: int  # tokens a miss replays (V4.1: the sliding window)
    replay_probability: float  # chance the host-resident window state is gone (TTL expiry) at a turn
    replay_bytes: float  # expected replayed state: probability x entries of the replay_tokens tokens
    bounded_bytes: int  # windows, compressor tails, fixed-size states, per-tensor scales at this length

    @property
    def total(self) -> float:
        return self.growing_bytes - self.prefix_hit_bytes + self.replay_bytes + self.bounded_bytes

    @property
    def replay_prefill_tokens(self) -> float:
        """Expected extra prefill per turn: the replay, budgeted as work rather than a free hit."""
        return self.replay_probability * self.replay_tokens


def session_cost(model, tokens: int, prefix_hit_rate: float = 0.0, replay_probability: float = 1.0,
                 scheme: str = "storage", kv_format=None) -> SessionCost:
    """Per-session bytes after prefix hits (a fraction of the context, whole pages when paged) and replay."""
    a = _alloc(model, scheme, kv_format)
    tokens = check_tokens(tokens)
    rate = _frac(prefix_hit_rate, "prefix_hit_rate")
    p = _frac(replay_probability, "replay_probability")
    s = a.session(tokens)
    hit = int(tokens * rate)
    if a.paged:  # prefix caching matches whole blocks (a DCP group's logical block spans its ranks' pages)
        hit -= hit % (a.engine.block_tokens * a.layout.shard.dcp)
    hit_bytes = a.session(hit).growing
    w = min(replay_window(a), tokens)
    replay = p * a.session(w).growing if w else 0.0  # the window itself is bounded state, counted once
    return SessionCost(tokens, a.bytes_per_token, s.growing, hit, hit_bytes, w, p if w else 0.0, replay, s.bounded)


# --- a GPU, a deployment ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Capacity:
    """Sessions that fit on the GPUs of one deployment (one GPU by default)."""

    model: str  # model name
    gpu: Gpu  # the accelerator
    utilization: float  # the engine's memory fraction as applied (vLLM: gpu_memory_utilization)
    weight_bytes: int  # whole-model weights
    weight_shards: int  # GPUs the weights are spread over
    activation_bytes: int  # reserve for activations and non-torch memory
    session: SessionCost  # one session's cost on the GPU that holds the most of it
    parallel: Parallelism = ONE_GPU  # how the deployment spreads the model
    budget: KvBudget | None = None  # the KV pool per GPU and the engine rule that gave it
    engine: str = "exact"  # the allocation rule: exact storage, or an engine's paging
    whole_session: SessionCost | None = field(default=None, repr=False)  # the same session over the whole model
    layout_note: str = ""  # how the per-GPU bytes were split (TP / DCP / PP / DP attention)

    weight_share_bytes: int | None = None  # this GPU's weights when not an even share (DP attention)

    @property
    def weight_share(self) -> int:
        if self.weight_share_bytes is not None:
            return self.weight_share_bytes
        return cdiv(self.weight_bytes, self.weight_shards)

    @property
    def usable_kv_bytes(self) -> int:
        if self.budget is not None:
            return self.budget.kv_bytes
        return int(self.gpu.hbm_bytes * self.utilization) - self.weight_share - self.activation_bytes

    @property
    def gpus(self) -> int:
        return self.parallel.gpus

    def _count(self, per_session: float) -> int:
        """Sessions of `per_session` bytes the deployment holds (its GPUs' own sessions under DP attention)."""
        n = int(self.usable_kv_bytes // per_session) if per_session > 0 else 0
        return n if self.parallel.sessions_spread else n * self.gpus

    def _per_gpu(self, deployment: int) -> int | float:
        q = Fraction(deployment, self.gpus)
        return int(q) if q.denominator == 1 else float(q)

    @property
    def sessions_per_deployment(self) -> int:
        """Sessions the whole deployment holds at once."""
        return self._count(self.session.total)

    @property
    def sessions_per_gpu(self) -> int | float:
        """Sessions per GPU: the deployment's count over its GPUs (each GPU's own sessions under DP attention or
        on one GPU; a share of every session under TP / DCP / PP); whole numbers stay integers."""
        return self._per_gpu(self.sessions_per_deployment)

    @property
    def sessions_without_replay(self) -> int | float:
        return self._per_gpu(self._count(self.session.total - self.session.replay_bytes))

    def as_dict(self) -> dict:
        s = self.session
        out = dict(model=self.model, gpu=self.gpu.name, context_tokens=s.tokens,
                   bytes_per_token=float(s.bytes_per_token), growing_bytes=s.growing_bytes,
                   prefix_hit_tokens=s.prefix_hit_tokens, prefix_hit_bytes=s.prefix_hit_bytes,
                   replay_tokens=s.replay_tokens, replay_probability=s.replay_probability,
                   replay_bytes=s.replay_bytes, bounded_bytes=s.bounded_bytes, session_bytes=s.total,
                   hbm_bytes=self.gpu.hbm_bytes, utilization=self.utilization, weight_bytes=self.weight_bytes,
                   weight_shards=self.weight_shards, weight_share_bytes=self.weight_share,
                   activation_bytes=self.activation_bytes, usable_kv_bytes=self.usable_kv_bytes,
                   sessions_per_gpu=self.sessions_per_gpu, sessions_without_replay=self.sessions_without_replay,
                   deployment=self.parallel.label(), gpus=self.gpus, tp=self.parallel.tp, dcp=self.parallel.dcp,
                   pp=self.parallel.pp, dp_attention=self.parallel.dp_attention,
                   sessions_per_deployment=self.sessions_per_deployment, engine=self.engine,
                   sessions_counted_as="held while decoding")
        if self.whole_session is not None:
            out["whole_model_bytes_per_token"] = float(self.whole_session.bytes_per_token)
            out["whole_model_session_bytes"] = self.whole_session.total
        if self.budget is not None:
            out["memory_rule"] = dict(engine=self.budget.engine, rule=self.budget.rule, source=self.budget.source)
        if self.layout_note:
            out["per_gpu_layout"] = self.layout_note
        return out


def auto_shards(weights: int, gpu: Gpu, utilization: float) -> int:
    """Smallest of 1, 2, 4, 8 GPUs over which the weight share takes at most half the usable memory."""
    for n in SHARD_CHOICES:
        if weights / n <= 0.5 * gpu.hbm_bytes * utilization:
            return n
    return SHARD_CHOICES[-1]


def plan(model, gpu: str | Gpu, context_tokens: int, prefix_hit_rate: float = 0.0, *, kv_format=None,
         scheme: str | None = None, utilization: float = DEFAULT_UTILIZATION, weight_shards: int | None = None,
         weights: int | None = None, activation_gb: float = DEFAULT_ACTIVATION_GB,
         replay_probability: float = 1.0, parallel: Parallelism | None = None, engine: str | None = None,
         memory_fraction: float | None = None, k_format=None, v_format=None,
         page_size: int | None = None, kv_cache_memory_bytes: int | None = None) -> Capacity:
    """Sessions of `context_tokens` tokens per GPU and per deployment.

    parallel=None: the weights spread over `weight_shards` GPUs (None: the smallest power of two <= 8 for which
    they take at most half of the usable memory), each GPU keeping whole sessions of its own (data-parallel
    attention); a Parallelism (TP / DCP / PP / DP attention) spreads each session as the engines do and the
    weights over its GPUs. engine=None counts exact storage under vLLM's memory rule (`utilization`); 'vllm',
    'sglang' or 'trtllm' allocate and budget by that engine's rules (`memory_fraction` overrides its fraction).
    weights=None estimates the weights. kv_cache_memory_bytes: the KV pool per GPU given outright (vLLM's
    --kv-cache-memory-bytes), instead of the engine's memory rule."""
    if engine is not None and engine not in ENGINES:
        raise ParameterError(f"engine must be one of {', '.join(ENGINES)} (or None for exact storage), got {engine!r}")
    g = get_gpu(gpu)
    u = need_number("utilization", utilization, 0.0, 1.0, lo_open=True)
    tokens = need_int("context_tokens", context_tokens, 1)
    act = _frac(activation_gb, "activation_gb", 0.0, 1e6)
    spec = model.layout.model if isinstance(model, Allocation) else load_model(model)
    if weights is None:  # a KV pool given outright needs no weights to be subtracted (0 unless given)
        w = 0 if kv_cache_memory_bytes is not None else weight_bytes(spec).nbytes
    else:
        w = need_int("weights", weights, 0)
    if parallel is None:
        n = auto_shards(w, g, u) if weight_shards is None else need_int("weight_shards", weight_shards, 1)
        par = Parallelism(tp=n, dp_attention=True) if n > 1 else ONE_GPU
    else:
        par = need_type("parallel", parallel, Parallelism, "a kvlab.serving.parallel.Parallelism")
        n = par.gpus if weight_shards is None else need_int("weight_shards", weight_shards, 1)
    if isinstance(model, Allocation):
        if parallel is not None and not (par.attention_tp == 1 and par.pp == 1):
            raise ParameterError("plan(): give a model name or spec (not an Allocation) with a parallel deployment")
        stage, whole = model, model
        note = ""
    else:
        share: PerGpu = per_gpu(spec, par, scheme, kv_format, engine, k_format=k_format, v_format=v_format,
                                page_size=page_size)
        stage, whole = share.busiest, share.whole
        note = "" if par.gpus == 1 else (
            f"{par.label()}: per GPU {_num(share.per_gpu_bytes_per_token)} B/token of "
            f"{_num(whole.bytes_per_token)} for the whole model")
    cost = session_cost(stage, tokens, prefix_hit_rate, replay_probability)
    whole_cost = cost if whole is stage else session_cost(whole, tokens, prefix_hit_rate, replay_probability)
    act_bytes = int(act * 1e9)
    share_bytes = cdiv(w, n)
    if parallel is not None and par.dp_attention and n > 1:  # DP attention: every rank keeps the attention whole
        att = replicated_attention_bytes(spec)
        if att is not None and att < w:
            share_bytes = att + cdiv(w - att, n)
            note = (note + "; " if note else "") + (f"DP attention: {att / 1e9:.1f} GB of attention weights on every "
                                                   f"rank + 1/{n} of the rest")
    rule = engine or "vllm"
    fraction = memory_fraction if memory_fraction is not None else (u if rule == "vllm" else None)
    if kv_cache_memory_bytes is not None:
        budget = given_budget(rule, kv_cache_memory_bytes)
    else:
        budget = kv_budget(rule, g, share_bytes, act_bytes, fraction=fraction, tp=par.tp, pp=par.pp,
                           dp_attention=par.dp_attention)
    cap = Capacity(spec.name, g, budget.fraction, w, n, act_bytes, cost, par, budget, stage.engine.name, whole_cost,
                   note, share_bytes)
    if cap.session.total <= 0:  # every token a shared-prefix hit and nothing bounded: no count follows
        raise ParameterError(f"{cap.model}: a {tokens:,}-token session at prefix_hit_rate {prefix_hit_rate!r} holds "
                             "0 bytes of its own (its whole context is a shared-prefix hit), so KV memory puts no "
                             "bound on sessions; use a prefix_hit_rate below 1")
    if cap.usable_kv_bytes <= 0:
        raise ParameterError(f"{cap.model} on {g.name}: no memory left for KV ({cap.weight_share / 1e9:,.1f} GB of "
                             f"weights per GPU over {n} GPU(s) + {act:g} GB activations > {g.memory_label()} x "
                             f"{budget.fraction:g} ({budget.engine}'s rule)); spread the weights over more GPUs "
                             "(weight_shards, --tp) or plan with more memory (--gpu-memory)")
    return cap


def need_weights_fit(model, gpu: str | Gpu, shards: int = 1, weights: int | None = None) -> None:
    """Refuse a deployment whose weight share alone exceeds a GPU's memory (a ParameterError naming both figures
    and where the memory figure comes from). No estimate of the weights (and none given): nothing to check."""
    g = get_gpu(gpu)
    shards = need_int("shards", shards, 1)
    if weights is None:
        try:
            weights = weight_bytes(model).nbytes
        except ParameterError:
            return
    share = cdiv(need_int("weights", weights, 0), shards)
    if share > g.hbm_bytes:
        raise ParameterError(f"{load_model(model).name}: its weights take {share / 1e9:,.1f} GB per GPU over {shards} "
                             f"GPU(s), more than {g.name}'s {g.memory_label()}: spread them over more GPUs (--tp) or "
                             "plan with more memory (--gpu-memory)")


def _num(x):
    x = Fraction(x)
    return f"{x.numerator:,}" if x.denominator == 1 else f"{float(x):,.2f}"


def request_rate(decode_tokens_per_s: float, tokens_per_request: float, sessions: int,
                 tokens_per_s_per_session: float) -> dict:
    """Requests/s = decode throughput / tokens per request, capped by what `sessions` concurrent streams at
    `tokens_per_s_per_session` each can decode."""
    for k, v in (("decode_tokens_per_s", decode_tokens_per_s), ("tokens_per_request", tokens_per_request),
                 ("tokens_per_s_per_session", tokens_per_s_per_session)):
        need_number(k, v, 0.0, lo_open=True)
    sessions = need_int("sessions", sessions, 0)
    uncapped = decode_tokens_per_s / tokens_per_request
    cap = sessions * tokens_per_s_per_session / tokens_per_request
    return dict(uncapped=uncapped, session_cap=cap, requests_per_s=min(uncapped, cap), capped=cap < uncapped)
