"""Compressed-attention prototype: dense reference, MLA latent cache, sliding window with replay,
CSA / HCA token compression, a capped lightning-indexer top-k, Full / Reindex / Reuse layer sharing,
a scaled V4 / V4.1 model stack, accuracy metrics, a needle sweep and a decode FLOPs model. Caches are
kvlab.cache's KV stores (packed bytes in a kvlab format)."""
from ..errors import CacheFormatError
from .checks import AttentionShapeError, SelectionError
from .compress import Compressor, CompressorState, gated_pool, pool_keys
from .dense import attention_probs, causal_mask, dense_attention
from .indexer import candidate_pool, index_scores, select_topk, sparse_attention
from ..quant.metrics import cosine, rel_error
from .metrics import attention_error, kl, logits_kl, mass_covered, recall_at_k
from .mla import MLAWeights, mla_absorbed, mla_decode, mla_expanded
from .sharing import LayerPlan, model_plan, scaled_plan
from .stack import Stack, StackConfig
from .window import ReplayStats, WindowState, window_attention

__all__ = ["AttentionShapeError", "CacheFormatError", "SelectionError", "Compressor", "CompressorState", "gated_pool",
           "pool_keys", "attention_probs", "causal_mask", "dense_attention", "candidate_pool", "index_scores",
           "select_topk", "sparse_attention", "attention_error", "cosine", "kl", "logits_kl", "mass_covered",
           "recall_at_k", "rel_error", "MLAWeights", "mla_absorbed", "mla_decode", "mla_expanded", "LayerPlan", "model_plan", "scaled_plan",
           "Stack", "StackConfig", "ReplayStats", "WindowState", "window_attention"]
