"""FLOPs of one decode token for DeepSeek V4 / V4.1 layouts (and a dense baseline), from the real configs.

Counting rules (2 FLOPs per multiply-add; softmax, norms, top-k sorting and RoPE are left out):
  attention   4 * heads * head_dim per key attended (scores + weighted sum), keys = window + selected entries
  indexer     2 * H_I * D_I per scored entry (q . k over index heads) + 2 * H_I (head weights); its query
              projection is counted under weights
  compression the new token's compressor projections (kv + gate; CSA 2d wide) for main and index entries,
              plus the gated pooling amortised per token (3 FLOPs per slot channel)
  weights     every other matmul a token passes through: q (low rank), K=V, grouped output projection, the
              active experts (shared + routed top-k, SwiGLU: 3 matrices), indexer query and head weights, LM head.
              Not counted: hyper-connections, engram tables, MTP layers, embeddings.
The V4.1 candidate pool (candidate_topk_blocks x candidate_block_size) is applied per `cap` scenario, because
how the pool is scored and which layers it bounds is not in the public config:
  "blocks"    every indexer scores at most the pool; the pool is chosen once per token on the candidate
              source layer by scoring one pooled key per block (entries / block_size keys)
  "positions" as "blocks", but the pool is chosen by scoring every entry of the source layer
  "decoder"   only layers at or after the candidate source layer are capped (positions scoring); the
              encoder half's indexers score all their entries
  "none"      no cap: every indexer scores all its entries
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

from ..checks import cdiv, need_choice, need_int, need_list
from ..models import ModelSpec, load_model
from .checks import SelectionError
from .sharing import model_plan

CAPS = ("blocks", "positions", "decoder", "none")


@dataclass(frozen=True)
class DecodeFlops:
    """FLOPs of one decode token at a context length, by part."""

    tokens: int  # context length
    attention: float  # core attention over window + selected / all entries
    indexer: float  # index scoring (incl. candidate-pool choice)
    compression: float  # compressor projections and pooling
    weights: float  # all other matmuls (projections, experts, LM head)

    @property
    def context(self) -> float:
        """The part that depends on what the cache holds: attention + indexer + compression."""
        return self.attention + self.indexer + self.compression

    @property
    def total(self) -> float:
        return self.context + self.weights


def _c(spec: ModelSpec, key: str, default=0):
    v = spec.config.get(key, default)
    return default if v is None else v


def weight_flops(spec: ModelSpec) -> float:
    """Matmul FLOPs of one token outside attention, indexer scoring and compression (see module doc)."""
    h, H, D = spec.hidden_size, spec.num_heads, spec.head_dim
    if h is None or H is None:
        raise SelectionError(f"{spec.name}: the FLOPs model needs hidden_size and num_attention_heads")
    q_lora = _c(spec, "q_lora_rank")
    q = (h * q_lora + q_lora * H * D) if q_lora else h * H * D
    o_lora, groups = _c(spec, "o_lora_rank"), _c(spec, "o_groups", 1)
    o = (H * D * o_lora + groups * o_lora * h) if o_lora else H * D * h
    experts = _c(spec, "num_experts_per_tok") + _c(spec, "n_shared_experts")
    ffn = 3 * h * _c(spec, "moe_intermediate_size") * experts
    per_layer = q + h * D + o + ffn
    idx_q = (q_lora or h) * spec.index_n_heads * spec.index_head_dim + h * spec.index_n_heads
    indexed = sum(1 for p in model_plan(spec) if p.indexed)
    return 2.0 * (spec.num_layers * per_layer + indexed * idx_q + h * _c(spec, "vocab_size"))


class DecodeCounter:
    """decode_flops for one model, baseline and cap scenario with its layer plan and weight FLOPs worked out once;
    `context_flops` prices many context lengths in one call (the serving roofline prices thousands a step)."""

    def __init__(self, model: str | ModelSpec, dense: bool = False, cap: str = "blocks"):
        self.spec = spec = load_model(model)
        if cap not in CAPS:
            raise SelectionError(f"unknown cap scenario {cap!r}; choose one of {', '.join(CAPS)}")
        self.dense, self.cap = dense, cap
        self.plan = model_plan(spec)  # one LayerPlan per layer
        self.weights = weight_flops(spec)  # FLOPs a token spends outside attention, indexer and compression
        self.per_key = 4 * spec.num_heads * spec.head_dim  # attention FLOPs per key attended
        self.score = 2 * spec.index_n_heads * spec.index_head_dim + 2 * spec.index_n_heads  # one entry scored
        self.cap_n = (spec.candidate_blocks or 0) * (spec.candidate_block_size or 0) or None  # pool size
        self.cand_src = _c(spec, "candidate_source_layer_id", None)
        h, D, di = spec.hidden_size, spec.head_dim, spec.index_head_dim
        # layers that count alike, with how many there are: (ratio, reads top-k entries, runs a capped indexer,
        # runs an uncapped one) -> layers
        self.kinds = Counter()
        for p in self.plan:
            capped = (p.indexed and self.cap_n is not None and cap != "none"
                      and (cap != "decoder" or p.index >= self.cand_src))
            self.kinds[p.ratio, p.indexed or p.mode == "reuse", capped, p.indexed and not capped] += 1
        self.compression = 0.0  # per token, whatever the context: the storing layers' compressor projections
        for p in ([] if dense else self.plan):
            if p.ratio and p.stores:
                width = 2 * D if p.indexed else D  # CSA-style overlap doubles the projections
                self.compression += 2 * 2 * h * width + 3 * 2 * width  # kv + gate projections, pooling amortised
                if p.indexed:
                    self.compression += 2 * 2 * h * 2 * di + 3 * 2 * 2 * di

    def parts(self, tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(attention, indexer) FLOPs of one decode token at each context length in `tokens` ([N] ints >= 1)."""
        t = np.asarray(tokens, dtype=np.int64)  # [N]
        if self.dense:
            return (len(self.plan) * self.per_key * t).astype(float), np.zeros(t.shape)
        s = self.spec
        topk, W, cap_n, cap = s.index_topk, s.sliding_window, self.cap_n, self.cap
        keys = np.zeros(t.shape, np.int64)  # [N] keys attended, summed over layers
        idx = np.zeros(t.shape, np.int64)  # [N] entries scored, summed over layers
        for (ratio, selects, capped, uncapped), count in self.kinds.items():
            keys += count * np.minimum(W, t)
            if ratio:
                n = t // ratio  # complete compressed entries
                keys += count * (np.minimum(topk, n) if selects else n)  # HCA: every entry
                if capped:
                    idx += count * np.minimum(n, cap_n)
                elif uncapped:
                    idx += count * n
        if cap_n is not None and cap != "none" and self.cand_src is not None:  # choosing the pool, once per token
            n = t // self.plan[self.cand_src].ratio
            idx += cdiv(n, s.candidate_block_size) if cap == "blocks" else n
        return (self.per_key * keys).astype(float), (self.score * idx).astype(float)

    def context_flops(self, tokens) -> np.ndarray:
        """[N] the part of each decode token's FLOPs that depends on the cache (DecodeFlops.context)."""
        a, i = self.parts(tokens)
        return a + i + self.compression

    def at(self, tokens: int) -> DecodeFlops:
        tokens = need_int("tokens", tokens, 1, error=SelectionError)
        a, i = self.parts(np.array([tokens]))
        return DecodeFlops(tokens, float(a[0]), float(i[0]), self.compression, self.weights)


