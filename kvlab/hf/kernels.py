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
Values are computed a block at a time and rounded to BF16 in branch-free passes over arrays (numba has no
scalar bit cast; a per-value round trip through memory kept the loop scalar). Where one scale covers many
more values than there are codes (4-bit and 2-bit KIVI key groups, one scale per tensor) every code's
output is computed once per scale and the codes are looked up: a key group's tables for all its channels
first, then its tokens written one after another, each token's channels side by side.
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


def _half(h, bf, one, ubits):
    """A 16-bit float's bits (uint16) -> float32, exactly: BF16 when bf, else IEEE FP16 (`one` / `ubits`:
    a float32 scratch and its uint32 view, numba having no scalar bit cast; no allocation per call)."""
    if bf:
        ubits[0] = np.uint32(h) << 16
        return one[0]
    e, m = (h >> 10) & 0x1F, h & 0x3FF
    if e == 31:
        v = np.float32(np.inf) if m == 0 else np.float32(np.nan)
    elif e == 0:
        v = np.float32(m) * np.float32(2.0 ** -24)
    else:
        v = np.float32(1024 + m) * np.float32(2.0 ** (e - 25))
    return -v if h & 0x8000 else v


def _to_bf16(u32, dst, n):
    """BF16 bits of the float32 values whose bits are u32[:n], rounded to nearest even (c10's rule: NaN ->
    0x7FC0), into dst[:n]; one branch-free pass over an array, which the compiler vectorizes."""
    for i in range(n):
        u = u32[i]
        dst[i] = 0x7FC0 if (u & 0x7FFFFFFF) > 0x7F800000 else (u + (((u >> 16) & 1) + 0x7FFF)) >> 16


def _codes(src, lo, m, bits, buf):
    """The codes of elements lo .. lo + m - 1 of one entry's bytes `src` into buf[:m] (lo starts a byte)."""
    byte = (lo * bits) >> 3
    if bits == 8:
        for k in range(m):
            buf[k] = src[byte + k]
    elif bits == 4:
        for j in range((m + 1) >> 1):
            x = src[byte + j]
            buf[2 * j] = x & 15
            buf[2 * j + 1] = x >> 4
    else:  # 2 bits
        for j in range((m + 3) >> 2):
            x = src[byte + j]
            buf[4 * j] = x & 3
            buf[4 * j + 1] = (x >> 2) & 3
            buf[4 * j + 2] = (x >> 4) & 3
            buf[4 * j + 3] = x >> 6


def _spread(src, tab, bits, step, nb, dst, t):
    """A key group's codes (channel-major: channel b's tokens in bytes b * step ..) to tokens t, t + 1, ..
    of dst [T, W] through per-channel tables tab [nb, codes]: token by token, each token's channels side by
    side (contiguous writes), one 4-bit / 2-bit code position at a time (constant shifts)."""
    if bits == 4:
        for j in range(step):
            for b in range(nb):
                dst[t + 2 * j, b] = tab[b, src[j + b * step] & 15]
            for b in range(nb):
                dst[t + 2 * j + 1, b] = tab[b, src[j + b * step] >> 4]
    else:  # 2 bits
        for j in range(step):
            for b in range(nb):
                dst[t + 4 * j, b] = tab[b, src[j + b * step] & 3]
            for b in range(nb):
                dst[t + 4 * j + 1, b] = tab[b, (src[j + b * step] >> 2) & 3]
            for b in range(nb):
                dst[t + 4 * j + 2, b] = tab[b, (src[j + b * step] >> 4) & 3]
            for b in range(nb):
                dst[t + 4 * j + 3, b] = tab[b, src[j + b * step] >> 6]


