"""E2M1 (FP4) casts and sub-byte packing.

Encoding (OCP MX spec; values 0, .5, 1, 1.5, 2, 3, 4, 6): code = sign bit (bit 3) + 3 magnitude
bits. Rounding is to nearest with ties to the even code, and it saturates: anything above 5
(including +-Inf) becomes +-6. The sign is taken from the float's sign bit, so -0.0 and small
negatives that round to zero give code 0x8. NaN gives 0x3 with its sign bit (torchao's
`f32_to_f4_unpacked` does the same; ml_dtypes gives 0x8 for +NaN instead; formats.md).
"""
from __future__ import annotations

import torch

# Magnitude codes 0..7 decode to these values.
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
# Midpoints between neighbouring magnitudes. A tie goes to the even code, so midpoints
# whose upper neighbour has an even code are moved one float down: then "count of
# boundaries strictly below |x|" (torch.bucketize, right=False) is the RNE code.
_MIDPOINTS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
_CACHE: dict[tuple[str, torch.device], torch.Tensor] = {}


def _table(kind: str, device: torch.device) -> torch.Tensor:
    key = (kind, device)
    if key not in _CACHE:
        if kind == "bounds":
            mids = torch.tensor(_MIDPOINTS, dtype=torch.float32)
            up_even = torch.tensor([(i + 1) % 2 == 0 for i in range(7)])
            t = torch.where(up_even, torch.nextafter(mids, torch.zeros(())), mids)
        else:  # signed decode table for all 16 codes
            v = torch.tensor(E2M1_VALUES, dtype=torch.float32)
            t = torch.cat([v, -v])
        _CACHE[key] = t.to(device)
    return _CACHE[key]


def encode_e2m1(x: torch.Tensor) -> torch.Tensor:
    """fp32 -> E2M1 codes, one per uint8 (low nibble), RNE and saturating."""
    x = x.float()
    sign = (torch.bitwise_right_shift(x.view(torch.int32), 28) & 8).to(torch.uint8)
    a = x.abs()
    mag = torch.bucketize(a, _table("bounds", x.device), out_int32=True).to(torch.uint8)
    mag = torch.where(torch.isnan(a), 3, mag).to(torch.uint8)
    return mag | sign


def decode_e2m1(codes: torch.Tensor) -> torch.Tensor:
    """E2M1 codes (uint8, low nibble) -> fp32 values."""
    return _table("values", codes.device)[(codes & 0xF).long()]


def pack_bits(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Pack b-bit codes (uint8 [..., n]) into bytes [..., ceil(n b / 8)]: element j of each byte
    group sits at bits [b j, b (j + 1)), i.e. the even element in the low nibble for b = 4.
    Viewed as little-endian int32 words this is KIVI's packing (element j at bits b j)."""
    if bits == 8:
        return codes.to(torch.uint8)
    per = 8 // bits
    n = codes.shape[-1]
    pad = (-n) % per
    if pad:
        codes = torch.nn.functional.pad(codes, (0, pad))
    c = codes.reshape(*codes.shape[:-1], -1, per)  # [..., n/per, per]
    out = c[..., 0].clone()
    for j in range(1, per):
        out |= torch.bitwise_left_shift(c[..., j], bits * j)
    return out


def unpack_bits(packed: torch.Tensor, bits: int, n: int) -> torch.Tensor:
    """Inverse of `pack_bits`: bytes [..., m] -> codes uint8 [..., n]."""
    if bits == 8:
        return packed[..., :n]
    per = 8 // bits
    mask = (1 << bits) - 1
    parts = [torch.bitwise_right_shift(packed, bits * j) & mask for j in range(per)]
    return torch.stack(parts, dim=-1).reshape(*packed.shape[:-1], -1)[..., :n]
