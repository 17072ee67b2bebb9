"""Multi-head latent attention (DeepSeek-V2/V3): one latent + a decoupled RoPE key cached per token.

The cache holds c [B, T, r] (kv_lora_rank r) and k_pe [B, T, dr], shared by every head.
Expanded path (prefill): per-head K = [c W_uk^T | k_pe], V = c W_uv^T, then dense attention.
Absorbed path (decode): fold W_uk into the query and W_uv after the weighted sum, so attention
runs in latent space and never materialises per-head K/V (DeepSeek-V2 paper, section 2.1.3).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..cache.store import KVStore
from ..checks import need_int
from .checks import AttentionShapeError, need_dims, same
from .dense import causal_mask, dense_attention


@dataclass
class MLAWeights:
    """The up-projection of the latent, viewed per head."""

    wkv_b: torch.Tensor  # [H, d_nope + d_v, r]: rows :d_nope give K (W_uk), the rest V (W_uv)
    d_nope: int  # per-head non-RoPE key dims
    d_rope: int  # decoupled RoPE key dims (shared by all heads)

    def __post_init__(self):
        need_dims("wkv_b", self.wkv_b, 3, "[H, d_nope + d_v, r]")
        self.d_nope = need_int("d_nope", self.d_nope, 1)
        self.d_rope = need_int("d_rope", self.d_rope, 0)
        if 0 in self.wkv_b.shape or self.wkv_b.shape[1] <= self.d_nope:
            raise AttentionShapeError(f"wkv_b {tuple(self.wkv_b.shape)} must hold d_nope = {self.d_nope} key rows "
                                      "plus at least one value row per head, for at least one head and rank 1")

    @property
    def heads(self) -> int:
        return self.wkv_b.shape[0]

    @property
    def rank(self) -> int:
        return self.wkv_b.shape[2]

    @property
    def d_v(self) -> int:
        return self.wkv_b.shape[1] - self.d_nope

    @property
    def scale(self) -> float:
        return 1 / math.sqrt(self.d_nope + self.d_rope)

    @classmethod
    def random(cls, heads: int, rank: int, d_nope: int, d_rope: int, d_v: int, seed: int = 0) -> "MLAWeights":
        heads, rank, d_nope, d_v = (need_int(n, v, 1) for n, v in (("heads", heads), ("rank", rank), ("d_nope", d_nope),
                                                                   ("d_v", d_v)))
        g = torch.Generator().manual_seed(need_int("seed", seed, 0))
        wkv_b = torch.randn(heads, d_nope + d_v, rank, generator=g) / math.sqrt(rank)  # [H, dn + dv, r]
        return cls(wkv_b, d_nope, d_rope)


def _check(w: MLAWeights, q_nope, q_pe, c, k_pe):
    need_dims("q_nope", q_nope, 4, "[B, H, S, d_nope]")
    need_dims("q_pe", q_pe, 4, "[B, H, S, d_rope]")
    need_dims("latent", c, 3, "[B, T, r]")
    need_dims("k_pe", k_pe, 3, "[B, T, d_rope]")
    same("q_nope heads", q_nope.shape[1], "MLA heads", w.heads)
    same("q_nope width", q_nope.shape[-1], "d_nope", w.d_nope)
    same("q_pe width", q_pe.shape[-1], "d_rope", w.d_rope)
    same("k_pe width", k_pe.shape[-1], "d_rope", w.d_rope)
    same("latent width", c.shape[-1], "kv_lora_rank", w.rank)
    same("latent length", c.shape[1], "k_pe length", k_pe.shape[1])


def mla_expanded(w: MLAWeights, q_nope, q_pe, c, k_pe, causal: bool = True) -> torch.Tensor:
    """Per-head K/V from the latent, then dense attention: [B, H, S, d_v]."""
    _check(w, q_nope, q_pe, c, k_pe)
    k_nope = torch.einsum("btr,hdr->bhtd", c.float(), w.wkv_b[:, :w.d_nope].float())  # [B, H, T, dn]
    v = torch.einsum("btr,hdr->bhtd", c.float(), w.wkv_b[:, w.d_nope:].float())  # [B, H, T, dv]
    k = torch.cat([k_nope, k_pe.float()[:, None].expand(-1, w.heads, -1, -1)], dim=-1)  # [B, H, T, dn+dr]
    q = torch.cat([q_nope.float(), q_pe.float()], dim=-1)  # [B, H, S, dn+dr]
    return dense_attention(q, k, v, causal=causal, scale=w.scale)


def mla_absorbed(w: MLAWeights, q_nope, q_pe, c, k_pe, causal: bool = True) -> torch.Tensor:
    """Attention in latent space (weights absorbed): [B, H, S, d_v], equal to `mla_expanded`."""
    _check(w, q_nope, q_pe, c, k_pe)
    q_abs = torch.einsum("bhsd,hdr->bhsr", q_nope.float(), w.wkv_b[:, :w.d_nope].float())  # [B, H, S, r]
    scores = (torch.einsum("bhsr,btr->bhst", q_abs, c.float())
              + torch.einsum("bhsd,btd->bhst", q_pe.float(), k_pe.float())) * w.scale  # [B, H, S, T]
    if causal:
        scores = scores.masked_fill(~causal_mask(scores.shape[2], scores.shape[3]), float("-inf"))
    o_lat = torch.einsum("bhst,btr->bhsr", torch.softmax(scores, -1), c.float())  # [B, H, S, r]
    return torch.einsum("bhsr,hdr->bhsd", o_lat, w.wkv_b[:, w.d_nope:].float())  # [B, H, S, dv]


def mla_decode(w: MLAWeights, q_nope, q_pe, cache: KVStore) -> torch.Tensor:
    """Decode one sequence over a latent cache (a kvlab.cache store of [c | k_pe] entries, any kvlab format,
    one copy per token): q_nope [1, H, S, d_nope], q_pe [1, H, S, d_rope] -> [1, H, S, d_v]."""
    cache.expect(width=w.rank + w.d_rope)
    need_dims("q_nope", q_nope, 4, "[B, H, S, d_nope]")
    same("q_nope batch", q_nope.shape[0], "sequences in a latent cache store", 1)
    lat = cache.read().transpose(0, 1)  # [T, 1, r + dr] -> [1, T, r + dr]
    if lat.shape[1] == 0:
        raise AttentionShapeError("the MLA latent cache is empty")
    return mla_absorbed(w, q_nope, q_pe, lat[..., :w.rank], lat[..., w.rank:])
