"""Attention mechanisms on trained dense and MLA models, through a kvlab attention function.

transformers' attention modules call `cache.update(k, v, layer, kwargs=attn_kwargs)` and then the
attention function with those same `attn_kwargs`. A `KvlabLayer` with a mechanism puts a `KeyLayout`
there (`kvlab_keys`): which token positions each key it returns covers. `kvlab_attention`, registered
with transformers' `AttentionInterface` as "kvlab", masks and selects by it with kvlab.attention's
reference algorithms (`select_topk`, `candidate_pool`, `pool_keys`); without a mechanism it is
transformers' own SDPA path, unchanged. What each mechanism means on a model trained without it:

  window=W              every full-attention layer keeps its last W - 1 tokens (as transformers' sliding
                        layers do); each query sees its last W positions. Bytes: bounded.
  topk=K                each query attends only to the K positions with the most attention mass (its
                        softmax summed over heads) among those it may see: an oracle for a learned indexer
                        (DSA's), which a dense or MLA model does not have. Bytes: unchanged (a selection
                        saves reads and FLOPs, not memory).
  capped=BxS,topk=K     DeepSeek V4.1's capped candidate pool: the B best blocks of S consecutive positions
                        (a block scored by its best position), then the top K inside them. Bytes: unchanged.
  csa=M,topk=K,window=W DeepSeek V4-style compression, weight-free: an entry pools M tokens (CSA: 2M
  hca=M,window=W        overlapping tokens) by their mean; a query sees every complete entry (CSA: the top
                        K by mass) plus its last W raw tokens. Bytes: W - 1 raw tokens and one entry per M
                        tokens per layer. A trained V4 compressor learns its gate (and an indexer its scores):
                        mean pooling in a model trained without either is a lower bound on what compression
                        keeps. The learned CSA/HCA stack is the V4.1-like model (kvlab.train).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import torch

from ..attention.indexer import candidate_pool, select_topk
from ..checks import need_int
from ..errors import ParameterError
from ..layout import Component, LayerCache, Layout
from .presses.run import fitted_sdpa
from .sdpa import attend

NAMES = ("dense", "window", "topk", "capped", "csa", "hca")
DEFAULTS = {"csa": dict(topk=32, window=64), "hca": dict(window=64), "capped": dict(topk=32)}
QUERY_CHUNK = 256  # queries scored at once (bounds the [B, H, S, T] logits of a long prefill)


@dataclass(frozen=True)
class Mechanism:
    """What a query may read, beyond the cache's number formats."""

    name: str  # one of NAMES
    window: int | None = None  # raw tokens a query sees (window; csa / hca: the recent raw window)
    topk: int | None = None  # positions (csa: pooled entries) each query keeps
    blocks: int | None = None  # capped pool: candidate blocks
    block_size: int | None = None  # capped pool: positions per block
    ratio: int | None = None  # csa / hca: tokens per pooled entry

    @property
    def dense(self) -> bool:
        return self.name == "dense"

    @property
    def overlap(self) -> bool:
        """CSA entries pool 2M tokens (their window and the one before), HCA entries M."""
        return self.name == "csa"

    @property
    def selects(self) -> bool:
        return self.topk is not None

    def label(self) -> str:
        if self.dense:
            return "dense"
        head = {"window": f"window={self.window}", "topk": f"topk={self.topk}",
                "capped": f"capped={self.blocks}x{self.block_size},topk={self.topk}",
                "csa": f"csa={self.ratio},topk={self.topk},window={self.window}",
                "hca": f"hca={self.ratio},window={self.window}"}
        return head[self.name]


DENSE = Mechanism("dense")


def _count(text: str, key: str, value: str) -> int:
    if not value.isdigit():
        raise ParameterError(f"mechanism {text!r}: {key} takes a positive integer, got {value!r}")
    return need_int(f"mechanism {key}", int(value), 1)


