"""A scaled-down DeepSeek V4 / V4.1-style model stack with random seeded weights, prefill and decode.

Each layer: RMSNorm -> attention -> residual -> RMSNorm -> SwiGLU MLP -> residual. Attention follows V4:
one shared K=V head (RMSNorm, RoPE on the trailing dims), a per-layer sliding window, compressed entries
(CSA / HCA / Full) read through an indexer top-k (or all of them, HCA), a per-head sink logit, and the
inverse RoPE on the output. Layer modes come from `sharing.scaled_plan`, so Reindex / Reuse layers read the
entries their Full source stored. `dense=True` builds the reference: the same weights attending to every
token's uncompressed K=V. Every cache is a kvlab.cache KV store in its format (packed bytes that attention
decodes on read), one sequence per stack. Not modelled: hyper-connections, MoE (a dense SwiGLU stands in), MTP,
q/o low-rank.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from ..checks import need_int
from ..cache.store import KVStore, vector_store
from ..models import load_model
from .checks import AttentionShapeError, SelectionError, need_dims
from .compress import Compressor, CompressorState
from .indexer import candidate_pool, index_scores, select_topk, sparse_attention
from .metrics import logits_kl
from .rope import apply_rope, rms_norm
from .sharing import LayerPlan, scaled_plan
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

    def __post_init__(self):
        for name in ("layers", "hidden", "heads", "head_dim", "index_heads", "index_dim", "window", "index_topk",
                     "candidate_block_size", "vocab"):
            setattr(self, name, need_int(name, getattr(self, name), 1, error=SelectionError))
        if self.candidate_blocks is not None:
            self.candidate_blocks = need_int("candidate_blocks", self.candidate_blocks, 1, error=SelectionError)
        self.rope_dim = need_int("rope_dim", self.rope_dim, 0, error=SelectionError)
        if not 0 <= self.rope_dim <= self.head_dim or self.rope_dim % 2:
            raise SelectionError(f"rope_dim must be even and at most head_dim ({self.head_dim}), got {self.rope_dim}")
        self.ratio_map = {r: need_int(f"ratio_map[{r}]", s, 1, error=SelectionError) for r, s in self.ratio_map.items()}
        bad = set(self.formats) - set(ROLES)
        if bad:
            raise SelectionError(f"formats names unknown roles {sorted(bad)}; roles are {', '.join(ROLES)}")

    def plan(self) -> list[LayerPlan]:
        return [LayerPlan(p.index, p.mode, self.ratio_map.get(p.ratio, p.ratio), p.source, p.indexed)
                for p in scaled_plan(self.model, self.layers)]


def _lin(g: torch.Generator, n_in: int, n_out: int) -> torch.Tensor:
    return torch.randn(n_in, n_out, generator=g) / math.sqrt(n_in)  # [n_in, n_out]


@dataclass
class IndexerWeights:
    """A layer's lightning indexer: its query projection and per-head score weights."""

    wq: torch.Tensor  # [hidden, H_I * D_I] index queries
    w_heads: torch.Tensor  # [hidden, H_I] per-head weights of the score


