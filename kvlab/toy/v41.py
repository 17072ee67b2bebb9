"""kvlab's DeepSeek V4.1-like model, trainable, as a transformers model (model_type "kvlab_v41").

The same model as kvlab.attention's `Stack` (one shared K=V head with RoPE on its trailing channels, a sliding
window, a per-head sink, learned gated-pooling compressors, a lightning indexer with top-k, the V4.1 capped
candidate pool, Full / Reindex / Reuse layers, a dense SwiGLU in place of MoE), written as a batched,
differentiable torch module: each layer's parameters are viewed as the Stack's `LayerWeights` (compressors as
`Compressor`, the indexer as `IndexerWeights`) and run through kvlab.attention's functions (`Compressor.__call__`
/ `gated_pool`, `index_scores`, `candidate_pool`, `select_topk`, `sparse_attention`, `apply_rope`, `rms_norm`).
The layer modes come from the config through kvlab.layout and kvlab.attention.sharing.model_plan, exactly as
`kvlab bytes` lays the checkpoint out. `to_stack` hands the trained weights to a `Stack`, whose packed
kvlab.cache stores give cached prefill / decode in any KV format and the bytes they hold.

The indexer is trained with an auxiliary loss, as DeepSeek trains its lightning indexer (DeepSeek-V3.2-Exp
technical report, github.com/deepseek-ai/DeepSeek-V3.2-Exp, "DeepSeek_V3_2.pdf", section 2.1): the KL divergence
from the main attention's distribution over the compressed entries (softmax per head, summed over heads,
normalised; a detached target) to the softmax of the index scores, with the indexer's input detached so that
the indexer learns only from this loss and the model only from the language-modelling loss. DeepSeek warms the
indexer up densely and then restricts the KL to the selected entries; at these sizes the dense target over every
complete entry is cheap, so it is used throughout, while attention itself is sparse (top-k) from the first step.
Weight: `indexer_loss_weight`; the model returns it as `aux_loss`.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM, GenerationMixin, PreTrainedConfig, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

from ..attention.compress import Compressor
from ..attention.indexer import candidate_pool, index_scores, select_topk, sparse_attention
from ..attention.rope import apply_rope, rms_norm
from ..attention.sharing import LayerPlan, model_plan
from ..attention.stack import IndexerWeights, LayerWeights, Stack, StackConfig
from ..errors import ConfigError
from ..models import ModelSpec, spec_from_config
from .sizes import get_size


class KvlabV41Config(PreTrainedConfig):
    """Config of the V4.1-like model: the fields kvlab.models reads for a DeepSeek V4.1 config (so kvlab.layout
    lays a checkpoint out as it lays out DeepSeek V4.1-Flash), plus the MLP width and the indexer loss weight."""

    model_type = "kvlab_v41"
    vocab_size: int = 256  # tokens (bytes)
    hidden_size: int = 128  # model width
    intermediate_size: int = 256  # SwiGLU hidden width (a dense stand-in for V4's MoE)
    num_hidden_layers: int = 6  # decoder layers
    num_attention_heads: int = 4  # query heads
    num_key_value_heads: int = 1  # one shared K=V head (V4)
    head_dim: int = 64  # width of a K=V entry (NoPE + RoPE)
    qk_rope_head_dim: int = 16  # trailing RoPE channels of an entry
    index_n_heads: int = 4  # indexer query heads
    index_head_dim: int = 32  # indexer key width
    index_topk: int = 16  # entries each query attends to (besides its window)
    sliding_window: int = 64  # window of uncompressed K=V every layer keeps
    compress_ratios: list[int] | None = None  # per layer: 0 = window only, m = tokens per entry
    kv_source_layer_ids: list[int] | None = None  # Full layers: compute and store entries
    index_source_layer_ids: list[int] | None = None  # layers with their own indexer (Full and Reindex)
    candidate_source_layer_id: int | None = None  # the layer whose indexer picks the capped candidate pool
    candidate_topk_blocks: int | None = None  # blocks in the pool (None: no cap)
    candidate_block_size: int = 8  # entries per block
    rope_theta: float = 10000.0  # RoPE base of window-only layers
    compress_rope_theta: float = 160000.0  # RoPE base of layers that read entries (V4)
    max_position_embeddings: int = 2048  # longest context trained for (documentation; RoPE has no table)
    indexer_loss_weight: float = 1.0  # weight of the indexer's KL loss in `aux_loss`
    initializer_range: float = 0.02  # std of the normal initialisation of matrices
    tie_word_embeddings: bool = False  # the Stack has separate embedding and head matrices

    def __post_init__(self, **kwargs):
        if self.compress_ratios is None:  # the 6-layer default: every V4.1 layer mode once
            self.compress_ratios, self.kv_source_layer_ids, self.index_source_layer_ids = v41_pattern(
                self.num_hidden_layers)
            if self.candidate_source_layer_id is None:
                self.candidate_source_layer_id = self.num_hidden_layers // 2
        super().__post_init__(**kwargs)

    def spec(self) -> ModelSpec:
        """The kvlab.models spec of this config (what `kvlab bytes` reads from the saved config.json)."""
        d = self.to_dict()
        d.setdefault("torch_dtype", str(self.dtype or "float32").replace("torch.", ""))
        return spec_from_config(d, self.name_or_path or "kvlab-v41")


def v41_pattern(layers: int) -> tuple[list[int], list[int], list[int]]:
    """(compress_ratios, kv_source_layer_ids, index_source_layer_ids) of a `layers`-deep V4.1-like stack, after
    DeepSeek V4.1-Flash's config (compress_ratios 0 x2, 2 x18, 1 x20; KV sources every 6 layers in the ratio-2
    half, one in the ratio-1 half; Reindex layers every 4 after it): one window-only layer per 20, then a ratio-2
    half with a Full layer every 6 (its other layers Reuse), then a ratio-1 half led by a Full layer (the candidate
    source) whose later layers alternate Reindex and Reuse. 6 layers: [0, 2, 2, 1, 1, 1], Full 1 and 3, Reindex 4."""
    if layers < 4:
        raise ConfigError(f"a V4.1-like stack needs at least 4 layers (window, ratio 2, ratio 1 halves); got {layers}")
    n_swa = max(1, round(layers / 20))
    half = layers // 2
    ratios = [0] * n_swa + [2] * (half - n_swa) + [1] * (layers - half)
    sources = list(range(n_swa, half, 6)) + [half]
    reindex = list(range(half + 1, layers, 2))
    return ratios, sources, sorted(sources + reindex)


class V41Layer(nn.Module):
    """One decoder layer's parameters; `weights()` views them as the Stack's LayerWeights (x @ w convention)."""

    def __init__(self, cfg: KvlabV41Config, plan: LayerPlan):
        super().__init__()
        h, heads, d, inter = cfg.hidden_size, cfg.num_attention_heads, cfg.head_dim, cfg.intermediate_size
        self.plan = plan
        self.wq = nn.Parameter(torch.empty(h, heads * d))  # [hidden, H * D]
        self.wkv = nn.Parameter(torch.empty(h, d))  # [hidden, D] the shared K=V entry
        self.kv_norm = nn.Parameter(torch.ones(d))  # [D]
        self.sinks = nn.Parameter(torch.zeros(heads))  # [H] per-head sink logits
        self.wo = nn.Parameter(torch.empty(heads * d, h))  # [H * D, hidden]
        self.w1 = nn.Parameter(torch.empty(h, inter))  # [hidden, I] SwiGLU gate
        self.w3 = nn.Parameter(torch.empty(h, inter))  # [hidden, I] SwiGLU up
        self.w2 = nn.Parameter(torch.empty(inter, h))  # [I, hidden] SwiGLU down
        stores = plan.stores and plan.ratio > 0
        overlap = plan.mode in ("csa", "full")
        self.compressor = _CompressorParams(h, d, plan.ratio, overlap) if stores else None
        self.index_compressor = _CompressorParams(h, cfg.index_head_dim, plan.ratio, True) \
            if stores and plan.indexed else None
        if plan.indexed:
            self.idx_wq = nn.Parameter(torch.empty(h, cfg.index_n_heads * cfg.index_head_dim))  # [hidden, H_I * D_I]
            self.idx_w = nn.Parameter(torch.empty(h, cfg.index_n_heads))  # [hidden, H_I]

    def weights(self, cfg: KvlabV41Config) -> LayerWeights:
        """The layer as kvlab.attention.stack.LayerWeights (tensors shared, not copied)."""
        theta = cfg.compress_rope_theta
        return LayerWeights(
            wq=self.wq, wkv=self.wkv, kv_norm=self.kv_norm, sinks=self.sinks, wo=self.wo, w1=self.w1, w3=self.w3,
            w2=self.w2,
            compressor=self.compressor.compressor(cfg.qk_rope_head_dim, theta) if self.compressor else None,
            index_compressor=self.index_compressor.compressor(0, theta) if self.index_compressor else None,
            indexer=IndexerWeights(wq=self.idx_wq, w_heads=self.idx_w) if self.plan.indexed else None)


class _CompressorParams(nn.Module):
    """A compressor's parameters (kvlab.attention.compress.Compressor holds them as plain tensors)."""

    def __init__(self, hidden: int, dim: int, ratio: int, overlap: bool):
        super().__init__()
        width = dim * (2 if overlap else 1)
        self.ratio, self.dim, self.overlap = ratio, dim, overlap
        self.w_kv = nn.Parameter(torch.empty(hidden, width))  # [hidden, width]
        self.w_gate = nn.Parameter(torch.empty(hidden, width))  # [hidden, width]
        self.bias = nn.Parameter(torch.zeros(ratio, width))  # [m, width] per-slot gate bias
        self.norm = nn.Parameter(torch.ones(dim))  # [d] RMSNorm of each pooled entry

    def compressor(self, rope_dim: int, rope_theta: float) -> Compressor:
        return Compressor(ratio=self.ratio, dim=self.dim, overlap=self.overlap, w_kv=self.w_kv, w_gate=self.w_gate,
                          bias=self.bias, norm=self.norm, rope_dim=rope_dim, rope_theta=rope_theta)