def parse_mechanism(text: str | Mechanism | None) -> Mechanism:
    """'window=64', 'topk=32', 'capped=16x8,topk=32', 'csa=4,topk=32,window=64', 'hca=32,window=64' or 'dense';
    'key:value' reads as 'key=value' (a notebook's parameters cell, which papermill parses, takes one '=' a line)."""
    if text is None or isinstance(text, Mechanism):
        return text or DENSE
    if not isinstance(text, str):
        raise ParameterError(f"mechanism must be a string such as 'window=64', got {text!r}")
    s = text.strip().lower().replace("_", "")
    if s in ("", "dense", "none"):
        return DENSE
    opts = {}
    for item in s.split(","):
        key, sep, value = (x.strip() for x in item.replace(":", "=", 1).partition("="))
        if not sep or key not in ("window", "topk", "capped", "csa", "hca"):
            raise ParameterError(f"mechanism {text!r}: {item.strip()!r} is not one of window=W, topk=K, capped=BxS, "
                                 "csa=M, hca=M (key=value, comma separated)")
        opts[key] = value
    kinds = [k for k in ("capped", "csa", "hca") if k in opts]
    if len(kinds) > 1 or (not kinds and {"window", "topk"} <= set(opts)):
        raise ParameterError(f"mechanism {text!r}: combines {', '.join(kinds or ['window', 'topk'])}; give one "
                             "(csa takes a topk and a window)")
    name = kinds[0] if kinds else ("topk" if "topk" in opts else "window")
    vals = {**DEFAULTS.get(name, {}), **{k: _count(text, k, v) for k, v in opts.items() if k in ("window", "topk")}}
    if name == "capped":
        m = re.fullmatch(r"(\d+)x(\d+)", opts["capped"])
        if not m:
            raise ParameterError(f"mechanism {text!r}: capped takes BLOCKSxSIZE, e.g. capped=16x8")
        vals.update(blocks=_count(text, "capped blocks", m[1]), block_size=_count(text, "capped size", m[2]))
        vals.pop("window", None)
    if name in ("csa", "hca"):
        vals["ratio"] = _count(text, name, opts[name])
        need = vals["ratio"] * (2 if name == "csa" else 1)
        if vals["window"] < need:
            raise ParameterError(f"mechanism {text!r}: the raw window ({vals['window']}) must hold the {need} tokens "
                                 "an entry pools")
        if name == "hca":
            vals.pop("topk", None)
    if name == "window" and vals["window"] < 2:
        raise ParameterError(f"mechanism {text!r}: a window must be at least 2 tokens")
    return Mechanism(name, **vals)


@dataclass
class KeyLayout:
    """Which token positions the keys of one update cover (handed to `kvlab_attention` in its kwargs)."""

    mech: Mechanism  # what the queries may read
    qpos: torch.Tensor  # [S] positions of the queries
    start: torch.Tensor  # [T] first token position each key covers
    end: torch.Tensor  # [T] last token position each key covers
    pooled: int = 0  # the first `pooled` keys are pooled entries, the rest raw tokens
    read: bool = False  # set when kvlab_attention has used it

    def visible(self, a: int = 0, b: int | None = None) -> torch.Tensor:
        """[S', T] bool for queries a..b: a key is visible once every token it covers has been seen, and a
        raw key only inside the query's window."""
        q = self.qpos[a:b, None]
        ok = self.end[None, :] <= q
        w = self.mech.window
        if w is not None:
            raw = torch.arange(len(self.end), device=q.device)[None, :] >= self.pooled
            ok &= ~raw | (self.start[None, :] > q - w)
        return ok