@dataclass
class LayerWeights:
    """Weights of one layer (random, seeded); a matrix w is applied as x @ w."""

    wq: torch.Tensor  # [hidden, H * D] queries
    wkv: torch.Tensor  # [hidden, D] the shared K=V entry (window and dense keys)
    kv_norm: torch.Tensor  # [D] RMSNorm weight of the K=V entry
    sinks: torch.Tensor  # [H] per-head sink logits
    wo: torch.Tensor  # [H * D, hidden] output projection
    w1: torch.Tensor  # [hidden, 2 hidden] SwiGLU gate
    w3: torch.Tensor  # [hidden, 2 hidden] SwiGLU up
    w2: torch.Tensor  # [2 hidden, hidden] SwiGLU down
    compressor: Compressor | None = None  # main-entry compressor (layers that store entries)
    index_compressor: Compressor | None = None  # index-key compressor (indexed layers that store entries)
    indexer: IndexerWeights | None = None  # the layer's own indexer (csa, full, reindex layers)

    @classmethod
    def random(cls, cfg: StackConfig, p: LayerPlan, g: torch.Generator, compress_theta: float) -> LayerWeights:
        """Seeded weights for layer plan `p`: matrices from `g` (in a fixed order), compressors from their own
        seeds (cfg.seed * 1000 + 2 * layer + 1 and + 2)."""
        h, H, D = cfg.hidden, cfg.heads, cfg.head_dim
        stores = p.stores and p.ratio > 0
        seed = cfg.seed * 1000 + 2 * p.index
        compressor = Compressor.random(h, D, p.ratio, p.mode in ("csa", "full"), cfg.rope_dim, seed=seed + 1,
                                       rope_theta=compress_theta) if stores else None
        index_compressor = Compressor.random(h, cfg.index_dim, p.ratio, True, 0, seed=seed + 2) \
            if stores and p.indexed else None
        wq, wkv = _lin(g, h, H * D), _lin(g, h, D)
        kv_norm, sinks = 1 + 0.1 * torch.randn(D, generator=g), torch.randn(H, generator=g)  # [D], [H]
        wo, w1, w3, w2 = _lin(g, H * D, h), _lin(g, h, 2 * h), _lin(g, h, 2 * h), _lin(g, 2 * h, h)
        indexer = IndexerWeights(wq=_lin(g, h, cfg.index_heads * cfg.index_dim),
                                 w_heads=_lin(g, h, cfg.index_heads)) if p.indexed else None
        return cls(wq=wq, wkv=wkv, kv_norm=kv_norm, sinks=sinks, wo=wo, w1=w1, w3=w3, w2=w2, compressor=compressor,
                   index_compressor=index_compressor, indexer=indexer)

    def matrices(self) -> list[torch.Tensor]:
        """Every weight matrix a token goes through (for FLOPs): projections, MLP, indexer, compressors."""
        out = [self.wq, self.wkv, self.wo, self.w1, self.w2, self.w3]
        if self.indexer is not None:
            out += [self.indexer.wq, self.indexer.w_heads]
        for c in (self.compressor, self.index_compressor):
            if c is not None:
                out += [c.w_kv, c.w_gate]
        return out


def _append(store: KVStore, x: torch.Tensor) -> torch.Tensor:
    """Append one sequence's vectors x [1, n, d] to a store (which holds [n, 1, d]); returns them as stored."""
    return store.append(x.transpose(0, 1)).transpose(0, 1)  # [n, 1, d] in the store -> [1, n, d]


def _read(store: KVStore) -> torch.Tensor:
    """What a store holds for the one sequence: [1, N, d] float32."""
    return store.read().transpose(0, 1)  # [N, 1, d] -> [1, N, d]


@dataclass
class _Step:
    """What one forward call has chosen so far, for the layers after: selections and the candidate pool."""

    qpos: torch.Tensor  # [S] absolute positions of the queries
    selection: dict[int, torch.Tensor] = field(default_factory=dict)  # layer -> its selection [1, S, k]
    pool: torch.Tensor | None = None  # [1, S, N] candidate pool of each query (capped V4.1 layers)


