"""A scaled-down DeepSeek V4 / V4.1-style model stack with random seeded weights, prefill and decode.

Each layer: RMSNorm -> attention -> residual -> RMSNorm -> SwiGLU MLP -> residual. Attention follows V4:
one shared K=V head (RMSNorm, RoPE on the trailing dims), a per-layer sliding window, compressed entries
(CSA / HCA / Full) read through an indexer top-k (or all of them, HCA), a per-head sink logit, and the
inverse RoPE on the output. Layer modes come from `sharing.scaled_plan`, so Reindex / Reuse layers read the
entries their Full source stored. `dense=True` builds the reference: the same weights attending to every
token's uncompressed K=V. Not modelled: hyper-connections, MoE (a dense SwiGLU stands in), MTP, q/o low-rank.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from ..models import load_model
from .checks import SelectionError, need_dims, need_int
from .compress import Compressor, CompressorState
from .indexer import candidate_pool, index_scores, select_topk, sparse_attention
from .rope import apply_rope, rms_norm
from .sharing import LayerPlan, scaled_plan
from .store import KVStore
from .window import WindowState

ROLES = ("main", "index", "swa", "kv")  # formats a stack can set: compressed entries, index keys, window, dense K=V


@dataclass
class StackConfig:
    """A catalog model scaled down for CPU; compression ratios, window and top-k scaled by parameters."""

    model: str = "deepseek-v4.1-flash"  # catalog name (a DeepSeek V4 / V4.1 config)
    layers: int = 10  # decoder layers kept (sampled evenly from the real stack)
    hidden: int = 64  # model width
    heads: int = 4  # query heads
    head_dim: int = 32  # width of the shared K=V entry
    rope_dim: int = 8  # trailing RoPE channels
    index_heads: int = 2  # indexer heads
    index_dim: int = 16  # indexer key width
    window: int = 16  # sliding window (real: 128)
    index_topk: int = 16  # entries each query selects (real: 512)
    candidate_blocks: int | None = None  # capped candidate pool: blocks kept (V4.1 real: 2048); None = no cap
    candidate_block_size: int = 4  # entries per candidate block (real: 8)
    ratio_map: dict = field(default_factory=dict)  # real ratio -> scaled ratio, e.g. {128: 16}
    vocab: int = 128  # vocabulary size
    seed: int = 0  # weight seed
    formats: dict = field(default_factory=dict)  # role (main, index, swa, kv) -> kvlab format; default bf16
    packed: bool = True  # caches hold packed bytes (kvlab.cache) that attention decodes on read; batch 1

    def __post_init__(self):
        for name in ("layers", "hidden", "heads", "head_dim", "index_heads", "index_dim", "window", "index_topk",
                     "candidate_block_size", "vocab"):
            need_int(name, getattr(self, name))
        if self.candidate_blocks is not None:
            need_int("candidate_blocks", self.candidate_blocks)
        if not 0 <= self.rope_dim <= self.head_dim or self.rope_dim % 2:
            raise SelectionError(f"rope_dim must be even and at most head_dim ({self.head_dim}), got {self.rope_dim}")
        for r, s in self.ratio_map.items():
            need_int(f"ratio_map[{r}]", s)
        bad = set(self.formats) - set(ROLES)
        if bad:
            raise SelectionError(f"formats names unknown roles {sorted(bad)}; roles are {', '.join(ROLES)}")

    def plan(self) -> list[LayerPlan]:
        return [LayerPlan(p.index, p.mode, self.ratio_map.get(p.ratio, p.ratio), p.source, p.indexed)
                for p in scaled_plan(self.model, self.layers)]


def _lin(g, n_in, n_out):
    return torch.randn(n_in, n_out, generator=g) / math.sqrt(n_in)


@dataclass
class LayerWeights:
    """Random weights of one layer."""

    wq: torch.Tensor  # [hidden, H * D]
    wkv: torch.Tensor  # [hidden, D] shared K=V for the window
    kv_norm: torch.Tensor  # [D]
    sinks: torch.Tensor  # [H] sink logits
    wo: torch.Tensor  # [H * D, hidden]
    w1: torch.Tensor  # [hidden, 2 hidden] SwiGLU gate
    w3: torch.Tensor  # [hidden, 2 hidden] SwiGLU up
    w2: torch.Tensor  # [2 hidden, hidden] SwiGLU down
    comp: Compressor | None  # main-entry compressor (layers that store)
    index_comp: Compressor | None  # index-key compressor (indexed layers that store)
    wq_idx: torch.Tensor | None  # [hidden, H_I * D_I] indexer queries
    w_idx: torch.Tensor | None  # [hidden, H_I] indexer head weights


class Stack:
    """The model: weights, per-layer caches, prefill / decode, window offload with bounded replay."""

    def __init__(self, cfg: StackConfig, dense: bool = False):
        self.cfg, self.dense = cfg, dense
        self.plan = cfg.plan()
        self.spec = load_model(cfg.model)
        c = self.spec.config
        self.theta = (float(c.get("rope_theta", 10000.0)), float(c.get("compress_rope_theta", 160000.0)))  # main, compress
        g = torch.Generator().manual_seed(cfg.seed)
        h, H, D = cfg.hidden, cfg.heads, cfg.head_dim
        self.embed = torch.randn(cfg.vocab, h, generator=g)
        self.head = _lin(g, h, cfg.vocab)
        self.weights: list[LayerWeights] = []
        for p in self.plan:
            stores = p.stores and p.ratio > 0
            comp = Compressor.random(h, D, p.ratio, p.mode in ("csa", "full"), cfg.rope_dim,
                                     seed=cfg.seed * 1000 + 2 * p.index + 1, rope_theta=self.theta[1]) if stores else None
            icomp = Compressor.random(h, cfg.index_dim, p.ratio, True, 0, seed=cfg.seed * 1000 + 2 * p.index + 2) \
                if stores and p.indexed else None
            self.weights.append(LayerWeights(
                _lin(g, h, H * D), _lin(g, h, D), 1 + 0.1 * torch.randn(D, generator=g),
                torch.randn(H, generator=g), _lin(g, H * D, h), _lin(g, h, 2 * h), _lin(g, h, 2 * h), _lin(g, 2 * h, h),
                comp, icomp, _lin(g, h, cfg.index_heads * cfg.index_dim) if p.indexed else None,
                _lin(g, h, cfg.index_heads) if p.indexed else None))
        # the layer whose indexer chooses the capped candidate pool (V4.1: candidate_source_layer_id, a Full
        # layer of the decoder half); the layers reading its entries select within that pool
        real = self.spec.config.get("candidate_source_layer_id")
        ratio = None if real is None else cfg.ratio_map.get(self.spec.compress_ratios[real],
                                                            self.spec.compress_ratios[real])
        self.cand_src = next((p.index for p in self.plan if p.stores and p.indexed and p.ratio
                              and (ratio is None or p.ratio == ratio)), None)
        self.reset()

    # --- state ------------------------------------------------------------------------------
    def reset(self) -> None:
        cfg, f = self.cfg, self.cfg.formats
        self.pos = 0  # tokens processed
        self.tokens: list[torch.Tensor] = []  # token ids seen ([B] each), for replay
        pk = cfg.packed
        self.swa = [KVStore(cfg.head_dim, f.get("kv" if self.dense else "swa", "bf16"), "kv" if self.dense else "swa",
                            None if self.dense else cfg.window, pk) for _ in self.plan]
        self.main = {p.index: KVStore(cfg.head_dim, f.get("main", "bf16"), "main", packed=pk) for p in self.plan
                     if p.stores and p.ratio and not self.dense}
        self.index = {p.index: KVStore(cfg.index_dim, f.get("index", "bf16"), "index", packed=pk) for p in self.plan
                      if p.stores and p.indexed and p.ratio and not self.dense}
        self.comp_state = {p.index: CompressorState(self.weights[p.index].comp) for p in self.plan if p.index in self.main}
        self.icomp_state = {p.index: CompressorState(self.weights[p.index].index_comp) for p in self.plan
                            if p.index in self.index}
        self.window_state: WindowState | None = None

    def cache_bytes(self) -> dict[str, int]:
        """Bytes each kind of cached state holds now (per sequence), from kvlab.formats."""
        out = {"window": sum(s.nbytes for s in self.swa), "main": sum(s.nbytes for s in self.main.values()),
               "index": sum(s.nbytes for s in self.index.values())}
        out["total"] = sum(out.values())
        return out

    # --- forward ----------------------------------------------------------------------------
    def forward(self, ids: torch.Tensor, replay: bool = False) -> torch.Tensor:
        """Process new tokens ids [B, S] after the cached ones; returns logits [B, S, vocab]."""
        need_dims("token ids", ids, 2, "[B, S]")
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= self.cfg.vocab):
            raise SelectionError(f"token ids must lie in [0, {self.cfg.vocab})")
        x = self.embed[ids]  # [B, S, hidden]
        sel: dict[int, torch.Tensor] = {}  # layer -> selection [B, S, k] made this call (for Reuse layers)
        pool: torch.Tensor | None = None  # [B, S, N] candidate pool of each query, chosen this call
        for p, w in zip(self.plan, self.weights):
            a, sel_p, pool = self._attention(p, w, rms_norm(x), replay, sel, pool)
            sel[p.index] = sel_p
            x = x + a
            y = rms_norm(x)
            x = x + (torch.nn.functional.silu(y @ w.w1) * (y @ w.w3)) @ w.w2
        if not replay:
            self.tokens += list(ids.T)
        self.pos += ids.shape[1]
        return rms_norm(x) @ self.head

    def _attention(self, p: LayerPlan, w: LayerWeights, x, replay, sel, pool):
        cfg = self.cfg
        b, s, _ = x.shape
        qpos = torch.arange(self.pos, self.pos + s)  # absolute positions of the queries
        theta = self.theta[1] if p.ratio else self.theta[0]  # V4: compressed layers use compress_rope_theta throughout
        q = (x @ w.wq).view(b, s, cfg.heads, cfg.head_dim).transpose(1, 2)  # [B, H, S, D]
        q = apply_rope(rms_norm(q), qpos, cfg.rope_dim, theta)
        kv = apply_rope(rms_norm(x @ w.wkv, w.kv_norm), qpos, cfg.rope_dim, theta)  # [B, S, D]
        store = self.swa[p.index]
        prev = store.read()
        prev = prev.expand(b, -1, -1) if prev.shape[1] == 0 else prev
        kpos = torch.arange(self.pos - prev.shape[1], self.pos + s)  # positions of window keys
        keys = torch.cat([prev, store.append(kv)], 1)  # [B, M, D] (new keys as stored)
        ok = kpos[None, :] <= qpos[:, None]  # [S, M] causal
        if not self.dense:
            ok &= kpos[None, :] > qpos[:, None] - cfg.window
        extra = (keys[:, None], keys[:, None], ok)
        # compressed entries
        idx = torch.full((b, s, 0), -1, dtype=torch.long)
        ent = torch.zeros(b, 1, 0, cfg.head_dim)
        if not self.dense and p.ratio:
            src = p.source
            if p.stores and not replay:
                self.main[src].append(self.comp_state[src].append(x))
                if src in self.index:
                    self.index[src].append(self.icomp_state[src].append(x))
            ent = self.main[src].read()[:, None]  # [B, 1, N, D]
            n = ent.shape[2]
            valid = (torch.arange(n)[None, :] + 1) * p.ratio <= qpos[:, None] + 1  # [S, N] complete windows only
            valid = valid[None].expand(b, -1, -1)
            if p.mode == "reuse":
                idx = sel[src]
            elif p.indexed and n:
                qi = (x @ w.wq_idx).view(b, s, cfg.index_heads, cfg.index_dim)
                sc = index_scores(qi, x @ w.w_idx, self.index[src].read())  # [B, S, N]
                if cfg.candidate_blocks is not None and src == self.cand_src:
                    if p.index == src:  # the candidate source chooses each query's pool; its readers reuse it
                        cand = candidate_pool(sc.masked_fill(~valid, float("-inf")), cfg.candidate_blocks,
                                              cfg.candidate_block_size)  # [B, S, P]
                        pool = torch.zeros(b, s, n + 1, dtype=torch.bool)
                        pool.scatter_(2, torch.where(cand >= 0, cand, n), True)
                        pool = pool[..., :n]  # [B, S, N]
                    valid = valid & pool
                idx = select_topk(sc, min(cfg.index_topk, n), valid)
            elif n:  # HCA: every complete entry
                idx = torch.where(valid, torch.arange(n), -1)
        o = sparse_attention(q, ent, ent, idx, sinks=w.sinks, extra=extra)  # [B, H, S, D]
        o = apply_rope(o, qpos, cfg.rope_dim, theta, inverse=True)  # K=V carried RoPE: undo it on the output
        return o.transpose(1, 2).reshape(b, s, -1) @ w.wo, idx, pool

    @torch.no_grad()
    def prefill(self, ids: torch.Tensor) -> torch.Tensor:
        """Run a prompt from an empty cache; logits of its last token [B, vocab]."""
        self.reset()
        return self.forward(ids)[:, -1]

    @torch.no_grad()
    def decode(self, ids: torch.Tensor, steps: int | None = None) -> torch.Tensor:
        """Feed tokens one at a time (teacher forcing) ids [B, n]; logits after each [B, n, vocab]."""
        return torch.stack([self.forward(ids[:, i:i + 1])[:, -1] for i in range(ids.shape[1])], 1)

    # --- window offload and bounded replay ------------------------------------------------------------
    def flops_per_token(self) -> float:
        """Weight FLOPs of one token through the stack (2 per multiply-add; attention scores not counted)."""
        mats = [self.head] + [t for w in self.weights for t in (w.wq, w.wkv, w.wo, w.w1, w.w2, w.w3, w.wq_idx, w.w_idx)
                              if t is not None]
        mats += [c.w_kv for w in self.weights for c in (w.comp, w.index_comp) if c is not None]
        mats += [c.w_gate for w in self.weights for c in (w.comp, w.index_comp) if c is not None]
        return 2.0 * sum(m.numel() for m in mats)

    def offload_windows(self, now: float, ttl: float) -> WindowState:
        """Move every layer's window buffer to host memory with a TTL (seconds)."""
        st = WindowState(self.cfg.window, ttl, {str(i): s.state() for i, s in enumerate(self.swa)})
        st.offload(now)
        for s in self.swa:
            s.drop_state()
        self.window_state = st
        return st

    @torch.no_grad()
    def restore_windows(self, now: float) -> WindowState:
        """Bring the windows back; after the TTL, rebuild them by replaying the last `window` tokens."""
        st = self.window_state

        def replay():
            n = min(self.cfg.window, len(self.tokens))
            end = self.pos
            self.pos -= n
            for s in self.swa:
                s.clear()
            self.forward(torch.stack(self.tokens[-n:], 1), replay=True)
            assert self.pos == end
            return {str(i): s.state() for i, s in enumerate(self.swa)}, n, n * self.flops_per_token()

        tensors = st.fetch(now, replay)
        for i, s in enumerate(self.swa):
            s.load_state(tensors[str(i)])
        return st


