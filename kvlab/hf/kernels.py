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


def _bf16(v, one, ubits):
    """BF16 bits of a float32, rounded to nearest even (c10's rule: NaN -> 0x7FC0)."""
    one[0] = v
    u = ubits[0]
    return 0x7FC0 if (u & 0x7FFFFFFF) > 0x7F800000 else (u + (((u >> 16) & 1) + 0x7FFF)) >> 16


def _codes(rows, r, c, lo, hi, bits, buf):
    """The codes of elements lo .. hi - 1 of row r, copy c into buf[0 .. hi - lo - 1] (lo starts a byte)."""
    k, byte = 0, (lo * bits) >> 3
    if bits == 8:
        for k in range(hi - lo):
            buf[k] = rows[r, c, byte + k]
    elif bits == 4:
        while k < hi - lo:
            x = rows[r, c, byte]
            buf[k] = x & 15
            buf[k + 1] = x >> 4
            k += 2
            byte += 1
    else:  # 2 bits
        while k < hi - lo:
            x = rows[r, c, byte]
            buf[k] = x & 3
            buf[k + 1] = (x >> 2) & 3
            buf[k + 2] = (x >> 4) & 3
            buf[k + 3] = x >> 6
            k += 4
            byte += 1


def _rows(rows, d, table, scale, bits, block, group, t0, out, bf16, pairs):
    """rows uint8 [N, C, entry B] (codes in the first d bytes); table float32 [2^bits] (code -> value);
    out [C, T, W] (uint16 BF16 bits when bf16, else float32). Scales: `pairs` 1 / 2 = (s, mn) FP16 / BF16
    pairs after the codes, one per block (integer groups); 0 = float32 `scale` [N, C, nb] given, no zero point.
    Group 1: element e of row r goes to token t0 + r, channel e. A key group (channel-major, its blocks are its
    channels, block == group): element j of block b goes to token t0 + r * group + j, channel b.
    Each block's codes are unpacked first; when a block has at least as many elements as there are codes
    (4-bit and 2-bit groups), each code's output (scaled, shifted, rounded) is computed once per block."""
    n_rows, copies, _ = rows.shape
    nb = scale.shape[2] if pairs == 0 else (rows.shape[2] - d) // 4
    n = nb * block if group > 1 else out.shape[2]
    ncodes = 1 << bits
    lookup = ncodes <= block
    buf = np.empty(block + 8, np.uint8)  # one block's codes (+ the tail of its last byte)
    tab = np.empty(ncodes, np.float32)  # a block's output per code
    tab16 = np.empty(ncodes, np.uint16)
    vals = np.empty(block, np.float32)
    one = np.empty(1, np.float32)  # a float's bits, through memory (numba has no scalar bit cast)
    ubits = one.view(np.uint32)
    for r in range(n_rows):
        for c in range(copies):
            for b in range(nb):
                if pairs:
                    o = d + 4 * b
                    s = _half(np.uint16(rows[r, c, o]) | (np.uint16(rows[r, c, o + 1]) << 8), pairs == 2)
                    mn = _half(np.uint16(rows[r, c, o + 2]) | (np.uint16(rows[r, c, o + 3]) << 8), pairs == 2)
                else:
                    s, mn = scale[r, c, b], np.float32(0)
                lo = b * block
                m = min(lo + block, n) - lo
                _codes(rows, r, c, lo, lo + m, bits, buf)
                if lookup:
                    for q in range(ncodes):
                        v = table[q] * s
                        tab[q] = v + mn if pairs else v  # no + 0: it would turn -0.0 into +0.0
                        if bf16:
                            tab16[q] = _bf16(tab[q], one, ubits)
                else:
                    for k in range(m):
                        v = table[buf[k]] * s
                        vals[k] = v + mn if pairs else v
                if group == 1:
                    t = t0 + r
                    if lookup and bf16:
                        for k in range(m):
                            out[c, t, lo + k] = tab16[buf[k]]
                    elif lookup:
                        for k in range(m):
                            out[c, t, lo + k] = tab[buf[k]]
                    elif bf16:
                        for k in range(m):
                            out[c, t, lo + k] = _bf16(vals[k], one, ubits)
                    else:
                        for k in range(m):
                            out[c, t, lo + k] = vals[k]
                else:  # block b is channel b of tokens t0 + r * group + k
                    t = t0 + r * group
                    if lookup and bf16:
                        for k in range(m):
                            out[c, t + k, b] = tab16[buf[k]]
                    elif lookup:
                        for k in range(m):
                            out[c, t + k, b] = tab[buf[k]]
                    elif bf16:
                        for k in range(m):
                            out[c, t + k, b] = _bf16(vals[k], one, ubits)
                    else:
                        for k in range(m):
                            out[c, t + k, b] = vals[k]


if ENABLED:
    _half = njit(cache=True, nogil=True)(_half)
    _bf16 = njit(cache=True, nogil=True)(_bf16)
    _codes = njit(cache=True, nogil=True)(_codes)
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


class Decoder:
    """The compiled decoder set up once for one stream's entry (its format's constants looked up once)."""

    def __init__(self, entry: Entry, group: int):
        f = entry.parts[0].fmt
        self.fmt, self.group = f, group
        self.n = entry.elements  # elements per entry (a key group: G x W)
        self.d = f.data_bytes(self.n)  # bytes of codes per entry
        self.table = _table(f.element.name).numpy()
        self.pairs = (1 if f.scale.name == "fp16" else 2) if f.element.kind == "int" else 0
        self.block = f.block if f.scope == "block" else self.n
        self.none = np.empty((0, 0, 0), np.float32)

    def __call__(self, rows: torch.Tensor, tensor_scales, out: torch.Tensor, t0: int = 0) -> None:
        """Decode packed rows uint8 [N, C, entry B] into out [C, T, W] (BF16 or float32) from token t0 on."""
        f = self.fmt
        if self.pairs:  # (s, mn) pairs of one 16-bit type after the codes, read by the loop itself
            scale = self.none
        elif f.scope == "tensor":  # one FP32 scale, kept beside the rows
            s = tensor_scales[0].contiguous().view(torch.float32).reshape(1, 1, 1)
            scale = s.expand(rows.shape[0], rows.shape[1], 1).numpy()
        else:  # per block / per token scale bytes after the codes
            sc = decode_scale_bytes(rows[..., self.d:], f.scale)  # [N, C, nb]
            if f.tensor_scale is not None:  # NVFP4's second level, folded in as dequantize folds it
                sc = sc * tensor_scales[0].contiguous().view(torch.float32).reshape(())
            scale = sc.numpy()
        bf16 = out.dtype == torch.bfloat16
        dst = out.view(torch.int16).numpy().view(np.uint16) if bf16 else out.numpy()
        _rows(rows.numpy(), self.d, self.table, scale, f.element.bits, self.block, self.group, t0, dst, bf16,
              self.pairs)


def decode_into(rows: torch.Tensor, entry: Entry, tensor_scales, group: int, out: torch.Tensor, t0: int = 0) -> None:
    """Decode packed rows uint8 [N, C, entry B] into out [C, T, W] (BF16 or float32) from token t0 on."""
    Decoder(entry, group)(rows, tensor_scales, out, t0)
