"""Input checks for the attention prototype: tensor shapes, with errors naming the mismatch. Counts are checked
with kvlab.checks.need_int(..., error=SelectionError)."""
from __future__ import annotations

import torch

from ..errors import KvlabError, ShapeError


class AttentionShapeError(ShapeError):
    """Attention inputs whose shapes do not fit together (or do not fit the layout)."""


class SelectionError(KvlabError):
    """A top-k or candidate pool that asks for more positions than exist, or a window / ratio below 1."""


def need_dims(name: str, t: torch.Tensor, ndim: int, what: str) -> torch.Tensor:
    """`t` must be a tensor of `ndim` dims, described as `what` (e.g. '[B, H, S, D]')."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor {what}, got {type(t).__name__}")
    if t.dim() != ndim:
        raise AttentionShapeError(f"{name} must be {what} ({ndim} dims), got shape {tuple(t.shape)}")
    return t


def same(name_a: str, a: int, name_b: str, b: int) -> None:
    """Two sizes that must agree."""
    if a != b:
        raise AttentionShapeError(f"{name_a} = {a} does not match {name_b} = {b}")