@dataclass
class _Pass:
    """What one forward pass has computed so far, for the layers after (the Stack's `_Step`, batched)."""

    qpos: torch.Tensor  # [S] positions
    entries: dict  # storing layer -> its entries [B, N, D]
    index_keys: dict  # storing layer -> its index keys [B, N, D_I]
    selection: dict  # layer -> its selection [B, S, k]
    pool: torch.Tensor | None = None  # [B, S, N] candidate pool (capped readers of the candidate source)


class KvlabV41PreTrainedModel(PreTrainedModel):
    config_class = KvlabV41Config
    base_model_prefix = "model"
    _no_split_modules = ["V41Layer"]
    _supports_sdpa = False
    _supports_flash_attn = False

    @torch.no_grad()
    def _init_weights(self, module):
        std = self.config.initializer_range
        if isinstance(module, (V41Layer, _CompressorParams, KvlabV41ForCausalLM)):
            for name, p in module.named_parameters(recurse=False):
                if p.dim() == 2 and name != "bias":
                    nn.init.normal_(p, std=std)
                elif name in ("kv_norm", "norm"):
                    nn.init.ones_(p)
                else:
                    nn.init.zeros_(p)


class KvlabV41ForCausalLM(KvlabV41PreTrainedModel, GenerationMixin):
    """The V4.1-like causal LM. forward(input_ids [B, S]) -> logits [B, S, vocab] and, in training mode,
    `aux_loss` (the indexers' weighted KL; None in eval mode). No KV cache inside transformers: `generate` recomputes the
    prefix (use_cache=False); cached decoding runs through `to_stack()`."""

    def __init__(self, config: KvlabV41Config):
        super().__init__(config)
        self.plan = plan_of(config)
        self.embed = nn.Parameter(torch.empty(config.vocab_size, config.hidden_size))  # [vocab, hidden]
        self.head = nn.Parameter(torch.empty(config.hidden_size, config.vocab_size))  # [hidden, vocab]
        self.layers = nn.ModuleList(V41Layer(config, p) for p in self.plan)
        self.cand_src = _candidate_source(config, self.plan)
        self.post_init()

    def get_input_embeddings(self):
        return None

    def forward(self, input_ids: torch.Tensor, attention_mask=None, labels=None, use_cache=None, **kwargs):
        if self.embed.dtype != torch.float32:
            # low-precision weights (BF16): kvlab.attention's reference algorithms compute in float32, so this runs
            # a float32 copy holding the weights' own (BF16-exact) values, as the Stack does; logits in float32
            import copy
            twin = copy.deepcopy(self).float()
            twin.train(self.training)
            return twin.forward(input_ids, attention_mask, labels, use_cache, **kwargs)
        cfg = self.config
        b, s = input_ids.shape
        x = F.embedding(input_ids, self.embed)  # [B, S, hidden]
        state = _Pass(torch.arange(s, device=input_ids.device), {}, {}, {})
        aux = []
        for p, layer in zip(self.plan, self.layers):
            w = layer.weights(cfg)
            a, kl = self._attention(p, w, rms_norm(x), state)
            x = x + a
            y = rms_norm(x)
            x = x + (F.silu(y @ w.w1) * (y @ w.w3)) @ w.w2  # SwiGLU [B, S, hidden]
            if kl is not None:
                aux.append(kl)
        logits = rms_norm(x) @ self.head  # [B, S, vocab]
        aux_loss = cfg.indexer_loss_weight * torch.stack(aux).mean() if aux else None
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten(), ignore_index=-100)
        out = CausalLMOutputWithPast(loss=loss, logits=logits)
        out["aux_loss"] = aux_loss
        return out

    def _attention(self, p: LayerPlan, w: LayerWeights, x: torch.Tensor, st: _Pass):
        """One layer's attention over its window and its selected entries: ([B, S, hidden], indexer KL or None)."""
        cfg = self.config
        b, s, _ = x.shape
        heads, d, r = cfg.num_attention_heads, cfg.head_dim, cfg.qk_rope_head_dim
        theta = cfg.compress_rope_theta if p.ratio else cfg.rope_theta  # V4: compressed layers use compress_rope_theta
        q = (x @ w.wq).view(b, s, heads, d).transpose(1, 2)  # [B, H, S, D]
        q = apply_rope(rms_norm(q), st.qpos, r, theta)
        kv = apply_rope(rms_norm(x @ w.wkv, w.kv_norm), st.qpos, r, theta)  # [B, S, D]
        ent, idx, kl = self._entries(p, w, x, q, st)  # [B, N, D], [B, S, k]
        st.selection[p.index] = idx
        o = windowed_sparse_attention(q, ent, idx, w.sinks, kv, st.qpos, cfg.sliding_window)  # [B, H, S, D] float32
        o = o.to(q.dtype)  # back to the model's dtype (BF16 weights compute in BF16 around the attention)
        o = apply_rope(o, st.qpos, r, theta, inverse=True)  # K=V carried RoPE: undo it on the output
        return o.transpose(1, 2).reshape(b, s, -1) @ w.wo, kl  # [B, S, hidden]

    def _entries(self, p: LayerPlan, w: LayerWeights, x: torch.Tensor, q: torch.Tensor, st: _Pass):
        """Entries the layer reads [B, N, D], each query's selection [B, S, k] (-1 = none) and the indexer KL."""
        cfg = self.config
        b, s, _ = x.shape
        none = torch.full((b, s, 0), -1, dtype=torch.long, device=x.device)
        if not p.ratio:
            return x.new_zeros(b, 0, cfg.head_dim), none, None
        if p.stores:
            st.entries[p.index] = w.compressor(x)  # [B, S // m, D] complete windows
            if w.index_compressor is not None:
                st.index_keys[p.index] = w.index_compressor(x.detach())  # [B, S // m, D_I]: trained by the KL only
        ent = st.entries[p.source]
        n = ent.shape[1]
        complete = ((torch.arange(n, device=x.device)[None, :] + 1) * p.ratio <= st.qpos[:, None] + 1)  # [S, N]
        complete = complete[None].expand(b, -1, -1)  # [B, S, N]
        if p.mode == "reuse":
            return ent, st.selection[p.source], None
        if not n:
            return ent, none, None
        if not p.indexed:  # HCA: every complete entry
            return ent, torch.where(complete, torch.arange(n, device=x.device), -1), None
        xd = x.detach()
        qi = (xd @ w.indexer.wq).view(b, s, cfg.index_n_heads, cfg.index_head_dim)  # [B, S, H_I, D_I]
        sc = index_scores(qi, xd @ w.indexer.w_heads, st.index_keys[p.source])  # [B, S, N]
        allowed = complete
        if cfg.candidate_topk_blocks is not None and p.source == self.cand_src:
            if p.index == p.source:  # the candidate source picks each query's pool; its readers select within it
                cand = candidate_pool(sc.detach().masked_fill(~complete, float("-inf")), cfg.candidate_topk_blocks,
                                      cfg.candidate_block_size)  # [B, S, P] positions, -1 pads
                pool = torch.zeros(b, s, n + 1, dtype=torch.bool, device=x.device)  # slot N takes the -1s
                st.pool = pool.scatter_(2, torch.where(cand >= 0, cand, n), True)[..., :n]  # [B, S, N]
            allowed = allowed & st.pool
        idx = select_topk(sc.detach(), min(cfg.index_topk, n), allowed)  # [B, S, k]
        return ent, idx, _indexer_kl(q, ent, sc, complete) if self.training else None


