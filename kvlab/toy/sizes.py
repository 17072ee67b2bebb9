"""Size presets shared by every architecture kvlab trains (kvlab.train.models, kvlab.toy.v41).

`SIZES` holds named presets: "tiny" trains in minutes on 2 CPU cores, "small" and "base" are for a GPU.
Every preset keeps the architectures close in parameters, so bytes per token is what mostly differs.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..checks import need_choice


@dataclass(frozen=True)
class Size:
    """Width and depth shared by every architecture at one preset."""

    hidden: int  # model width
    layers: int  # decoder layers
    heads: int  # query heads
    kv_heads: int  # dense: KV heads (GQA)
    head_dim: int  # dense: dims per head; mla: nope / value dims per head
    intermediate: int  # SwiGLU hidden width
    kv_lora_rank: int  # mla: latent width
    rope_dim: int  # mla: decoupled RoPE key width; v41: RoPE channels of an entry
    max_positions: int = 2048  # longest context the rotary tables cover


SIZES = {
    "tiny": Size(hidden=128, layers=4, heads=4, kv_heads=2, head_dim=32, intermediate=384, kv_lora_rank=48,
                 rope_dim=16),
    "small": Size(hidden=256, layers=6, heads=8, kv_heads=2, head_dim=32, intermediate=768, kv_lora_rank=96,
                  rope_dim=32, max_positions=4096),
    "base": Size(hidden=512, layers=8, heads=8, kv_heads=2, head_dim=64, intermediate=1536, kv_lora_rank=192,
                 rope_dim=32, max_positions=8192),
}


def get_size(size: str | Size) -> Size:
    return size if isinstance(size, Size) else SIZES[need_choice("size", size, SIZES)]
