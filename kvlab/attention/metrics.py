"""Accuracy of an approximate attention against the dense reference on the same inputs: distributions
(KL), selections (recall, mass covered), and the output error a quantized K / V causes (attention_error). Elementwise
output errors (rel_error, cosine) are kvlab.quant.metrics'."""
from __future__ import annotations

import torch

from ..checks import need_int, need_number
from ..quant.metrics import rel_error
from .dense import dense_attention
from .checks import need_index, need_real, same


def _same_shape(name_a: str, a: torch.Tensor, name_b: str, b: torch.Tensor) -> None:
    if tuple(a.shape) != tuple(b.shape):
        same(f"{name_a} shape", tuple(a.shape), f"{name_b} shape", tuple(b.shape))


def kl(p: torch.Tensor, q: torch.Tensor, eps: float = 1e-12) -> float:
    """Mean KL(p || q) over rows of distributions along the last dim (q's zeros floored at eps)."""
    need_real("p", p, "[..., T]")
    need_real("q", q, "[..., T]")
    _same_shape("p", p, "q", q)
    need_number("eps", eps, 0.0, lo_open=True)
    p = p.float() / p.float().sum(-1, keepdim=True)
    q = q.float().clamp_min(0)
    q = q / q.sum(-1, keepdim=True)
    t = torch.where(p > 0, p * (p.clamp_min(eps).log() - q.clamp_min(eps).log()), torch.zeros_like(p))  # [..., T]
    return float(t.sum(-1).mean())


def logits_kl(ref_logits: torch.Tensor, logits: torch.Tensor) -> float:
    """Mean KL(softmax(ref) || softmax(logits)) over rows (next-token distributions)."""
    need_real("ref_logits", ref_logits, "[..., V]")
    need_real("logits", logits, "[..., V]")
    _same_shape("ref_logits", ref_logits, "logits", logits)
    lp, lq = torch.log_softmax(ref_logits.float(), -1), torch.log_softmax(logits.float(), -1)  # [..., V] each
    return float((lp.exp() * (lp - lq)).sum(-1).mean())


def recall_at_k(selected: torch.Tensor, probs: torch.Tensor, k: int) -> float:
    """|selected & topk(true attention)| / k, averaged over rows; selected [..., k'] indices, probs [..., T]."""
    k = need_int("k", k, 1)
    _selection(selected, probs)
    true = probs.topk(min(k, probs.shape[-1]), dim=-1).indices  # [..., k]
    hit = (selected[..., :, None] == true[..., None, :]).any(-2).float()  # [..., k]
    return float(hit.sum(-1).mean() / true.shape[-1])


def mass_covered(selected: torch.Tensor, probs: torch.Tensor) -> float:
    """Attention mass (of the dense distribution) that the selected positions hold, averaged over rows."""
    _selection(selected, probs)
    p = probs.float() / probs.float().sum(-1, keepdim=True)  # [..., T]
    return float(p.gather(-1, selected.clamp_min(0)).mul((selected >= 0).float()).sum(-1).mean())


def _selection(selected, probs) -> None:
    """selected [..., k] integer positions of probs [..., T] (-1 = none), with the same leading dims."""
    need_real("probs", probs, "[..., T]")
    need_index("selected", selected, probs.shape[-1], "[..., k]")
    if tuple(selected.shape[:-1]) != tuple(probs.shape[:-1]):
        same("selected leading dims", tuple(selected.shape[:-1]), "probs leading dims", tuple(probs.shape[:-1]))


def attention_error(k: torch.Tensor, v: torch.Tensor, k_hat: torch.Tensor, v_hat: torch.Tensor,
                     q: torch.Tensor | None = None, queries: int = 16, seed: int = 0) -> float:
    """Relative error of the attention output from dequantized K, V against full-precision K, V: k, v
    [..., T, D] (leading dims are heads), every query attending to every key with kvlab.attention's dense
    attention. q [..., Tq, D] defaults to `queries` seeded Gaussian queries scaled like the keys."""
    if q is None:
        gen = torch.Generator().manual_seed(seed)
        q = torch.randn(*k.shape[:-2], queries, k.shape[-1], generator=gen)  # [..., Tq, D]
        q = q.to(k.device) * k.float().std()

    def attend(keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        return dense_attention(*(t.reshape(1, -1, *t.shape[-2:]) for t in (q, keys, values)))  # [1, heads, Tq, Dv]

    return rel_error(attend(k, v), attend(k_hat, v_hat))