def decode_flops(model: str | ModelSpec, tokens: int, dense: bool = False, cap: str = "blocks") -> DecodeFlops:
    """FLOPs of decoding one token after `tokens` tokens of context.

    dense=True: the same model attending to every token's uncompressed entry on every layer (no window,
    compression or indexer): the full-cache baseline."""
    if cap not in CAPS:
        raise SelectionError(f"unknown cap scenario {cap!r}; choose one of {', '.join(CAPS)}")
    need_int("tokens", tokens, 1, error=SelectionError)
    return DecodeCounter(model, dense, cap).at(tokens)


def growth(model: str | ModelSpec, lo: int = 4096, hi: int = 1 << 20, part: str = "total", **kw) -> float:
    """decode_flops(hi) / decode_flops(lo) for `part` ("total" or "context")."""
    need_choice("part", part, ("total", "context"), error=SelectionError)
    lo, hi = need_int("lo", lo, 1, error=SelectionError), need_int("hi", hi, 1, error=SelectionError)
    a, b = decode_flops(model, lo, **kw), decode_flops(model, hi, **kw)
    return getattr(b, part) / getattr(a, part)


# The layouts the notebook and claim compare: label -> (model, dense, cap)
LAYOUTS = {
    "dense (V4.1 dims, full cache)": ("deepseek-v4.1-flash", True, "none"),
    "V4-Flash": ("deepseek-v4-flash", False, "none"),
    "V4.1-Flash, no cap": ("deepseek-v4.1-flash", False, "none"),
    "V4.1-Flash, cap (pool scored per entry)": ("deepseek-v4.1-flash", False, "positions"),
    "V4.1-Flash, cap (pool scored per block)": ("deepseek-v4.1-flash", False, "blocks"),
}


def flops_table(lengths, layouts: dict | None = None) -> list[dict]:
    """One row per (layout, context length): FLOPs of one decode token by part."""
    rows = []
    lengths = need_list("lengths", lengths, "a list of context lengths")
    for label, (model, dense, cap) in (layouts or LAYOUTS).items():
        for t in lengths:
            f = decode_flops(model, int(t), dense=dense, cap=cap)
            rows.append(dict(layout=label, tokens=int(t), attention=f.attention, indexer=f.indexer,
                             compression=f.compression, weights=f.weights, total=f.total))
    return rows
