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

from dataclasses import dataclass

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


def decode_flops(model: str | ModelSpec, tokens: int, dense: bool = False, cap: str = "blocks") -> DecodeFlops:
    """FLOPs of decoding one token after `tokens` tokens of context.

    dense=True: the same model attending to every token's uncompressed entry on every layer (no window,
    compression or indexer): the full-cache baseline."""
    spec = load_model(model)
    if cap not in CAPS:
        raise SelectionError(f"unknown cap scenario {cap!r}; choose one of {', '.join(CAPS)}")
    tokens = need_int("tokens", tokens, 1, error=SelectionError)
    plan = model_plan(spec)
    H, D, h = spec.num_heads, spec.head_dim, spec.hidden_size
    hi, di, W = spec.index_n_heads, spec.index_head_dim, spec.sliding_window
    per_key = 4 * H * D
    score = 2 * hi * di + 2 * hi  # one entry scored by the indexer
    wts = weight_flops(spec)
    if dense:
        return DecodeFlops(tokens, len(plan) * per_key * tokens, 0.0, 0.0, wts)
    topk = spec.index_topk
    cap_n = (spec.candidate_blocks or 0) * (spec.candidate_block_size or 0) or None
    cand_src = _c(spec, "candidate_source_layer_id", None)
    attn = idx = comp = 0.0
    for p in plan:
        keys = min(W, tokens)
        if p.ratio:
            n = tokens // p.ratio  # complete compressed entries
            if p.indexed or p.mode == "reuse":
                keys += min(topk, n)
            else:  # HCA: every entry
                keys += n
            if p.indexed:
                capped = cap_n is not None and cap != "none" and (cap != "decoder" or p.index >= cand_src)
                idx += score * (min(n, cap_n) if capped else n)
            if p.stores:
                width = 2 * D if p.indexed else D  # CSA-style overlap doubles the projections
                comp += 2 * 2 * h * width + 3 * 2 * width  # kv + gate projections, pooling amortised
                if p.indexed:
                    comp += 2 * 2 * h * 2 * di + 3 * 2 * 2 * di
        attn += per_key * keys
    if cap_n is not None and cap != "none" and cand_src is not None:  # choosing the pool, once per token
        src = plan[cand_src]
        n = tokens // src.ratio
        idx += score * (cdiv(n, spec.candidate_block_size) if cap == "blocks" else n)
    return DecodeFlops(tokens, attn, idx, comp, wts)


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