class Stack:
    """The model: weights, per-layer caches (kvlab.cache stores), prefill / decode, window offload with
    bounded replay. One sequence at a time (batch 1)."""

    def __init__(self, cfg: StackConfig, dense: bool = False):
        self.cfg, self.dense = cfg, dense
        self.plan = cfg.plan()
        self.spec = load_model(cfg.model)
        c = self.spec.config
        self.theta = (float(c.get("rope_theta", 10000.0)), float(c.get("compress_rope_theta", 160000.0)))  # main, compress
        g = torch.Generator().manual_seed(cfg.seed)
        self.embed = torch.randn(cfg.vocab, cfg.hidden, generator=g)  # [vocab, hidden]
        self.head = _lin(g, cfg.hidden, cfg.vocab)  # [hidden, vocab]
        self.weights = [LayerWeights.random(cfg, p, g, self.theta[1]) for p in self.plan]
        self.cand_src = self._candidate_source()
        self.reset()

    def _candidate_source(self) -> int | None:
        """The layer whose indexer chooses the capped candidate pool (V4.1: candidate_source_layer_id, a Full
        layer of the decoder half; here the first storing, indexed layer of that layer's scaled ratio). The
        layers reading its entries select within that pool."""
        real = self.spec.config.get("candidate_source_layer_id")
        ratio = None if real is None else self.cfg.ratio_map.get(self.spec.compress_ratios[real],
                                                                 self.spec.compress_ratios[real])
        return next((p.index for p in self.plan if p.stores and p.indexed and p.ratio
                     and (ratio is None or p.ratio == ratio)), None)

    # --- state ------------------------------------------------------------------------------
    def reset(self) -> None:
        """Empty caches: a window store per layer (dense: every token's K=V), and compressed entries and index
        keys for the layers that store them, each in its format (StackConfig.formats)."""
        cfg, f = self.cfg, self.cfg.formats
        self.pos = 0  # tokens processed
        self.tokens: list[torch.Tensor] = []  # token ids seen ([1] each), for replay
        if self.dense:
            self.swa = [vector_store(cfg.head_dim, f.get("kv", "bf16"), "kv") for _ in self.plan]
        else:
            self.swa = [vector_store(cfg.head_dim, f.get("swa", "bf16"), "swa", window=cfg.window) for _ in self.plan]
        storing = [p for p in self.plan if p.stores and p.ratio and not self.dense]
        self.main = {p.index: vector_store(cfg.head_dim, f.get("main", "bf16"), "main") for p in storing}
        self.index = {p.index: vector_store(cfg.index_dim, f.get("index", "bf16"), "index") for p in storing
                      if p.indexed}
        self.comp_state = {i: CompressorState(self.weights[i].compressor) for i in self.main}
        self.icomp_state = {i: CompressorState(self.weights[i].index_compressor) for i in self.index}
        self.window_state: WindowState | None = None

    def cache_bytes(self) -> dict[str, int]:
        """Bytes each kind of cached state holds now (the stores' packed tensors)."""
        out = {"window": sum(s.held_bytes for s in self.swa), "main": sum(s.held_bytes for s in self.main.values()),
               "index": sum(s.held_bytes for s in self.index.values())}
        out["total"] = sum(out.values())
        return out

    # --- forward ----------------------------------------------------------------------------
    def forward(self, ids: torch.Tensor, replay: bool = False) -> torch.Tensor:
        """Process new tokens ids [1, S] after the cached ones; returns logits [1, S, vocab]. `replay` rebuilds
        the windows only (compressed entries and token history are not appended again)."""
        need_dims("token ids", ids, 2, "[B, S]")
        if ids.shape[0] != 1:
            raise AttentionShapeError(f"the stack runs one sequence (its caches hold one); got batch {ids.shape[0]}")
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= self.cfg.vocab):
            raise SelectionError(f"token ids must lie in [0, {self.cfg.vocab})")
        x = self.embed[ids]  # [1, S, hidden]
        step = _Step(torch.arange(self.pos, self.pos + ids.shape[1]))
        for p, w in zip(self.plan, self.weights):
            x = x + self._attention(p, w, rms_norm(x), replay, step)
            x = x + self._mlp(w, rms_norm(x))
        if not replay:
            self.tokens += list(ids.T)
        self.pos += ids.shape[1]
        return rms_norm(x) @ self.head  # [1, S, vocab]

    @staticmethod
    def _mlp(w: LayerWeights, y: torch.Tensor) -> torch.Tensor:
        """SwiGLU (a dense stand-in for V4's MoE): [1, S, hidden]."""
        return (torch.nn.functional.silu(y @ w.w1) * (y @ w.w3)) @ w.w2  # [1, S, 2 hidden] -> [1, S, hidden]

    def _attention(self, p: LayerPlan, w: LayerWeights, x: torch.Tensor, replay: bool, step: _Step) -> torch.Tensor:
        """One layer's attention over its window and the compressed entries it reads: [1, S, hidden]."""
        cfg = self.cfg
        b, s, _ = x.shape
        theta = self.theta[1] if p.ratio else self.theta[0]  # V4: compressed layers use compress_rope_theta throughout
        q = (x @ w.wq).view(b, s, cfg.heads, cfg.head_dim).transpose(1, 2)  # [1, H, S, D]
        q = apply_rope(rms_norm(q), step.qpos, cfg.rope_dim, theta)
        kv = apply_rope(rms_norm(x @ w.wkv, w.kv_norm), step.qpos, cfg.rope_dim, theta)  # [1, S, D]
        window = self._window(p, kv, step.qpos)
        entries, idx = self._entries(p, w, x, replay, step)  # [1, 1, N, D], [1, S, k]
        step.selection[p.index] = idx
        o = sparse_attention(q, entries, entries, idx, sinks=w.sinks, extra=window)  # [1, H, S, D]
        o = apply_rope(o, step.qpos, cfg.rope_dim, theta, inverse=True)  # K=V carried RoPE: undo it on the output
        return o.transpose(1, 2).reshape(b, s, -1) @ w.wo  # [1, S, H * D] -> [1, S, hidden]

    def _window(self, p: LayerPlan, kv: torch.Tensor, qpos: torch.Tensor):
        """Sliding window (dense: every token): append the new K=V entries kv [1, S, D] to the layer's store and
        return (keys, values [1, 1, M, D], mask [S, M]) over the held and new entries."""
        store = self.swa[p.index]
        prev = _read(store)  # [1, M - S, D] held before this call
        keys = torch.cat([prev, _append(store, kv)], 1)[:, None]  # [1, 1, M, D] (new keys as stored)
        kpos = torch.arange(self.pos - prev.shape[1], self.pos + kv.shape[1])  # [M] positions of the keys
        ok = kpos[None, :] <= qpos[:, None]  # [S, M] causal
        if not self.dense:
            ok &= kpos[None, :] > qpos[:, None] - self.cfg.window
        return keys, keys, ok

    def _entries(self, p: LayerPlan, w: LayerWeights, x: torch.Tensor, replay: bool, step: _Step):
        """Compressed entries the layer reads [1, 1, N, D] and each query's selection of them [1, S, k]
        (-1 = none): the source's selection (Reuse), the indexer's top-k (CSA / Full / Reindex), or every
        complete entry (HCA). Storing layers first compress x [1, S, hidden] into their stores."""
        s = x.shape[1]
        none = torch.full((1, s, 0), -1, dtype=torch.long)  # [1, S, 0]
        if self.dense or not p.ratio:
            return torch.zeros(1, 1, 0, self.cfg.head_dim), none
        src = p.source
        if p.stores and not replay:
            self._compress(src, x)
        ent = _read(self.main[src])[:, None]  # [1, 1, N, D]
        n = ent.shape[2]
        complete = ((torch.arange(n)[None, :] + 1) * p.ratio <= step.qpos[:, None] + 1)[None]  # [1, S, N] closed
        if p.mode == "reuse":
            return ent, step.selection[src]
        if p.indexed and n:
            return ent, self._indexer_topk(p, w, x, complete, step)
        if n:  # HCA: every complete entry
            return ent, torch.where(complete, torch.arange(n), -1)  # [1, S, N]
        return ent, none

    def _compress(self, layer: int, x: torch.Tensor) -> None:
        """Feed x [1, S, hidden] to the layer's compressors; the entries they close join its stores."""
        _append(self.main[layer], self.comp_state[layer].append(x))  # [1, n, D] closed entries
        if layer in self.index:
            _append(self.index[layer], self.icomp_state[layer].append(x))  # [1, n, D_I] index keys

    def _indexer_topk(self, p: LayerPlan, w: LayerWeights, x: torch.Tensor, complete: torch.Tensor,
                      step: _Step) -> torch.Tensor:
        """The layer's indexer scores the source's index keys; each query keeps its top-k complete entries,
        within the candidate pool when the pool is capped: [1, S, k]."""
        cfg, s = self.cfg, x.shape[1]
        qi = (x @ w.indexer.wq).view(1, s, cfg.index_heads, cfg.index_dim)  # [1, S, H_I, D_I]
        sc = index_scores(qi, x @ w.indexer.w_heads, _read(self.index[p.source]))  # [1, S, N]
        allowed = complete  # [1, S, N]
        if cfg.candidate_blocks is not None and p.source == self.cand_src:
            if p.index == p.source:  # the candidate source chooses each query's pool; its readers reuse it
                step.pool = self._candidate_pool(sc, complete)
            allowed = allowed & step.pool
        return select_topk(sc, min(cfg.index_topk, sc.shape[-1]), allowed)

    def _candidate_pool(self, scores: torch.Tensor, complete: torch.Tensor) -> torch.Tensor:
        """The capped candidate pool: the best `candidate_blocks` blocks of complete entries per query, as a
        mask [1, S, N]."""
        n = scores.shape[-1]
        cand = candidate_pool(scores.masked_fill(~complete, float("-inf")), self.cfg.candidate_blocks,
                              self.cfg.candidate_block_size)  # [1, S, P] positions, -1 pads
        pool = torch.zeros(*scores.shape[:-1], n + 1, dtype=torch.bool)  # [1, S, N + 1]: slot N takes the -1s
        pool.scatter_(2, torch.where(cand >= 0, cand, n), True)  # mark each candidate position
        return pool[..., :n]  # [1, S, N]

    @torch.no_grad()
    def prefill(self, ids: torch.Tensor) -> torch.Tensor:
        """Run a prompt ids [1, S] from an empty cache; logits of its last token [1, vocab]."""
        self.reset()
        return self.forward(ids)[:, -1]

    @torch.no_grad()
    def decode(self, ids: torch.Tensor) -> torch.Tensor:
        """Feed tokens ids [1, n] one at a time (teacher forcing); logits after each [1, n, vocab]."""
        return torch.stack([self.forward(ids[:, i:i + 1])[:, -1] for i in range(ids.shape[1])], 1)  # [1, n, vocab]

    def flops_per_token(self) -> float:
        """Weight FLOPs of one token through the stack (2 per multiply-add; attention scores not counted)."""
        return 2.0 * (self.head.numel() + sum(m.numel() for w in self.weights for m in w.matrices()))

    # --- window offload and bounded replay ------------------------------------------------------------
    def offload_windows(self, now: float, ttl: float) -> WindowState:
        """Move every layer's window pages to host memory with a TTL (seconds)."""
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
                s.reset()
            self.forward(torch.stack(self.tokens[-n:], 1), replay=True)  # ids [1, n]
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
    prompt = need_int("prompt", prompt, 1, error=SelectionError)
    steps = need_int("steps", steps, 1, error=SelectionError)
    ids = torch.randint(0, cfg.vocab, (1, prompt + steps), generator=torch.Generator().manual_seed(seed))  # [1, T]
    out = {}
    for name, c, d in (("sparse", cfg, dense), ("dense", reference or cfg, True)):
        s = Stack(c, d)
        first = s.prefill(ids[:, :prompt])
        rest = ids[:, prompt:prompt + steps - 1]  # teacher-forced inputs after the first step (none when steps = 1)
        out[name] = torch.cat([first[:, None]] + ([s.decode(rest)] if rest.shape[1] else []), 1)[0]  # [steps, V]
        out[f"{name}_bytes"] = s.cache_bytes()["total"]
    return dict(kl=logits_kl(out["dense"], out["sparse"]), sparse_bytes=out["sparse_bytes"],
                dense_bytes=out["dense_bytes"],
                top1_agree=float((out["dense"].argmax(-1) == out["sparse"].argmax(-1)).float().mean()))


@torch.no_grad()
def replay_experiment(cfg: StackConfig, prompt: int, ttl: float, idle: float, seed: int = 0) -> dict:
    """Offload the windows after a prompt, come back after `idle` seconds: a hit restores them, a miss
    replays the last `window` tokens. Reports the replay cost and the next-token KL against no offload."""
    prompt = need_int("prompt", prompt, 1, error=SelectionError)
    ids = torch.randint(0, cfg.vocab, (1, prompt + 1), generator=torch.Generator().manual_seed(seed))  # [1, T + 1]
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
