"""One decode step of one layer on CPU: V4.1-style capped sparse attention against dense SDPA over the full cache.

Shapes follow DeepSeek V4.1-Flash's decoder layer (one shared 512-wide K=V entry per token, 128-token window,
indexer 128 wide, candidate pool 2048 blocks x 8, top-512) with fewer heads (16 query, 8 index) to keep the
CPU run short. The sparse step scores every cached entry with the indexer (the candidate source layer's
work), keeps the best 2048 blocks of 8, takes the top 512 in that pool and attends to them plus the window.
The dense step runs torch's scaled_dot_product_attention over all T entries. Both run in one process,
interleaved, float32, best of `reps` (the minimum is the least disturbed by other load on a shared machine);
the ratio is the figure to read. Bytes kept: the layer's cache in V4.1's storage
format (kvlab.layout) against a BF16 dense K=V cache (kvlab.formats).
"""
from __future__ import annotations

import time

import torch

from kvlab.attention.indexer import candidate_pool, index_scores, select_topk, sparse_attention
from kvlab.formats import get_format
from kvlab.layout import build_layout
from kvlab.models import load_model

HEADS, INDEX_HEADS = 16, 8  # scaled down from 64 and 32


def _sync() -> None:
    if torch.cuda.is_available():  # CUDA kernels run asynchronously: time them to completion
        torch.cuda.synchronize()


def _time(fn, reps: int) -> float:
    ts = []
    for _ in range(reps):
        _sync()
        t0 = time.perf_counter()
        fn()
        _sync()
        ts.append(time.perf_counter() - t0)
    return sorted(ts)[len(ts) // 2]


def run(tokens: int, reps: int = 9, seed: int = 0, device: str = "cpu") -> dict:
    spec = load_model("deepseek-v4.1-flash")
    D, DI, W = spec.head_dim, spec.index_head_dim, spec.sliding_window
    g = torch.Generator().manual_seed(seed)
    cache = torch.randn(1, 1, tokens, D, generator=g).to(device)  # [B, 1, T, D] K = V entries
    kidx = torch.randn(1, tokens, DI, generator=g).to(device)  # [B, T, D_I] index keys
    q = torch.randn(1, HEADS, 1, D, generator=g).to(device)
    qi = torch.randn(1, 1, INDEX_HEADS, DI, generator=g).to(device)
    wi = torch.randn(1, 1, INDEX_HEADS, generator=g).to(device)
    window = cache[:, :, -W:]

    def sparse():
        sc = index_scores(qi, wi, kidx)  # [1, 1, T]
        pool = candidate_pool(sc, spec.candidate_blocks, spec.candidate_block_size)  # [1, 1, P]
        inpool = torch.zeros(1, 1, tokens + 1, dtype=torch.bool, device=device)
        inpool = inpool.scatter_(2, torch.where(pool >= 0, pool, tokens), True)[..., :tokens]
        idx = select_topk(sc, spec.index_topk, inpool)  # [1, 1, 512]
        return sparse_attention(q, cache, cache, idx, extra=(window, window, None))

    def dense():
        return torch.nn.functional.scaled_dot_product_attention(q, cache, cache, enable_gqa=True)

    with torch.no_grad():
        sparse(), dense()  # warm up
        t_s, t_d = [], []
        for _ in range(reps):  # interleaved, so both see the same machine state
            t_s.append(_time(sparse, 1))
            t_d.append(_time(dense, 1))
    t_s, t_d = min(t_s), min(t_d)
    layer = build_layout(spec).layers[spec.config["candidate_source_layer_id"]]
    sparse_bytes = sum(c.bytes_at(tokens) for c in layer.components)
    dense_bytes = tokens * get_format("bf16").entry_bytes(D)
    return dict(tokens=tokens, device=str(device), sparse_ms=1e3 * t_s, dense_ms=1e3 * t_d, speedup=t_d / t_s,
                sparse_bytes=sparse_bytes, dense_bytes=dense_bytes, bytes_ratio=dense_bytes / sparse_bytes)


def main(lengths=(32_768, 131_072), threads: int = 1) -> list[dict]:
    """Both paths on `threads` torch threads (one: stable figures on a small shared machine)."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        rows = [run(t) for t in lengths]
    finally:
        torch.set_num_threads(before)
    print(f"decode step, one V4.1-style layer, {HEADS} heads x 512, CPU float32, {threads} thread(s), "
          "best of 9")
    print(f"{'tokens':>8} {'capped sparse ms':>17} {'dense SDPA ms':>14} {'dense/sparse':>13} "
          f"{'sparse keeps B':>15} {'dense keeps B':>14} {'bytes ratio':>12}")
    for r in rows:
        print(f"{r['tokens']:>8,} {r['sparse_ms']:>17.2f} {r['dense_ms']:>14.2f} {r['speedup']:>13.2f} "
              f"{r['sparse_bytes']:>15,} {r['dense_bytes']:>14,} {r['bytes_ratio']:>12.2f}")
    return rows


if __name__ == "__main__":
    main()