def _channels(rows, d, table, bits, group, nb, t0, out, bf16, pairs):
    """Integer key groups of 4 or 2 bits (a channel-major entry whose blocks are its channels, block ==
    group): per row, every channel's (s, mn) pair, then its table of every code's output (table * s + mn,
    rounded to BF16 in one vectorized pass), then the codes spread token-major through the tables."""
    n_rows, copies, _ = rows.shape
    ncodes = 1 << bits
    step = (group * bits) >> 3  # bytes per channel
    sm = np.empty(2 * nb, np.float32)  # (s, mn) per channel
    smu = sm.view(np.uint32)
    one = np.empty(1, np.float32)
    ubits = one.view(np.uint32)
    tab = np.empty(nb * ncodes, np.float32)  # [nb * codes] every code's output per channel
    tabu = tab.view(np.uint32)
    tab16 = np.empty(nb * ncodes, np.uint16)
    t2, t16 = tab.reshape(nb, ncodes), tab16.reshape(nb, ncodes)
    for r in range(n_rows):
        for c in range(copies):
            src = rows[r, c]
            for i in range(2 * nb):
                h = np.uint32(src[d + 2 * i]) | (np.uint32(src[d + 2 * i + 1]) << 8)
                if pairs == 2:
                    smu[i] = h << 16  # BF16 -> float32: the same bits, shifted
                else:
                    sm[i] = _half(h, False, one, ubits)
            for b in range(nb):
                s, mn = sm[2 * b], sm[2 * b + 1]
                for q in range(ncodes):
                    tab[b * ncodes + q] = table[q] * s + mn
            t = t0 + r * group
            if bf16:
                _to_bf16(tabu, tab16, nb * ncodes)
                _spread(src, t16, bits, step, nb, out[c], t)
            else:
                _spread(src, t2, bits, step, nb, out[c], t)


def _rows(rows, d, table, scale, bits, block, group, t0, out, bf16, pairs, uniform):
    """rows uint8 [N, C, entry B] (codes in the first d bytes); table float32 [2^bits] (code -> value);
    out [C, T, W] (uint16 BF16 bits when bf16, else float32). Scales: `pairs` 1 / 2 = (s, mn) FP16 / BF16
    pairs after the codes, one per block (integer groups); 0 = float32 `scale` [N, C, nb] given, no zero
    point (`uniform`: one scale for every block, a per-tensor scale).
    Group 1: element e of row r goes to token t0 + r, channel e. A key group (channel-major, its blocks are its
    channels, block == group): element j of block b goes to token t0 + r * group + j, channel b.
    Each value is table[code] * s (+ mn), rounded to BF16 in vectorized passes. Where a scale covers many
    more values than there are codes (4-bit and 2-bit key groups: _channels; a per-tensor scale), each
    code's output is computed once per scale and the codes are looked up."""
    n_rows, copies, _ = rows.shape
    nb = scale.shape[2] if pairs == 0 else (rows.shape[2] - d) // 4
    ncodes = 1 << bits
    if group > 1 and pairs and bits in (2, 4) and ncodes <= block:
        _channels(rows, d, table, bits, group, nb, t0, out, bf16, pairs)
        return
    n = nb * block if group > 1 else out.shape[2]
    buf = np.empty(block + 8, np.uint8)  # one block's codes (+ the tail of its last byte)
    vals = np.empty(block, np.float32)  # one block's values
    valu = vals.view(np.uint32)
    vals16 = np.empty(block, np.uint16)
    one = np.empty(1, np.float32)
    ubits = one.view(np.uint32)
    tab = np.empty(ncodes, np.float32)  # uniform: every code's output
    tab16 = np.empty(ncodes, np.uint16)
    if uniform and n_rows:
        s = scale[0, 0, 0]
        for q in range(ncodes):
            tab[q] = table[q] * s
        _to_bf16(tab.view(np.uint32), tab16, ncodes)
        if bits == 8 and group == 1:  # FP8 per tensor: a byte is a code, looked up straight into place
            for r in range(n_rows):
                for c in range(copies):
                    src, dst = rows[r, c], out[c, t0 + r]
                    if bf16:
                        for k in range(n):
                            dst[k] = tab16[src[k]]
                    else:
                        for k in range(n):
                            dst[k] = tab[src[k]]
            return
    for r in range(n_rows):
        for c in range(copies):
            src = rows[r, c]
            dst = out[c]
            for b in range(nb):
                lo = b * block
                m = min(lo + block, n) - lo
                _codes(src, lo, m, bits, buf)
                t = t0 + r if group == 1 else t0 + r * group
                if uniform and bf16:
                    for k in range(m):
                        dst[t, lo + k] = tab16[buf[k]]
                    continue
                if uniform:
                    for k in range(m):
                        dst[t, lo + k] = tab[buf[k]]
                    continue
                if pairs:
                    s = _half(np.uint16(src[d + 4 * b]) | (np.uint16(src[d + 4 * b + 1]) << 8), pairs == 2,
                              one, ubits)
                    mn = _half(np.uint16(src[d + 4 * b + 2]) | (np.uint16(src[d + 4 * b + 3]) << 8), pairs == 2,
                               one, ubits)
                    for k in range(m):
                        vals[k] = table[buf[k]] * s + mn
                else:
                    s = scale[r, c, b]
                    for k in range(m):
                        vals[k] = table[buf[k]] * s  # no + 0: it would turn -0.0 into +0.0
                if bf16:
                    _to_bf16(valu, vals16, m)
                if group == 1 and bf16:
                    for k in range(m):
                        dst[t, lo + k] = vals16[k]
                elif group == 1:
                    for k in range(m):
                        dst[t, lo + k] = vals[k]
                elif bf16:  # block b is channel b of tokens t .. t + m - 1
                    for k in range(m):
                        dst[t + k, b] = vals16[k]
                else:
                    for k in range(m):
                        dst[t + k, b] = vals[k]


