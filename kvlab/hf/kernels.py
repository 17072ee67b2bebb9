"""A compiled (numba) decoder for the transformers cache's hottest path: packed rows into the tensor
attention reads.

Every decode step returns every held token, so decoding the packed store is most of what a quantized
cache costs per step. With torch ops that is a dozen passes over the data (unpack, look up, scale,
shift, reorder, convert); this loop reads each packed byte once and writes each value once, straight
into its place in [B*H, T, W] (a key group's channel-major entry lands token-major). It computes what
`kvlab.quant.QuantizedTensor.dequantize` computes, bit for bit: the element's value (an integer code,
or an E2M1 / FP8 value from its exact table) times its scale (float32; NVFP4's second level folded
into the block scales first, as dequantize does), plus the zero point for integer groups, then one
round-to-nearest-even to BF16 (c10's rule: NaN -> 0x7FC0), or float32 as is; tested against it with
zero tolerance. Entries it does not cover (several parts, other element types) keep the torch path.
numba compiles it once per machine (`cache=True`); KVLAB_NUMBA=0, as for kvlab.sim.kernels, turns it off.
"""
from __future__ import annotations

import os

import numpy as np
import torch

from ..layout import Entry
from ..quant.e2m1 import E2M1_VALUES
from ..quant.fp8 import decode_fp8
from ..quant.tensor import decode_scale_bytes

try:  # numba is a core dependency (kvlab.sim.kernels); the torch path stays for environments without it
    from numba import njit
    ENABLED = os.environ.get("KVLAB_NUMBA", "1") != "0"
except ImportError:  # pragma: no cover
    njit = None
    ENABLED = False

ELEMENTS = ("int2", "int4", "int8", "e2m1", "e4m3", "e5m2")  # element types the decoder reads


def _half(h, bf):
    """A 16-bit float's bits (uint16) -> float32, exactly: BF16 when bf, else IEEE FP16."""
    if bf:
        one = np.empty(1, np.uint32)
        one[0] = np.uint32(h) << 16
        return one.view(np.float32)[0]
    e, m = (h >> 10) & 0x1F, h & 0x3FF
    if e == 31:
        v = np.float32(np.inf) if m == 0 else np.float32(np.nan)
    elif e == 0:
        v = np.float32(m) * np.float32(2.0 ** -24)
    else:
        v = np.float32(1024 + m) * np.float32(2.0 ** (e - 25))
    return -v if h & 0x8000 else v


def _rows(rows, d, table, scale, bits, block, group, t0, out, bf16, pairs):
    """rows uint8 [N, C, entry B] (codes in the first d bytes); table float32 [2^bits] (code -> value);
    out [C, T, W] (uint16 BF16 bits when bf16, else float32). Scales: `pairs` 1 / 2 = (s, mn) FP16 / BF16
    pairs after the codes, one per block (integer groups); 0 = float32 `scale` [N, C, nb] given, no zero point.
    Group 1: element e of row r goes to token t0 + r, channel e. A key group (channel-major, its blocks are its
    channels, block == group): element j of block b goes to token t0 + r * group + j, channel b."""
    n_rows, copies, _ = rows.shape
    nb = scale.shape[2] if pairs == 0 else (rows.shape[2] - d) // 4
    n = nb * block if group > 1 else out.shape[2]
    mask = (1 << bits) - 1
    per = 8 // bits  # codes per byte; a block starts on a byte (block x bits is a multiple of 8)
    vals = np.empty(d * per, np.float32)  # one entry, decoded
    ub = vals.view(np.uint32)
    for r in range(n_rows):
        for c in range(copies):
            for b in range(nb):
                if pairs:
                    o = d + 4 * b
                    s = _half(np.uint16(rows[r, c, o]) | (np.uint16(rows[r, c, o + 1]) << 8), pairs == 2)
                    mn = _half(np.uint16(rows[r, c, o + 2]) | (np.uint16(rows[r, c, o + 3]) << 8), pairs == 2)
                else:
                    s, mn = scale[r, c, b], np.float32(0)
                for byte in range((b * block * bits) >> 3, (min((b + 1) * block, n) * bits + 7) >> 3):
                    x = rows[r, c, byte]
                    for j in range(per):
                        v = table[(x >> (j * bits)) & mask] * s
                        vals[byte * per + j] = v + mn if pairs else v  # no + 0: it would turn -0.0 into +0.0
            if bf16:  # round to nearest even on the bits; NaN -> 0x7FC0
                for e in range(n):
                    u = ub[e]
                    ub[e] = 0x7FC0 if (u & 0x7FFFFFFF) > 0x7F800000 else (u + (((u >> 16) & 1) + 0x7FFF)) >> 16
            if group == 1:
                for e in range(n):
                    out[c, t0 + r, e] = ub[e] if bf16 else vals[e]
            else:
                for w in range(nb):
                    for j in range(group):
                        out[c, t0 + r * group + j, w] = ub[w * group + j] if bf16 else vals[w * group + j]