def windowed_sparse_attention(q: torch.Tensor, ent: torch.Tensor, idx: torch.Tensor, sinks: torch.Tensor,
                              kv: torch.Tensor, qpos: torch.Tensor, window: int) -> torch.Tensor:
    """kvlab.attention's `sparse_attention` of q [B, H, S, D] over the selected entries ent [B, N, D] (idx [B, S, k])
    and the sliding window of K=V kv [B, S, D], one block of `window` queries at a time so that each block scores
    only the 2 * window - 1 keys its window can reach (not all S): [B, H, S, D]."""
    s = q.shape[2]
    e1 = ent[:, None]  # [B, 1, N, D]: one object as keys and values, so sparse_attention gathers it once
    out = []
    for a in range(0, s, window):
        e, k0 = min(a + window, s), max(0, a - window + 1)
        kpos, qp = qpos[k0:e], qpos[a:e]
        ok = (kpos[None, :] <= qp[:, None]) & (kpos[None, :] > qp[:, None] - window)  # [S_b, M_b] causal window
        kb = kv[:, None, k0:e]  # [B, 1, M_b, D]
        out.append(sparse_attention(q[:, :, a:e], e1, e1, idx[:, a:e], sinks=sinks,
                                    extra=(kb, kb, ok)))  # [B, H, S_b, D]
    return torch.cat(out, 2)


