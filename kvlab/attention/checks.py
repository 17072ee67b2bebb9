"""Input checks for the attention prototype: tensor shapes, with errors naming the mismatch. Counts are checked
with kvlab.checks.need_int(..., error=SelectionError)."""
from __future__ import annotations

import torch

from ..checks import need_number, need_type
from ..errors import KvlabError, ShapeError, WrongTypeError


class AttentionShapeError(ShapeError):
    """Attention inputs whose shapes do not fit together (or do not fit the layout)."""


class SelectionError(KvlabError):
    """A top-k or candidate pool that asks for more positions than exist, or a window / ratio below 1."""


def need_real(name: str, t, what: str) -> torch.Tensor:
    """`t` must be a real-valued tensor, described as `what` (e.g. '[B, H, S, D]'): complex values would lose
    their imaginary part in a real softmax, booleans are masks, not values."""
    need_type(name, t, torch.Tensor, f"a torch.Tensor {what}")
    if t.is_complex() or t.dtype == torch.bool:
        raise WrongTypeError(f"{name} must be a real-valued tensor {what}, got {t.dtype}"
                             + (" (the imaginary part would be dropped)" if t.is_complex() else ""))
    return t


def need_dims(name: str, t: torch.Tensor, ndim: int, what: str) -> torch.Tensor:
    """`t` must be a real-valued tensor of `ndim` dims (see need_real)."""
    need_real(name, t, what)
    if t.dim() != ndim:
        raise AttentionShapeError(f"{name} must be {what} ({ndim} dims), got shape {tuple(t.shape)}")
    return t


def need_mask(name: str, mask, shape: tuple[int, ...], what: str, hint: str = "") -> torch.Tensor:
    """A boolean mask that broadcasts to `shape`, described as `what` (`hint`: why a float one is wrong)."""
    need_type(name, mask, torch.Tensor, f"a bool tensor {what}")
    if mask.dtype != torch.bool:
        raise WrongTypeError(f"{name} must be a bool tensor {what}, got {mask.dtype}" + (f": {hint}" if hint else ""))
    try:
        if torch.broadcast_shapes(tuple(mask.shape), shape) != torch.Size(shape):
            raise RuntimeError
    except RuntimeError:
        raise AttentionShapeError(f"{name} has shape {tuple(mask.shape)}, which does not broadcast to the "
                                  f"scores {tuple(shape)} {what}") from None
    return mask


def need_sinks(sinks, heads: int) -> torch.Tensor:
    """One sink logit per query head: [H]."""
    need_dims("sinks", sinks, 1, "[H]")
    same("sinks", sinks.shape[0], "q heads", heads)
    return sinks


def need_scale(scale) -> float | None:
    """The softmax scale: None (1 / sqrt(D)) or a finite positive number."""
    return None if scale is None else need_number("scale", scale, 0.0, lo_open=True)


def need_index(name: str, idx, n: int, what: str) -> torch.Tensor:
    """An integer index tensor whose entries lie in [-1, n - 1] (-1 = no position)."""
    need_type(name, idx, torch.Tensor, f"an integer tensor {what}")
    if idx.dtype in (torch.bool,) or idx.dtype.is_floating_point or idx.is_complex():
        raise WrongTypeError(f"{name} must be an integer tensor {what}, got {idx.dtype}")
    if idx.numel():
        lo, hi = int(idx.min()), int(idx.max())
        if lo < -1 or hi >= n:
            bad = lo if lo < -1 else hi
            raise SelectionError(f"{name} holds {bad}, but there are {n} positions (0 to {n - 1}; -1 marks none)")
    return idx


def no_empty_rows(name: str, ok: torch.Tensor) -> None:
    """Every query must see at least one key: a row with none gives 0 or NaN, not an attention output."""
    empty = ~ok.any(-1)
    if bool(empty.any()):
        where = tuple(int(i) for i in empty.nonzero()[0])
        raise SelectionError(f"{name} leaves {int(empty.sum())} query row(s) with no key to attend (first at "
                             f"index {where}); its output would be 0 or NaN, not an attention (add a sink logit "
                             "or give every query a key)")


def same(name_a: str, a: int, name_b: str, b: int) -> None:
    """Two sizes that must agree."""
    if a != b:
        raise AttentionShapeError(f"{name_a} = {a} does not match {name_b} = {b}")