if ENABLED:
    _half = njit(cache=True, nogil=True)(_half)
    _rows = njit(cache=True, nogil=True)(_rows)

_TABLES: dict[str, torch.Tensor] = {}


def _table(name: str) -> torch.Tensor:
    """Exact float32 value of every code of an element type."""
    if name not in _TABLES:
        if name.startswith("int"):
            t = torch.arange(2 ** int(name[3:]), dtype=torch.float32)
        elif name == "e2m1":
            v = torch.tensor(E2M1_VALUES, dtype=torch.float32)
            t = torch.cat([v, -v])
        else:
            from ..formats import ELEMENTS as EL
            t = decode_fp8(torch.arange(256, dtype=torch.uint8), EL[name])
        _TABLES[name] = t
    return _TABLES[name]


def covers(entry: Entry, dtype: torch.dtype) -> bool:
    """Whether the compiled decoder handles this entry: one part of a scaled integer / E2M1 / FP8 format,
    into BF16 or float32."""
    if not ENABLED or len(entry.parts) != 1 or entry.align != 1 or dtype not in (torch.bfloat16, torch.float32):
        return False
    f = entry.parts[0].fmt
    if f.element.name not in ELEMENTS or f.scale is None:
        return False
    if f.element.kind == "int":
        return f.scope == "block" and f.scale == f.zero_point and f.scale.name in ("fp16", "bf16")
    return f.zero_point is None


def decode_into(rows: torch.Tensor, entry: Entry, tensor_scales, group: int, out: torch.Tensor, t0: int = 0) -> None:
    """Decode packed rows uint8 [N, C, entry B] into out [C, T, W] (BF16 or float32) from token t0 on."""
    f = entry.parts[0].fmt
    n = entry.elements
    d = f.data_bytes(n)
    nrows, copies = rows.shape[:2]
    scale, pairs, block = torch.empty(0, 0, 0), 0, f.block
    if f.element.kind == "int":  # (s, mn) pairs of one 16-bit type after the codes, read by the loop itself
        pairs = 1 if f.scale.name == "fp16" else 2
    elif f.scope == "tensor":  # one FP32 scale, kept beside the rows
        s = tensor_scales[0].contiguous().view(torch.float32).reshape(1, 1, 1)
        scale, block = s.expand(nrows, copies, 1), n
    else:  # per block / per token scale bytes after the codes
        scale = decode_scale_bytes(rows[..., d:], f.scale)  # [N, C, nb]
        block = f.block if f.scope == "block" else n
        if f.tensor_scale is not None:  # NVFP4's second level, folded in as dequantize folds it
            scale = scale * tensor_scales[0].contiguous().view(torch.float32).reshape(())
    bf16 = out.dtype == torch.bfloat16
    dst = out.view(torch.int16).numpy().view(np.uint16) if bf16 else out.numpy()
    _rows(rows.numpy(), d, _table(f.element.name).numpy(), scale.numpy(), f.element.bits, block,
          group, t0, dst, bf16, pairs)
