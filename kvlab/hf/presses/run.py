"""A press at work in one cache layer: attention over what the layer holds, then scoring and pruning.

`KvlabLayer.update` hands its `PressRun` to the attention function through the attention kwargs
(`kvlab_press`); `kvlab_attention` calls `attend`, which runs the model's attention on the held tokens
(transformers' SDPA, its mask offset by the tokens already evicted, KvlabLayer.get_mask_sizes; a custom
mask only where a per-head budget masks slots it holds) and then, when the plan says so, scores the held
tokens and has the layer keep the selected ones (`KvlabLayer.keep`), which frees the others' rows.
"""
from __future__ import annotations

import torch

from ...errors import ParameterError
from ..sdpa import attend
from .base import PressInput, PressPlan


class PressRun:
    """One layer's press: its plan (shared by the cache's layers), its layer and its state across forwards."""

    def __init__(self, plan: PressPlan, layer, index: int):
        self.plan = plan  # press, budget, mode, per-layer kept counts
        self.layer = layer  # the KvlabLayer it prunes
        self.index = index  # layer index
        self.forwards = 0  # forwards this layer has attended
        self.state: dict = {}  # the press's own per-slot state ([B, Hkv, T] tensors are pruned with the slots)
        self.read = True  # False between an update and the attention that consumes it

    def done(self) -> bool:
        """A prefill-mode press whose context is compressed: later forwards hand attention nothing."""
        return bool(self.forwards) and self.plan.mode == "prefill"

    def attend(self, module, query, key, value, attention_mask, dropout: float = 0.0, scaling: float | None = None,
               **kwargs):
        """The model's attention on the held tokens ([B, S, H, Dv], None), then this layer's press."""
        self.read = True
        scale = scaling if scaling is not None else query.shape[-1] ** -0.5
        readable = self.layer.readable
        if readable is None:
            out = fitted_sdpa(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
        else:  # a per-head budget: slots the layer holds but the head does not read are masked
            h = query.shape[1]
            g = h // key.shape[1]
            qpos = self.layer.query_positions(query.shape[2])  # [S]
            vis = (self.layer.positions[:, :, None, :] <= qpos[None, None, :, None]) & readable[:, :, None, :]
            mask = vis.repeat_interleave(g, dim=1)  # [B, H, S, T]
            o = attend(query, key, value, mask, scale, kwargs.get("softcap"))  # [B, H, S, Dv]
            out = (o.transpose(1, 2).contiguous(), None)
        self.after(query, key, value, scale)
        self.forwards += 1
        return out

    def inputs(self, query, key, value, scale: float) -> PressInput:
        """What the scorer sees; `query` None when the queries were not kept (presses that need none)."""
        return PressInput(key.float(), value.float(), self.layer.positions,
                          None if query is None else query.float(),
                          None if query is None else self.layer.query_positions(query.shape[2]), scale, self.index,
                          len(self.plan.applies),
                          self.plan.rotary, self.plan.fraction(self.plan.context, self.plan.kept.get(self.index, 1)),
                          self.state)

    def after(self, query, key, value, scale: float) -> None:
        """Score and prune when the plan says so: the first forward (prefill), or every forward over budget."""
        plan, press = self.plan, self.plan.press
        n = plan.kept.get(self.index)
        first = self.forwards == 0
        if plan.mode == "prefill" and not first:
            return
        x = self.inputs(query, key, value, scale)
        held = key.shape[2]
        if plan.mode == "decode":
            press.observe(x)
            if held <= n:
                return
        elif n >= held:
            return
        scores = press.score(x)  # [B, Hkv, T]
        slots, readable = press.select(x, scores, n)
        if press.variable and plan.mode == "prefill":
            plan.kept[self.index] = slots.shape[-1]  # the slots it holds (AdaKV: its fullest head)
        for k, v in list(self.state.items()):  # per-slot state follows the slots kept
            if isinstance(v, torch.Tensor) and v.dim() == 3 and v.shape[-1] == held:
                self.state[k] = v.gather(2, slots)
        self.layer.keep(slots, readable)


def fitted_sdpa(module, query, key, value, attention_mask, **kwargs):
    """transformers' SDPA attention on the keys a layer holds, its mask fitted to them (`fit_mask`); a model that
    soft-caps its logits (Gemma 2), which SDPA cannot, through kvlab.hf.sdpa.attend."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    mask = fit_mask(attention_mask, key.shape[2])
    if kwargs.get("softcap"):
        scale = kwargs.get("scaling") or query.shape[-1] ** -0.5
        return attend(query, key, value, mask, scale, kwargs["softcap"]).transpose(1, 2).contiguous(), None
    return sdpa_attention_forward(module, query, key, value, mask, **kwargs)


def fit_mask(mask: torch.Tensor | None, keys: int) -> torch.Tensor | None:
    """transformers builds one mask [B, 1, S, K] for every layer from the first layer's sizes, but a per-layer
    budget (PyramidKV) leaves each layer holding another count. Every held token precedes this forward's
    queries, so the mask's last S columns (causal among the new tokens) are kept and the held part is cut or
    widened to `keys` columns (widened: visible)."""
    if mask is None or mask.shape[-1] == keys:
        return mask
    if mask.shape[-1] > keys:
        return mask[..., -keys:]
    pad = keys - mask.shape[-1]
    seen = torch.ones if mask.dtype == torch.bool else torch.zeros  # bool: True attends; float: 0 adds nothing
    return torch.cat([seen(*mask.shape[:-1], pad, dtype=mask.dtype, device=mask.device), mask], dim=-1)


def check_attention(run: PressRun | None, plan: PressPlan) -> None:
    """A press needs kvlab's attention function; say so if the last one handed to attention (`run`, None: none
    yet) was never reached."""
    if run is not None and not run.read:
        raise ParameterError(f"press {plan.label()} needs kvlab's attention function: call "
                                 "kvlab.hf.use_kvlab_attention(model) (make_cache(model, press=...) does it)")
