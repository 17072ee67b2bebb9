"""Seeded test tensors for the quantizer oracle tests (rows of blocks with edge cases)."""
from __future__ import annotations

import torch


def distributions(rows: int = 64, cols: int = 256, seed: int = 0) -> dict[str, torch.Tensor]:
    """Named fp32 [rows, cols] tensors: ordinary data and the edge-case blocks (zero, tiny, Inf, wide range)."""
    g = torch.Generator().manual_seed(seed)
    randn = torch.randn(rows, cols, generator=g)
    chi2 = (torch.randn(rows, cols, 3, generator=g) ** 2).sum(-1)
    student = torch.randn(rows, cols, generator=g) / torch.sqrt(chi2 / 3)  # Student t(3)
    wide = torch.randn(rows, cols, generator=g) * torch.exp2(torch.randint(-40, 40, (rows, cols), generator=g).float())
    edge = torch.randn(rows, cols, generator=g)
    edge[0] = 0.0  # all-zero blocks
    edge[1] = -0.0  # negative zeros
    edge[2] = 1e-30 * torch.randn(cols, generator=g)  # tiny blocks
    edge[3, ::7] = float("inf")  # Inf in blocks
    edge[4, 5::16] = float("-inf")
    edge[5, :] = 1e-30
    edge[5, ::2] = -0.0  # tiny + -0 mixed
    edge[6] = torch.randn(cols, generator=g) * 1e30  # huge
    edge[7, 3::32] = 1e-40  # fp32 subnormals
    nan = torch.randn(rows, cols, generator=g)
    nan[0, 3] = float("nan")
    nan[1, 40] = -float("nan")
    return {"gaussian": randn, "student_t": student, "wide_range": wide, "edge": edge, "nan": nan}
