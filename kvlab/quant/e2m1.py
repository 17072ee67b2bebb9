"""E2M1 (FP4) casts and sub-byte packing.

Encoding (OCP MX spec; values 0, .5, 1, 1.5, 2, 3, 4, 6): code = sign bit (bit 3) + 3 magnitude
bits. Rounding is to nearest with ties to the even code, and it saturates: anything above 5
(including +-Inf) becomes +-6. The sign is taken from the float's sign bit, so -0.0 and small
negatives that round to zero give code 0x8. NaN follows torchao's `f32_to_f4_unpacked`, whose
normal-range bit arithmetic runs on the NaN's bits: magnitude 2, 3 or 4 depending on the
payload (0x3 for the default quiet NaN 0x7FC00000, 0x4 for the 0x7FF00000 that an E4M3 NaN
scale becomes), with its sign bit. ml_dtypes 0.6 `float4_e2m1fn` gives 0x8 for +NaN instead.
"""
from __future__ import annotations

import torch

# Magnitude codes 0..7 decode to these values.
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
# Midpoints between neighbouring magnitudes. A tie goes to the even code, so midpoints
# whose upper neighbour has an even code are moved one float down: then the number of
# boundaries strictly below |x| is the RNE code (and saturation at 6 comes for free).
_MIDPOINTS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
_CACHE: dict[torch.device, torch.Tensor] = {}  # decode tables per device


def _bounds() -> list[float]:
    mids = torch.tensor(_MIDPOINTS, dtype=torch.float32)
    up_even = torch.tensor([(i + 1) % 2 == 0 for i in range(7)])
    return torch.where(up_even, torch.nextafter(mids, torch.zeros(())), mids).tolist()


BOUNDS = _bounds()  # fp32 values (exact as Python floats)


def _table(device: torch.device) -> torch.Tensor:
    """Signed decode table for all 16 codes, cached per device."""
    if device not in _CACHE:
        v = torch.tensor(E2M1_VALUES, dtype=torch.float32)
        _CACHE[device] = torch.cat([v, -v]).to(device)
    return _CACHE[device]


def encode_e2m1(x: torch.Tensor, has_nan: bool | None = None) -> torch.Tensor:
    """fp32 -> E2M1 codes, one per uint8 (low nibble), RNE and saturating.
    `has_nan`: whether x may hold NaN (None: check); callers that know skip a pass."""
    x = x.float()
    a = x.abs()
    mag = torch.gt(a, BOUNDS[0]).view(torch.uint8)  # count of boundaries below |x|
    for b in BOUNDS[1:]:
        mag += torch.gt(a, b).view(torch.uint8)
    if has_nan is None or has_nan:
        nan = torch.isnan(a)
        if bool(nan.any()):
            mag[nan] = _nan_codes(x[nan])
    return mag | torch.bitwise_left_shift(torch.signbit(x).view(torch.uint8), 3)


def _nan_codes(x: torch.Tensor) -> torch.Tensor:
    """torchao's code for NaN inputs: its normal-path rounding applied to the NaN's bits
    (exponent rebias by 126, round-half-even adder, take the top bits, keep the low byte)."""
    u = x.view(torch.int32) & 0x7FFFFFFF
    odd = torch.bitwise_right_shift(u, 22) & 1
    v = torch.bitwise_right_shift(u - (126 << 23) + ((1 << 21) - 1) + odd, 22)
    return (v & 0xFF).to(torch.uint8)


def decode_e2m1(codes: torch.Tensor) -> torch.Tensor:
    """E2M1 codes (uint8, low nibble) -> fp32 values."""
    return _table(codes.device)[(codes & 0xF).long()]


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
    # the lowest code needs no shift and the highest no mask
    parts = [packed & mask] + [torch.bitwise_right_shift(packed, bits * j) & mask for j in range(1, per - 1)]
    parts.append(torch.bitwise_right_shift(packed, bits * (per - 1)))
    return torch.stack(parts, dim=-1).reshape(*packed.shape[:-1], -1)[..., :n]
