"""Lightning-indexer-style selection: score positions cheaply, attend only to the top k.

Score (DeepSeek V3.2 `Indexer`, V4 `IndexerScorer`):
  I[b, s, t] = sum_h (w[b, s, h] * H_I^-0.5) * ReLU(q_I[b, s, h] . k_I[b, t]) * D_I^-0.5
with one compact index key per position shared by all index heads. A capped candidate pool
(DeepSeek V4.1: candidate_topk_blocks x candidate_block_size = 2048 x 8 = 16,384 positions, chosen
once per step on one layer) bounds the positions any later top-k looks at.
"""
from __future__ import annotations

import math

import torch

from ..checks import cdiv, need_int, need_type
from ..errors import WrongTypeError
from .checks import (AttentionShapeError, SelectionError, need_dims, need_index, need_mask, need_scale, need_sinks,
                     no_empty_rows, same)


def index_scores(q_idx: torch.Tensor, weights: torch.Tensor, k_idx: torch.Tensor) -> torch.Tensor:
    """q_idx [B, S, H_I, D_I], weights [B, S, H_I], k_idx [B, N, D_I] -> scores [B, S, N]."""
    need_dims("index queries", q_idx, 4, "[B, S, H_I, D_I]")
    need_dims("index weights", weights, 3, "[B, S, H_I]")
    need_dims("index keys", k_idx, 3, "[B, N, D_I]")
    same("index query width", q_idx.shape[-1], "index key width", k_idx.shape[-1])
    same("index weights heads", weights.shape[-1], "index query heads", q_idx.shape[2])
    same("index weights queries", weights.shape[1], "index queries", q_idx.shape[1])
    same("index weights batch", weights.shape[0], "index queries batch", q_idx.shape[0])
    same("index keys batch", k_idx.shape[0], "index queries batch", q_idx.shape[0])
    b, n_q, h, d = q_idx.shape
    # one [S * H, D] x [D, N] product per sequence: no copy of the keys per query
    s = torch.relu(torch.matmul(q_idx.float().flatten(1, 2), k_idx.float().transpose(-1, -2)))  # [B, S * H, N]
    s = s.view(b, n_q, h, -1)  # [B, S, H, N]
    w = weights.float() / (math.sqrt(h) * math.sqrt(d))  # [B, S, H]
    return torch.matmul(w.unsqueeze(-2), s).squeeze(-2)  # sum over heads: [B, S, N]


def select_topk(scores: torch.Tensor, k: int, valid: torch.Tensor | None = None) -> torch.Tensor:
    """Indices [..., k] of the k best positions; positions not `valid` are never chosen (-1 when a row
    has fewer than k valid ones). A k larger than the pool is an error."""
    need_type("scores", scores, torch.Tensor, "a tensor [..., N]")
    k = need_int("top-k", k, 1, error=SelectionError)
    if k > scores.shape[-1]:
        raise SelectionError(f"top-k = {k} is larger than the pool of {scores.shape[-1]} positions")
    if valid is not None:
        need_mask("valid", valid, tuple(scores.shape), "[..., N]", "True = may be chosen")
        scores = scores.masked_fill(~valid, float("-inf"))
    v, idx = scores.sort(dim=-1, descending=True, stable=True)  # ties (ReLU zeros) go to the earlier position
    v, idx = v[..., :k], idx[..., :k]
    return torch.where(torch.isfinite(v), idx, torch.full_like(idx, -1))  # [..., k]


def candidate_pool(scores: torch.Tensor, blocks: int, block_size: int) -> torch.Tensor:
    """Positions [..., <= blocks * block_size] of the `blocks` best blocks of `block_size` consecutive
    positions, a block scored by its best position (ascending; -1 pads a partial last block)."""
    need_type("scores", scores, torch.Tensor, "a tensor [..., N]")
    blocks = need_int("candidate blocks", blocks, 1, error=SelectionError)
    block_size = need_int("candidate block size", block_size, 1, error=SelectionError)
    n = scores.shape[-1]
    nb = cdiv(n, block_size)  # blocks, the last one maybe partial
    pad = scores.new_full((*scores.shape[:-1], nb * block_size - n), float("-inf"))
    bs = torch.cat([scores, pad], -1).unflatten(-1, (nb, block_size)).amax(-1)  # [..., nb]
    top = bs.sort(dim=-1, descending=True, stable=True).indices[..., :min(blocks, nb)].sort(-1).values  # [..., b]
    offsets = torch.arange(block_size, device=top.device)  # on the scores' device (CUDA too)
    pos = (top[..., None] * block_size + offsets).flatten(-2)  # [..., b * block_size]
    return torch.where(pos < n, pos, torch.full_like(pos, -1))  # [..., b * block_size]


