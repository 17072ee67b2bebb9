"""Capacity planning: what one session costs and how many fit on a GPU.

Session cost (the 1M-token article's checklist, made exact):
  bytes/token x tokens - bytes of prefix-cache hits + expected replayed state after a miss + bounded state.
Bytes come from `kvlab.engines.allocate` only. V4.1-Flash keeps its 128-token sliding-window state in host
RAM with a TTL; a miss triggers a bounded replay of the last `sliding_window` tokens (the window is read from
the model spec). Sessions per GPU = usable KV memory / per-session bytes, where usable = GPU memory x
utilisation - this GPU's share of the weights - an activations reserve. Whether KV is split across GPUs by
tensor parallelism or sessions are spread by data-parallel attention, the per-GPU figure is the same ratio.
vLLM's own sizing (serving.md: get_num_blocks, get_max_concurrency_for_kv_cache_config) is reproduced by
`vllm_plan` and set beside the exact figure.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from fractions import Fraction

from ..checks import need_int, need_number
from ..engines import Allocation, allocate
from ..errors import ParameterError
from .hardware import Gpu, get_gpu
from ..layout import check_tokens
from ..models import DATA_DIR, ModelSpec, load_model, read_config

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


def _bits(quant: dict | None, dtype: str, expert: bool) -> float:
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
        eb, ob = _bits(quant, spec.torch_dtype, True), _bits(quant, spec.torch_dtype, False)
        nbytes = int(ep * eb / 8 + (params - ep) * ob / 8)
        note = (f"{ep / 1e9:.1f}B expert parameters (from config) at {eb:g} bits, the other "
                f"{(params - ep) / 1e9:.1f}B at {ob:g} bits; total from: {entry['source']}")
    else:
        b = _bits(quant, spec.torch_dtype, False)
        nbytes = int(params * b / 8)
        note = f"{params / 1e9:.2f}B parameters at {b:g} bits ({spec.torch_dtype}); from: {entry['source']}"
    return WeightEstimate(spec.name, params, nbytes, note)


# --- one session -------------------------------------------------------------------------------
def replay_window(model) -> int:
    """Tokens a miss replays: V4.1's bounded SWA replay of its `sliding_window`; 0 for other families."""
    spec = model.layout.model if isinstance(model, Allocation) else load_model(model)
    return spec.sliding_window or 0 if spec.family == "dsv41" else 0


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
    bounded_bytes: int  # windows, compressor tails, per-tensor scales at this length

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
    if a.paged:  # prefix caching matches whole blocks
        hit -= hit % a.engine.block_tokens
    hit_bytes = a.session(hit).growing
    w = min(replay_window(a), tokens)
    replay = p * a.session(w).growing if w else 0.0  # the window itself is bounded state, counted once
    return SessionCost(tokens, a.bytes_per_token, s.growing, hit, hit_bytes, w, p if w else 0.0, replay, s.bounded)