def _selected(q: torch.Tensor, k: torch.Tensor, visible: torch.Tensor, keys: KeyLayout, scale: float) -> torch.Tensor:
    """Keys each query keeps, [B, S, T] bool: the top k by attention mass (softmax summed over heads) among
    its visible keys (capped: inside the best candidate blocks; csa: among pooled entries, raw keys all kept)."""
    mech = keys.mech
    b, h, s, _ = q.shape
    kk = k.repeat_interleave(h // k.shape[1], dim=1) if k.shape[1] != h else k  # [B, H, T, D]
    logits = torch.matmul(q.float(), kk.float().transpose(-1, -2)) * scale  # [B, H, S, T]
    logits = logits.masked_fill(~visible[:, None], float("-inf"))
    mass = torch.softmax(logits, dim=-1).sum(1)  # [B, S, T]
    t = mass.shape[-1]
    cand = visible
    keep = torch.zeros_like(visible)
    if mech.overlap:
        pooled = torch.arange(t, device=q.device) < keys.pooled
        keep, cand = visible & ~pooled, visible & pooled
    if mech.blocks is not None:
        pool = candidate_pool(mass.masked_fill(~cand, float("-inf")), mech.blocks, mech.block_size)  # [B, S, P]
        inpool = torch.zeros(b, s, t + 1, dtype=torch.bool, device=q.device)
        inpool.scatter_(2, torch.where(pool >= 0, pool, t), True)
        cand = cand & inpool[..., :t]
    idx = select_topk(mass, min(mech.topk, t), cand)  # [B, S, k], -1 = none
    sel = torch.zeros(b, s, t + 1, dtype=torch.bool, device=q.device)
    sel.scatter_(2, torch.where(idx >= 0, idx, t), True)
    return sel[..., :t] | keep


def kvlab_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling: float | None = None,
                    kvlab_keys: KeyLayout | None = None, **kwargs):
    """transformers attention function: SDPA, restricted by the mechanism the cache describes (if any).
    query [B, H, S, D], key / value [B, Hkv, T, D]; returns ([B, S, H, Dv], None)."""
    press = kwargs.pop("kvlab_press", None)
    if press is not None:  # a press on this layer (kvlab.hf.presses.run): attention on the held tokens, then it
        return press.attend(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    if kvlab_keys is None:  # (a pruned press layer: transformers sized the mask for the first layer's keys)
        return fitted_sdpa(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    kvlab_keys.read = True
    b, h, s, d = query.shape
    scale = scaling if scaling is not None else d ** -0.5
    outs = []
    for a in range(0, s, QUERY_CHUNK):
        q = query[:, :, a:a + QUERY_CHUNK]
        vis = kvlab_keys.visible(a, a + QUERY_CHUNK)[None].expand(b, -1, -1)  # [B, S', T]
        if kvlab_keys.mech.selects:
            vis = vis & _selected(q, key, vis, kvlab_keys, scale)
        outs.append(attend(q, key, value, vis[:, None], scale, kwargs.get("softcap")))  # [B, H, S', Dv]
    return torch.cat(outs, dim=2).transpose(1, 2).contiguous(), None


def mechanism_layout(layout: Layout, mech: Mechanism, full: list[bool]) -> Layout:
    """The layout with a pooling mechanism's entries added to the full-attention layers: per raw role
    ("k", "v" / "latent") one entry per `ratio` complete tokens, in the role's format (a window's raw
    tokens are already bounded by the spec the layout was built from)."""
    if mech.ratio is None:
        return layout
    layers = []
    for lc, f in zip(layout.layers, full):
        pooled = tuple(Component(f"{c.role}_pooled", c.entry, c.copies, ratio=mech.ratio, partial=False)
                       for c in lc.components if f and c.role in ("k", "v", "latent")) if f else ()
        if any(c.group > 1 for c in lc.components if c.role in ("k", "v", "latent")) and f:
            raise ParameterError("pooled entries take per-token formats; integer keys grouped per channel (KIVI) "
                                 "cannot be pooled (use key_axis='token')")
        layers.append(LayerCache(lc.index, lc.mode, lc.components + pooled, lc.source))
    note = (f"{mech.label()}: full-attention layers keep {mech.window - 1} raw tokens and one pooled entry per "
            f"{mech.ratio} complete tokens")
    return Layout(layout.model, layout.scheme, layout.kv_format, tuple(layers), layout.notes + (note,))


def register() -> None:
    """Register "kvlab" with transformers' attention and mask interfaces (masks as SDPA builds them)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    AttentionInterface.register("kvlab", kvlab_attention)
    AttentionMaskInterface.register("kvlab", sdpa_mask)


def use_kvlab_attention(model) -> None:
    """Switch a model to kvlab's attention function (SDPA itself when a cache has no mechanism)."""
    register()
    if getattr(model.config, "_attn_implementation", None) != "kvlab":
        model.set_attn_implementation("kvlab")