@torch.no_grad()
def compare_decoding(cfg: StackConfig, prompt: int, steps: int, seed: int = 0, dense: bool = False,
                     reference: StackConfig | None = None) -> dict:
    """Prefill `prompt` random tokens then decode `steps` more (teacher forced) with the stack (compressed, or
    dense=True) and a dense reference (`reference`, default the same config: same weights); the mean KL of
    next-token distributions and the bytes each holds."""
    need_int("prompt", prompt)
    need_int("steps", steps)
    ids = torch.randint(0, cfg.vocab, (1, prompt + steps), generator=torch.Generator().manual_seed(seed))
    out = {}
    for name, c, d in (("sparse", cfg, dense), ("dense", reference or cfg, True)):
        s = Stack(c, d)
        first = s.prefill(ids[:, :prompt])
        out[name] = torch.cat([first[:, None], s.decode(ids[:, prompt:prompt + steps - 1])], 1)[0]  # [steps, V]
        out[f"{name}_bytes"] = s.cache_bytes()["total"]
    from .metrics import logits_kl
    return dict(kl=logits_kl(out["dense"], out["sparse"]), sparse_bytes=out["sparse_bytes"],
                dense_bytes=out["dense_bytes"],
                top1_agree=float((out["dense"].argmax(-1) == out["sparse"].argmax(-1)).float().mean()))


@torch.no_grad()
def replay_experiment(cfg: StackConfig, prompt: int, ttl: float, idle: float, seed: int = 0) -> dict:
    """Offload the windows after a prompt, come back after `idle` seconds: a hit restores them, a miss
    replays the last `window` tokens. Reports the replay cost and the next-token KL against no offload."""
    from .metrics import logits_kl
    ids = torch.randint(0, cfg.vocab, (1, prompt + 1), generator=torch.Generator().manual_seed(seed))
    ref = Stack(cfg)
    ref.prefill(ids[:, :prompt])
    want = ref.decode(ids[:, prompt:])[:, 0]
    s = Stack(cfg)
    s.prefill(ids[:, :prompt])
    s.offload_windows(0.0, ttl)
    st = s.restore_windows(idle)
    got = s.decode(ids[:, prompt:])[:, 0]
    return dict(miss=st.stats.misses == 1, replayed_tokens=st.stats.replayed_tokens, replay_flops=st.stats.replay_flops,
                prefill_flops=prompt * s.flops_per_token(), kl=logits_kl(want, got))