def _indexer_kl(q: torch.Tensor, ent: torch.Tensor, scores: torch.Tensor, complete: torch.Tensor) -> torch.Tensor:
    """Mean over queries (with at least one complete entry) of KL(p || softmax(scores)), p the main attention's
    distribution over the complete entries (per-head softmax, averaged over heads; detached)."""
    d = q.shape[-1]
    logits = torch.einsum("bhsd,bnd->bhsn", q.detach().float() / d ** 0.5, ent.detach().float())  # [B, H, S, N]
    target = logits.masked_fill_(~complete[:, None], float("-inf")).softmax(-1).mean(1).nan_to_num_(0.0)  # [B, S, N]
    logq = scores.masked_fill(~complete, float("-inf")).log_softmax(-1)  # [B, S, N]
    terms = torch.where(complete & (target > 0), target * (target.clamp_min(1e-30).log() - logq), 0.0)
    rows = complete.any(-1)  # [B, S] queries with something to select
    return terms.sum(-1)[rows].mean() if rows.any() else scores.sum() * 0.0


def plan_of(config: KvlabV41Config) -> list[LayerPlan]:
    """Layer modes from the config, through kvlab.layout (what `kvlab bytes` uses)."""
    return model_plan(config.spec())


def _candidate_source(config: KvlabV41Config, plan: list[LayerPlan]) -> int | None:
    """The candidate source layer, chosen as the Stack chooses it (the first storing, indexed layer of the
    ratio of `candidate_source_layer_id`)."""
    real = config.candidate_source_layer_id
    if real is None or config.candidate_topk_blocks is None:
        return None
    ratio = config.compress_ratios[real]
    return next((p.index for p in plan if p.stores and p.indexed and p.ratio and p.ratio == ratio), None)


