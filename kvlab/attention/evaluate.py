"""Weight-free accuracy of each mechanism against dense attention, and a synthetic needle sweep.

One decode query (H heads, MQA/GQA keys) over T synthetic tokens. Keys are Gaussian; the query leans on
a few "hot" keys so attention is peaked, as in trained models. Each mechanism reads its cached entries as a
kvlab format stores them (`kvlab.quant.roundtrip`: quantized, read back; one KV head at a time) and is
compared with fp32 dense attention on the same inputs:
  rel_error, cosine  of the outputs
  kl                 KL(approx || dense) over token positions; a compressed entry's mass is spread evenly
                     over the tokens it pools (for a pure top-k selection this equals -log(mass covered))
  recall             indexer recall@k: selected positions (entries) among the true top-k of dense attention
  mass               dense attention mass on the tokens the mechanism reads
  bytes              bytes the mechanism's cached entries take at T tokens (kvlab.formats' entry bytes; the
                     packed stores that hold such entries are kvlab.cache's, used by the stack)
Needle: a key aligned with the query planted at a depth; retrieval = cosine(output, needle value).
Compression here pools with a uniform gate (mean pooling): a trained gate can lift salient tokens, so the
CSA / HCA rows are a lower bound for pooled entries, not a measurement of DeepSeek's trained compressor.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..checks import need_int, need_list
from ..formats import get_format
from ..quant.metrics import cosine, rel_error
from ..quant.roundtrip import roundtrip
from .checks import SelectionError
from .compress import pool_keys
from .dense import attention_probs, dense_attention
from .indexer import candidate_pool, index_scores, select_topk
from .metrics import kl, mass_covered, recall_at_k
from .mla import MLAWeights, mla_absorbed, mla_expanded
from .window import window_positions

MECHANISMS = ("dense", "window", "topk", "capped", "csa", "hca", "mla")  # mla: latent cache, no needle sweep


@dataclass(frozen=True)
class EvalSetup:
    """Sizes of the synthetic problem and of each mechanism (scaled-down V4 / V4.1 values by default)."""

    heads: int = 8  # query heads
    kv_heads: int = 1  # KV heads (V4: one shared head)
    head_dim: int = 64  # key / value width
    index_heads: int = 4  # indexer heads
    index_dim: int = 32  # indexer key width
    window: int = 64  # sliding window (V4: 128)
    sink_tokens: int = 4  # first tokens every window query keeps (StreamingLLM)
    topk: int = 64  # positions (entries) each query selects (V4: 512)
    candidate_blocks: int = 32  # capped pool: blocks (V4.1: 2048)
    candidate_block_size: int = 8  # capped pool: positions per block (V4.1: 8)
    csa_ratio: int = 4  # CSA compression (overlapping windows)
    hca_ratio: int = 128  # HCA compression (non-overlapping)
    hot: int = 16  # keys the query leans on
    strength: float = 4.0  # logit lift of the hot keys over the N(0, 1) background

    def __post_init__(self):
        for k in ("heads", "kv_heads", "head_dim", "index_heads", "index_dim", "window", "topk", "candidate_blocks",
                  "candidate_block_size", "csa_ratio", "hca_ratio", "hot"):
            object.__setattr__(self, k, need_int(k, getattr(self, k), 1, error=SelectionError))  # frozen
        object.__setattr__(self, "sink_tokens", need_int("sink_tokens", self.sink_tokens, 0, error=SelectionError))
        if self.heads % self.kv_heads:
            raise SelectionError(f"heads = {self.heads} is not a multiple of kv_heads = {self.kv_heads}")


@dataclass
class Problem:
    """One synthetic decode step."""

    q: torch.Tensor  # [1, H, 1, D]
    k: torch.Tensor  # [1, Hkv, T, D]
    v: torch.Tensor  # [1, Hkv, T, D]
    q_idx: torch.Tensor  # [1, 1, H_I, D_I] indexer queries
    w_idx: torch.Tensor  # [1, 1, H_I] indexer head weights
    proj: torch.Tensor  # [D, D_I] index-key projection (index keys = k @ proj)
    needle: int | None = None  # planted position
    needle_value: torch.Tensor | None = None  # [D]


def problem(setup: EvalSetup, tokens: int, seed: int = 0, needle_depth: float | None = None) -> Problem:
    """A seeded synthetic query / cache; optionally a needle at `needle_depth` (0 = first token, 1 = last).

    Background logits q.k / sqrt(D) are about N(0, 1); `hot` random keys (and, more weakly, the most recent
    tokens) are aligned with the query so their logits sit `strength` to 2 x `strength` higher. A needle key
    gets logit 2.5 x `strength` and a distinct value."""
    tokens = need_int("tokens", tokens, 1, error=SelectionError)
    s = setup
    g = torch.Generator().manual_seed(seed)
    D = s.head_dim
    k = torch.randn(1, s.kv_heads, tokens, D, generator=g)  # [1, Hkv, T, D]
    v = torch.randn(1, s.kv_heads, tokens, D, generator=g)  # [1, Hkv, T, D]
    q0 = torch.randn(D, generator=g)  # [D] the direction every head roughly shares
    q = (q0 + 0.3 * torch.randn(s.heads, D, generator=g))[None, :, None]  # [1, H, 1, D]: heads roughly agree
    unit = q0 * math.sqrt(D) / q0.dot(q0)  # [D]: k = L * unit gives logit ~ L

    def plant(pos: torch.Tensor, logit: torch.Tensor):
        k[0, :, pos] = 0.5 * k[0, :, pos] + logit[:, None] * unit

    plant(torch.randint(0, tokens, (s.hot,), generator=g), s.strength * (1 + torch.rand(s.hot, generator=g)))
    recent = torch.arange(max(0, tokens - 32), tokens)  # [<= 32] the most recent positions
    plant(recent, 0.5 * s.strength * torch.rand(len(recent), generator=g))
    needle = val = None
    if needle_depth is not None:
        if not 0 <= needle_depth <= 1:
            raise SelectionError(f"needle depth must lie in [0, 1], got {needle_depth}")
        needle = min(tokens - 1, int(round(needle_depth * (tokens - 1))))
        k[0, :, needle] = 2.5 * s.strength * unit
        val = 3 * torch.randn(D, generator=g)  # [D]
        v[0, :, needle] = val
    proj = torch.randn(D, s.index_dim, generator=g) / math.sqrt(s.index_dim)  # [D, D_I]
    qi = (q[0, :, 0].view(s.index_heads, -1, D).mean(1) @ proj)[None, None]  # [1, 1, H_I, D_I]
    w = torch.ones(1, 1, s.index_heads)  # [1, 1, H_I]
    return Problem(q, k, v, qi, w, proj, needle, val)


def _stored(x: torch.Tensor, fmt: str) -> tuple[torch.Tensor, int]:
    """Entries x [1, Hkv, N, D] as `fmt` stores them (each KV head quantized on its own, as a per-head cache
    would be) and the bytes they take (N x Hkv entries of the format's entry bytes)."""
    if not x.shape[2]:
        return x, 0
    out = torch.stack([roundtrip(x[:, h], fmt) for h in range(x.shape[1])], 1)  # [1, Hkv, N, D]
    return out, x.shape[1] * x.shape[2] * get_format(fmt).entry_bytes(x.shape[-1])


def _spread(mass: torch.Tensor, ranges: torch.Tensor, tokens: int) -> torch.Tensor:
    """Token distribution [T]: mass[i] spread evenly over tokens ranges[i] = [a, b) (a difference array)."""
    a, b = ranges[:, 0], ranges[:, 1]
    d = torch.zeros(tokens + 1)  # [T + 1] differences
    per = mass / (b - a).float()  # [n] mass per token of each range
    d.index_add_(0, a, per)
    d.index_add_(0, b, -per)
    return d.cumsum(0)[:tokens]


def _tokens(t: torch.Tensor) -> torch.Tensor:
    """Ranges [n, 2] of single tokens."""
    return torch.stack([t, t + 1], 1)  # [n, 2]


def run(mech: str, p: Problem, setup: EvalSetup, fmt: str = "bf16") -> dict:
    """One mechanism on one problem: accuracy metrics against fp32 dense attention, bytes held."""
    if mech not in MECHANISMS:
        raise SelectionError(f"unknown mechanism {mech!r}; choose one of {', '.join(MECHANISMS)}")
    if mech == "mla":
        raise SelectionError("mla is evaluated by run_mla (a latent cache has no planted needle)")
    s, T = setup, p.k.shape[2]
    ref = dense_attention(p.q, p.k, p.v)  # [1, H, 1, D]
    p_ref = attention_probs(p.q, p.k).mean(1)[:, 0]  # [1, T] averaged over heads
    win = window_positions(T, s.window, s.sink_tokens)  # [W'] positions the window reads
    held = 0  # bytes of the cached entries the mechanism reads
    recall = None
    if mech == "dense":
        keys, vals = p.k, p.v
        read = torch.arange(T)  # [T]
        ranges = _tokens(read)
    elif mech == "window":
        keys, vals = p.k[:, :, win], p.v[:, :, win]
        ranges = _tokens(win)
        read = win
    elif mech in ("topk", "capped"):
        kidx, b = _stored(p.k[:, :1] @ p.proj, fmt)  # [1, 1, T, D_I] index keys
        held += b
        sc = index_scores(p.q_idx, p.w_idx, kidx[:, 0])[0]  # [1, T]
        if s.topk > T:
            raise SelectionError(f"top-k = {s.topk} is larger than the pool of {T} positions")
        valid = None
        if mech == "capped":
            pool = candidate_pool(sc, s.candidate_blocks, s.candidate_block_size)  # [1, P]
            valid = torch.zeros(1, T + 1, dtype=torch.bool)  # [1, T + 1]: slot T takes the -1 padding
            valid = valid.scatter_(1, torch.where(pool >= 0, pool, T), True)[:, :T]  # [1, T]
            if int(valid.sum()) < s.topk:
                raise SelectionError(f"top-k = {s.topk} is larger than the candidate pool of {int(valid.sum())} "
                                     f"positions ({s.candidate_blocks} blocks x {s.candidate_block_size})")
        sel = select_topk(sc, s.topk, valid)[0]  # [k]
        sel = sel[sel >= 0]
        recall = recall_at_k(sel[None], p_ref, s.topk)
        keys, vals = p.k[:, :, sel], p.v[:, :, sel]
        ranges = _tokens(sel)
        read = sel
    else:  # csa / hca: compressed entries (+ indexer top-k for csa) + the window
        m, overlap = (s.csa_ratio, True) if mech == "csa" else (s.hca_ratio, False)
        ek, ev = pool_keys(p.k, m, overlap), pool_keys(p.v, m, overlap)  # [1, Hkv, N, D]
        n = ek.shape[2]
        e = torch.arange(n)  # [N] entry indices
        span = torch.stack([((e - 1) * m).clamp_min(0) if overlap else e * m, (e + 1) * m], 1)  # [N, 2] tokens pooled
        if mech == "csa" and n:
            kidx, b = _stored(pool_keys(p.k[:, :1] @ p.proj, m, True), fmt)  # [1, 1, N, D_I]
            held += b
            sc = index_scores(p.q_idx, p.w_idx, kidx[:, 0])[0]  # [1, N]
            sel = select_topk(sc, min(s.topk, n))[0]
            mass_e = p_ref[0, :n * m].view(n, m).sum(-1)[None]  # [1, N] dense mass per window
            recall = recall_at_k(sel[None], mass_e, min(s.topk, n))
        else:
            sel = torch.arange(n)  # [N]
        stored = [_stored(t, fmt) for t in (ek, ev, p.k[:, :, win], p.v[:, :, win])]
        (ek, _), (ev, _), (wk, _), (wv, _) = stored
        held += sum(b for _, b in stored)
        keys = torch.cat([ek[:, :, sel], wk], 2)  # [1, Hkv, k + W', D]
        vals = torch.cat([ev[:, :, sel], wv], 2)  # [1, Hkv, k + W', D]
        ranges = torch.cat([span[sel], _tokens(win)])  # [k + W', 2] tokens each key stands for
        read = torch.nonzero(_spread(torch.ones(len(ranges)), ranges, T) > 0).flatten()  # tokens covered
    if mech not in ("csa", "hca"):  # token-level mechanisms: K and V through the format
        (keys, bk), (vals, bv) = _stored(keys, fmt), _stored(vals, fmt)
        held += bk + bv
    out = dense_attention(p.q, keys, vals)  # [1, H, 1, D]
    p_virtual = attention_probs(p.q, keys).mean(1)[0, 0]  # [n]
    p_tok = _spread(p_virtual, ranges, T)  # [T]
    res = dict(mechanism=mech, format=fmt, tokens=T, rel_error=rel_error(ref, out), cosine=cosine(ref, out),
               kl=kl(p_tok[None], p_ref), recall=recall, mass=mass_covered(read[None], p_ref),
               bytes=held)
    if p.needle is not None:
        res["needle"] = cosine(p.needle_value, out[0].mean(0)[0])
    return res


def run_mla(setup: EvalSetup, tokens: int, seed: int = 0, fmt: str = "bf16", rank: int = 128,
            d_rope: int = 16) -> dict:
    """MLA decode over a latent cache [c | k_pe] stored in `fmt` (absorbed path) against the expanded path
    in fp32 on the same latent: the error the latent's format adds (the mechanism itself is exact)."""
    tokens = need_int("tokens", tokens, 1, error=SelectionError)
    s = setup
    g = torch.Generator().manual_seed(seed)
    w = MLAWeights.random(s.heads, rank, s.head_dim, d_rope, s.head_dim, seed=seed)
    c = torch.randn(1, tokens, rank, generator=g)  # [1, T, r]
    kpe = torch.randn(1, tokens, d_rope, generator=g)  # [1, T, dr]
    hot = torch.randint(0, tokens, (s.hot,), generator=g)  # [hot] positions
    qn = torch.randn(1, s.heads, 1, s.head_dim, generator=g)  # [1, H, 1, d_nope]
    qp = torch.randn(1, s.heads, 1, d_rope, generator=g)  # [1, H, 1, dr]
    # make attention peaked: the hot latents point where the absorbed queries look
    q_abs = torch.einsum("bhsd,hdr->r", qn, w.wkv_b[:, :w.d_nope])  # [r]
    c[0, hot] += s.strength * q_abs / q_abs.norm() * math.sqrt(rank)
    lat, held = _stored(torch.cat([c, kpe], -1)[:, None], fmt)  # [1, 1, T, r + dr] as the latent cache stores it
    lat = lat[:, 0]  # [1, T, r + dr]
    ref = mla_expanded(w, qn, qp, c, kpe, causal=False)  # [1, H, 1, dv]
    out = mla_absorbed(w, qn, qp, lat[..., :rank], lat[..., rank:])  # decode over the stored latent

    def probs(cc, kk):
        sc = (torch.einsum("bhsd,hdr,btr->bhst", qn, w.wkv_b[:, :w.d_nope], cc)
              + torch.einsum("bhsd,btd->bhst", qp, kk)) * w.scale
        return sc.softmax(-1).mean(1)[:, 0]  # [1, T]

    return dict(mechanism="mla", format=get_format(fmt).name, tokens=tokens, rel_error=rel_error(ref, out),
                cosine=cosine(ref, out), kl=kl(probs(lat[..., :rank], lat[..., rank:]), probs(c, kpe)), recall=None,
                mass=1.0, bytes=held)


def accuracy_table(mechanisms, formats, tokens: int, setup: EvalSetup | None = None, seeds=(0,)) -> list[dict]:
    """Rows of `run` for every mechanism x format, averaged over seeds."""
    setup = setup or EvalSetup()
    mechanisms = need_list("mechanisms", mechanisms, "a list of mechanism names")
    formats = need_list("formats", formats, "a list of format names")
    rows = []
    for mech in mechanisms:
        for fmt in formats:
            rs = [run_mla(setup, tokens, seed, fmt) if mech == "mla" else
                  run(mech, problem(setup, tokens, seed), setup, fmt) for seed in seeds]
            row = dict(rs[0])
            for key in ("rel_error", "cosine", "kl", "recall", "mass"):
                if rs[0][key] is not None:
                    row[key] = sum(r[key] for r in rs) / len(rs)
            rows.append(row)
    return rows


def needle_sweep(mechanism: str, fmt: str, lengths, depths, setup: EvalSetup | None = None, seeds=(0,)):
    """Needle retrieval [len(depths), len(lengths)]: mean cosine of output and needle value."""
    setup = setup or EvalSetup()
    lengths = need_list("lengths", lengths, "a list of context lengths")
    depths = need_list("depths", depths, "a list of depths in [0, 1]")
    out = torch.zeros(len(depths), len(lengths))  # [depths, lengths]
    for i, d in enumerate(depths):
        for j, t in enumerate(lengths):
            out[i, j] = sum(run(mechanism, problem(setup, t, sd, d), setup, fmt)["needle"] for sd in seeds) / len(seeds)
    return out


def pareto(rows: list[dict], x: str = "bytes", y: str = "rel_error") -> list[dict]:
    """The rows no other row beats on both `x` and `y` (smaller is better), sorted by `x`."""
    front, best = [], float("inf")
    for r in sorted(rows, key=lambda r: (r[x], r[y])):
        if r[y] < best:
            front.append(r)
            best = r[y]
    return front