# --- a GPU -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Capacity:
    """Sessions that fit on one GPU."""

    model: str  # model name
    gpu: Gpu  # the accelerator
    utilization: float  # fraction of device memory the engine may use
    weight_bytes: int  # whole-model weights
    weight_shards: int  # GPUs the weights are spread over
    activation_bytes: int  # reserve for activations and non-torch memory
    session: SessionCost  # one session's cost

    @property
    def weight_share(self) -> int:
        return -(-self.weight_bytes // self.weight_shards)

    @property
    def usable_kv_bytes(self) -> int:
        return int(self.gpu.hbm_bytes * self.utilization) - self.weight_share - self.activation_bytes

    @property
    def sessions_per_gpu(self) -> int:
        return int(self.usable_kv_bytes // self.session.total) if self.session.total > 0 else 0

    @property
    def sessions_without_replay(self) -> int:
        t = self.session.total - self.session.replay_bytes
        return int(self.usable_kv_bytes // t) if t > 0 else 0

    def as_dict(self) -> dict:
        s = self.session
        return dict(model=self.model, gpu=self.gpu.name, context_tokens=s.tokens,
                    bytes_per_token=float(s.bytes_per_token), growing_bytes=s.growing_bytes,
                    prefix_hit_tokens=s.prefix_hit_tokens, prefix_hit_bytes=s.prefix_hit_bytes,
                    replay_tokens=s.replay_tokens, replay_probability=s.replay_probability,
                    replay_bytes=s.replay_bytes, bounded_bytes=s.bounded_bytes, session_bytes=s.total,
                    hbm_bytes=self.gpu.hbm_bytes, utilization=self.utilization, weight_bytes=self.weight_bytes,
                    weight_shards=self.weight_shards, weight_share_bytes=self.weight_share,
                    activation_bytes=self.activation_bytes, usable_kv_bytes=self.usable_kv_bytes,
                    sessions_per_gpu=self.sessions_per_gpu, sessions_without_replay=self.sessions_without_replay)


def auto_shards(weights: int, gpu: Gpu, utilization: float) -> int:
    """Smallest of 1, 2, 4, 8 GPUs over which the weight share takes at most half the usable memory."""
    for n in SHARD_CHOICES:
        if weights / n <= 0.5 * gpu.hbm_bytes * utilization:
            return n
    return SHARD_CHOICES[-1]


def plan(model, gpu: str | Gpu, context_tokens: int, prefix_hit_rate: float = 0.0, *, kv_format=None,
         scheme: str = "storage", utilization: float = DEFAULT_UTILIZATION, weight_shards: int | None = None,
         weights: int | None = None, activation_gb: float = DEFAULT_ACTIVATION_GB,
         replay_probability: float = 1.0) -> Capacity:
    """Sessions of `context_tokens` tokens per GPU. weight_shards=None picks the smallest power of two <= 8
    for which the weights take at most half of the usable memory; weights=None estimates the weights."""
    a = _alloc(model, scheme, kv_format)
    g = get_gpu(gpu)
    u = need_number("utilization", utilization, 0.0, 1.0, lo_open=True)
    tokens = need_int("context_tokens", context_tokens, 1)
    w = weight_bytes(a.layout.model).nbytes if weights is None else need_int("weights", weights, 0)
    n = auto_shards(w, g, u) if weight_shards is None else need_int("weight_shards", weight_shards, 1)
    act = _frac(activation_gb, "activation_gb", 0.0, 1e6)
    cap = Capacity(a.layout.model.name, g, u, w, n, int(act * 1e9),
                   session_cost(a, tokens, prefix_hit_rate, replay_probability))
    if cap.session.total <= 0:  # every token a shared-prefix hit and nothing bounded: no count follows
        raise ParameterError(f"{cap.model}: a {tokens:,}-token session at prefix_hit_rate {prefix_hit_rate!r} holds "
                             "0 bytes of its own (its whole context is a shared-prefix hit), so KV memory puts no "
                             "bound on sessions; use a prefix_hit_rate below 1")
    if cap.usable_kv_bytes <= 0:
        raise ParameterError(f"{cap.model} on {g.name}: no memory left for KV ({cap.weight_share / 1e9:.1f} GB of "
                             f"weights per GPU over {n} GPU(s) + {act:g} GB activations > "
                             f"{g.hbm_gb:g} GB x {u:g}); raise weight_shards")
    return cap


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


# --- vLLM's sizing ------------------------------------------------------------------------------
@dataclass(frozen=True)
class VllmPlan:
    """vLLM's block count and maximum concurrency for one max_model_len, beside the exact count."""

    model: str  # model name
    available_bytes: int  # KV memory handed to the engine
    block_tokens: int  # tokens per block
    page_bytes_per_layer: int | None  # dense models: 2 x block x kv_heads x head_size x dtype
    block_bytes: int  # one block over all layers
    num_blocks: int  # available // page // layers (dense) or available // block bytes
    max_model_len: int  # request length the concurrency is computed for
    blocks_per_request: int  # cdiv(max_model_len, block_size) (dense)
    max_concurrency: float  # num_blocks / blocks_per_request (vLLM's figure)
    exact_concurrency: float  # available / exact session bytes at max_model_len
    formula: str  # which rule was applied


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def vllm_plan(model, available_bytes: int, max_model_len: int, kv_format=None) -> VllmPlan:
    """Reproduce vLLM's get_num_blocks / get_max_concurrency_for_kv_cache_config (serving.md)."""
    available_bytes = need_int("available_bytes", available_bytes, 0)
    L = max_model_len = need_int("max_model_len", max_model_len, 1)
    a = allocate(model, "vllm", kv_format)
    exact = allocate(a.layout.model, "storage", kv_format).session(L).total
    e = a.engine
    spec = a.layout.model
    block_bytes = sum(e.page_bytes(c) for _, c in a.layout.components(True))
    if spec.family == "dense" and not any(spec.layer_windows):
        page = sum(e.page_bytes(c) for c in a.layout.layers[0].components)  # K and V of one layer
        blocks = available_bytes // page // spec.num_layers
        per_req = cdiv(L, e.block_tokens)
        conc = blocks / per_req
        formula = "dense: num_blocks = available // page_size // num_layers; concurrency = num_blocks / cdiv(len, block)"
    else:
        page = None
        blocks = available_bytes // block_bytes
        per_req = cdiv(L, e.block_tokens)
        conc = available_bytes / a.session(L).total
        formula = "paged allocation: available / bytes of one max_model_len request (windows' pages included)"
    return VllmPlan(spec.name, available_bytes, e.block_tokens, page, block_bytes, blocks, L, per_req, conc,
                    available_bytes / exact, formula)