if ENABLED:
    _half = njit(cache=True, nogil=True)(_half)
    _to_bf16 = njit(cache=True, nogil=True)(_to_bf16)
    _codes = njit(cache=True, nogil=True)(_codes)
    _spread = njit(cache=True, nogil=True)(_spread)
    _channels = njit(cache=True, nogil=True)(_channels)
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
        self.uniform = f.scope == "tensor"  # one scale for the whole tensor
        self.bits = f.element.bits
        self.none = np.empty((0, 0, 0), np.float32)

    def __call__(self, rows: torch.Tensor, tensor_scales, out: torch.Tensor, t0: int = 0) -> None:
        """Decode packed rows uint8 [N, C, entry B] into out [C, T, W] (BF16 or float32) from token t0 on."""
        dst = out.view(torch.int16).numpy().view(np.uint16) if out.dtype == torch.bfloat16 else out.numpy()
        self.decode(rows.numpy(), tensor_scales, dst, t0)

    def decode(self, rows: np.ndarray, tensor_scales, dst: np.ndarray, t0: int = 0) -> None:
        """The same on numpy arrays (a cache's step calls it with views it keeps): rows uint8 [N, C, entry B],
        dst [C, T, W] uint16 (BF16 bits) or float32."""
        if self.pairs:  # (s, mn) pairs of one 16-bit type after the codes, read by the loop itself
            scale = self.none
        elif self.uniform:  # one FP32 scale, kept beside the rows (pinned at the first write): [1, 1, 1]
            scale = tensor_scales[0].contiguous().numpy().view(np.float32).reshape(1, 1, 1)
        else:  # per block / per token scale bytes after the codes, decoded for this call only
            f = self.fmt
            sc = decode_scale_bytes(torch.from_numpy(rows)[..., self.d:], f.scale)  # [N, C, nb]
            if f.tensor_scale is not None:  # NVFP4's second level, folded in as dequantize folds it
                sc = sc * tensor_scales[0].contiguous().view(torch.float32).reshape(())
            scale = sc.numpy()
        _rows(rows, self.d, self.table, scale, self.bits, self.block, self.group, t0, dst, dst.dtype == np.uint16,
              self.pairs, self.uniform)


def decode_into(rows: torch.Tensor, entry: Entry, tensor_scales, group: int, out: torch.Tensor, t0: int = 0) -> None:
    """Decode packed rows uint8 [N, C, entry B] into out [C, T, W] (BF16 or float32) from token t0 on."""
    Decoder(entry, group)(rows, tensor_scales, out, t0)