def gather_positions(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """x [B, Hkv, N, D], idx [B, S, k] (-1 = none, read as 0) -> [B, Hkv, S, k, D]."""
    b, h, n, d = x.shape
    i = idx.clamp_min(0) + n * torch.arange(b, device=idx.device).view(b, 1, 1)  # [B, S, k] rows of [B * N]
    flat = x.transpose(0, 1).reshape(h, b * n, d)  # [Hkv, B * N, D] (a view when Hkv = 1)
    out = flat.index_select(1, i.flatten()).view(h, b, idx.shape[1], idx.shape[2], d)  # [Hkv, B, S, k, D]
    return out.transpose(0, 1)  # [B, Hkv, S, k, D]


def sparse_attention(q, k, v, idx, scale: float | None = None, sinks: torch.Tensor | None = None,
                     extra: tuple[torch.Tensor, torch.Tensor, torch.Tensor | None] | None = None) -> torch.Tensor:
    """Attention of q [B, H, S, D] over the positions idx [B, S, k] of k, v [B, Hkv, N, D(v)],
    optionally also over `extra` = (k2, v2 [B, Hkv, M, D], mask [S, M] or [B, S, M] or None), e.g. a
    sliding window. -1 entries of idx are skipped. Returns [B, H, S, Dv]. Batches must match exactly (one
    sequence's indices never serve another's queries); every query must see a position unless a sink is given."""
    _check_sparse(q, k, v, idx, scale, sinks, extra)
    b, heads, s, d = q.shape
    hkv, k_n = k.shape[1], idx.shape[2]
    scale = scale if scale is not None else 1 / math.sqrt(d)
    qg = q.float().view(b, hkv, heads // hkv, s, d)  # [B, Hkv, G, S, D]: no copies of the shared keys
    ks = gather_positions(k.float(), idx)  # [B, Hkv, S, k, D]
    vs = ks if v is k else gather_positions(v.float(), idx)  # K=V (V4's shared entries): gathered once
    logits = torch.einsum("bhgsd,bhskd->bhgsk", qg, ks).reshape(b, heads, s, k_n) * scale  # [B, H, S, k]
    logits = logits.masked_fill((idx < 0)[:, None], float("-inf"))  # [B, H, S, k]
    parts = [logits]
    if extra is not None:
        k2, v2, m2 = extra
        qf = qg.reshape(b, hkv, -1, d)  # [B, Hkv, G * S, D]: the group's queries share the keys, no copies
        l2 = torch.matmul(qf, k2.float().transpose(-1, -2)).reshape(b, heads, s, -1) * scale  # [B, H, S, M]
        if m2 is not None:
            l2 = l2.masked_fill(~(m2 if m2.dim() == 2 else m2[:, None]), float("-inf"))
        parts.append(l2)
    if sinks is not None:
        parts.append(sinks.float().view(1, -1, 1, 1).expand(b, -1, s, 1))  # [B, H, S, 1]
    p = torch.softmax(torch.cat(parts, -1), -1)  # [B, H, S, k + M (+1)]
    pg = p.view(b, hkv, heads // hkv, s, -1)  # [B, Hkv, G, S, k + M (+1)]
    out = torch.einsum("bhgsk,bhskd->bhgsd", pg[..., :k_n], vs)  # [B, Hkv, G, S, Dv]
    if extra is not None:
        m = extra[0].shape[2]
        pw = pg[..., k_n:k_n + m].reshape(b, hkv, -1, m)  # [B, Hkv, G * S, M]
        out = out + torch.matmul(pw, extra[1].float()).view(out.shape)  # + [B, Hkv, G, S, Dv]
    return out.reshape(b, heads, s, -1)  # [B, H, S, Dv]


def _check_sparse(q, k, v, idx, scale, sinks, extra) -> None:
    need_dims("q", q, 4, "[B, H, S, D]")
    need_dims("k", k, 4, "[B, Hkv, N, D]")
    need_dims("v", v, 4, "[B, Hkv, N, Dv]")
    need_type("idx", idx, torch.Tensor, "an integer tensor [B, S, k]")
    if idx.dim() != 3:
        raise AttentionShapeError(f"idx must be [B, S, k] (3 dims), got shape {tuple(idx.shape)}")
    same("q batch", q.shape[0], "k batch", k.shape[0])
    same("v batch", v.shape[0], "k batch", k.shape[0])
    same("idx batch", idx.shape[0], "q batch", q.shape[0])
    same("idx queries", idx.shape[1], "q length", q.shape[2])
    same("q head_dim", q.shape[-1], "k head_dim", k.shape[-1])
    same("k heads", k.shape[1], "v heads", v.shape[1])
    same("k length", k.shape[2], "v length", v.shape[2])
    if q.shape[1] % k.shape[1]:
        raise AttentionShapeError(f"q heads = {q.shape[1]} is not a multiple of kv heads = {k.shape[1]}")
    need_index("idx", idx, k.shape[2], "[B, S, k]")
    need_scale(scale)
    if sinks is not None:
        need_sinks(sinks, q.shape[1])
    seen = idx >= 0  # [B, S, k] positions each query sees
    if extra is not None:
        if not isinstance(extra, tuple) or len(extra) != 3:
            raise WrongTypeError("extra must be a tuple (k2, v2, mask or None)")
        k2, v2, m2 = extra
        need_dims("extra keys", k2, 4, "[B, Hkv, M, D]")
        need_dims("extra values", v2, 4, "[B, Hkv, M, Dv]")
        for name, t in (("extra keys", k2), ("extra values", v2)):
            same(f"{name} batch", t.shape[0], "q batch", q.shape[0])
            same(f"{name} heads", t.shape[1], "kv heads", k.shape[1])
        same("extra keys length", k2.shape[2], "extra values length", v2.shape[2])
        same("extra keys head_dim", k2.shape[-1], "q head_dim", q.shape[-1])
        same("extra values width", v2.shape[-1], "v width", v.shape[-1])
        m = k2.shape[2]
        if m2 is None:
            seen = torch.cat([seen, seen.new_ones(*seen.shape[:2], m)], -1)
        else:
            need_mask("extra mask", m2, (q.shape[0], q.shape[2], m), "[S, M] or [B, S, M]", "True = may attend")
            if m2.dim() > 3:
                raise AttentionShapeError(f"extra mask must be [S, M] or [B, S, M], got shape {tuple(m2.shape)}")
            seen = torch.cat([seen, m2.expand(q.shape[0], q.shape[2], m)], -1)
    if sinks is None:
        no_empty_rows("idx (with extra)" if extra is not None else "idx", seen)
