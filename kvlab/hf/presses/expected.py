"""Expected Attention: the attention future queries are expected to pay each key, from the context's query
statistics rotated to future positions (Devoto et al. 2025, arXiv 2510.00636; kvpress
presses/expected_attention_press.py)."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ...errors import ParameterError
from .base import Press, PressInput, pad_max


def unrotate(q: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Undo RoPE (rotate by -angle): q [B, H, S, D], cos / sin [S, D]."""
    h = q.shape[-1] // 2
    rot = torch.cat([-q[..., h:], q[..., :h]], dim=-1)  # rotate_half(q)
    return q * cos - rot * sin


@dataclass
class ExpectedAttention(Press):
    """Queries after the sinks, RoPE undone: mean mu and covariance S per head, both rotated by the mean RoPE
    rotation of the next `n_future_positions` positions; score = softmax(k.mu / sqrt(d) + k^T S k / (2d)) over
    the keys after the sinks, averaged over the query group, times ||v||; the sinks are kept."""

    n_future_positions: int = 512  # future positions the rotation is averaged over
    n_sink: int = 4  # first tokens always kept (and left out of the statistics)
    use_covariance: bool = True  # add the covariance term
    use_vnorm: bool = True  # weight by the value's norm
    name = "expected_attention"
    needs = ("queries", "rope")

    def check(self, t: int) -> None:
        if t <= self.n_sink:
            raise ParameterError(f"expected_attention needs a context longer than its {self.n_sink} sink tokens, "
                                 f"got {t}")

    def _rotation(self, x: PressInput, t: int, d: int) -> torch.Tensor:
        """The mean over future positions t .. t + n - 1 of RoPE's rotation matrix: [D, D] (`score` checked the
        rotary embedding)."""
        dev = x.queries.device
        pos = torch.arange(t, t + self.n_future_positions, device=dev)[None]
        cos, sin = x.rotary(x.queries, pos)  # [1, n, D] each
        cos, sin = cos[0].float(), sin[0].float()
        eye = torch.eye(d, device=dev)
        p = torch.zeros(d, d, device=dev)
        p[d // 2:, :d // 2], p[:d // 2, d // 2:] = torch.eye(d // 2), -torch.eye(d // 2)
        return (cos[:, None] * eye + sin[:, None] * p).mean(0)  # [D, D]

    def score(self, x: PressInput) -> torch.Tensor:
        s, d = self.n_sink, x.keys.shape[-1]
        t = x.queries.shape[2]
        if x.rotary is None:
            raise ParameterError("expected_attention needs the model's rotary embedding: give make_cache the model")
        cos, sin = x.rotary(x.queries, x.qpos[None])  # [1, S, D'] each
        if cos.shape[-1] != d:
            raise ParameterError(f"expected_attention rotates query statistics by a RoPE over the whole head "
                                 f"({d} dims); this model rotates {cos.shape[-1]} of them (partial rotary)")
        q = unrotate(x.queries, cos[0].float(), sin[0].float())[:, :, s:]  # [B, H, S - s, D] before RoPE
        mu = q.mean(dim=2, keepdim=True)  # [B, H, 1, D]
        cen = q - mu
        cov = torch.einsum("bnsi,bnsj->bnij", cen, cen) / q.shape[2]  # [B, H, D, D]
        r = self._rotation(x, t, d)
        mu = mu.squeeze(2) @ r.T  # [B, H, D]
        cov = r @ cov @ r.T
        k = x.keys[:, :, s:].repeat_interleave(x.groups, dim=1)  # [B, H, T - s, D]
        logits = torch.einsum("bhd,bhtd->bht", mu, k) / math.sqrt(d)  # [B, H, T - s]
        if self.use_covariance:
            logits = logits + torch.einsum("bhti,bhij,bhtj->bht", k, cov, k) / d / 2
        sc = x.group_mean(torch.softmax(logits, dim=-1))  # [B, Hkv, T - s]
        if self.use_vnorm:
            sc = sc * x.values[:, :, s:].norm(dim=-1)
        return pad_max(sc, front=s)  # [B, Hkv, T]