def to_stack(model: KvlabV41ForCausalLM, formats: dict | None = None) -> Stack:
    """A kvlab.attention `Stack` running the trained weights (copies, float32) with packed kvlab.cache stores in
    `formats` (role main / index / swa -> kvlab format; default bf16): cached prefill / decode, one sequence, and
    `cache_bytes()` of what its stores hold."""
    cfg = model.config
    spec = cfg.spec()
    scfg = StackConfig(model=spec, layers=cfg.num_hidden_layers, hidden=cfg.hidden_size,
                       heads=cfg.num_attention_heads, head_dim=cfg.head_dim, rope_dim=cfg.qk_rope_head_dim,
                       index_heads=cfg.index_n_heads, index_dim=cfg.index_head_dim, window=cfg.sliding_window,
                       index_topk=cfg.index_topk, candidate_blocks=cfg.candidate_topk_blocks,
                       candidate_block_size=cfg.candidate_block_size, vocab=cfg.vocab_size,
                       formats=dict(formats or {}))
    stack = Stack(scfg)
    with torch.no_grad():
        copy = lambda t: None if t is None else t.detach().float().cpu().clone()  # noqa: E731
        stack.embed, stack.head = copy(model.embed), copy(model.head)
        weights = []
        for layer in model.layers:
            w = layer.weights(cfg)
            comp = lambda c: None if c is None else Compressor(  # noqa: E731
                ratio=c.ratio, dim=c.dim, overlap=c.overlap, w_kv=copy(c.w_kv), w_gate=copy(c.w_gate),
                bias=copy(c.bias), norm=copy(c.norm), rope_dim=c.rope_dim, rope_theta=c.rope_theta)
            weights.append(LayerWeights(
                wq=copy(w.wq), wkv=copy(w.wkv), kv_norm=copy(w.kv_norm), sinks=copy(w.sinks), wo=copy(w.wo),
                w1=copy(w.w1), w3=copy(w.w3), w2=copy(w.w2), compressor=comp(w.compressor),
                index_compressor=comp(w.index_compressor),
                indexer=None if w.indexer is None else IndexerWeights(wq=copy(w.indexer.wq),
                                                                      w_heads=copy(w.indexer.w_heads))))
        stack.weights = weights
    stack.reset()
    return stack


def v41_config(size="tiny", vocab: int = 256) -> KvlabV41Config:
    """The V4.1-like config at a size preset (kvlab.toy.sizes.SIZES)."""
    s = get_size(size)
    layers = {"tiny": 6}.get(size if isinstance(size, str) else "", max(6, s.layers))
    return KvlabV41Config(vocab_size=vocab, hidden_size=s.hidden, intermediate_size=s.intermediate // 3,
                          num_hidden_layers=layers, num_attention_heads=s.heads, head_dim=2 * s.head_dim,
                          qk_rope_head_dim=s.rope_dim, index_n_heads=s.heads, index_head_dim=s.head_dim,
                          index_topk=16 if s.hidden <= 128 else 32, sliding_window=64 if s.hidden <= 128 else 128,
                          candidate_topk_blocks=16, candidate_block_size=8, max_position_embeddings=s.max_positions)


AutoConfig.register(KvlabV41Config.model_type, KvlabV41Config, exist_ok=True)
AutoModelForCausalLM.register(KvlabV41Config, KvlabV41ForCausalLM, exist_ok=True)
