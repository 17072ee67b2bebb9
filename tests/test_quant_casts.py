"""Element casts against ml_dtypes and torchao, zero tolerance."""
import numpy as np
import pytest
import torch

from kvlab.formats import E4M3, E5M2
from kvlab.quant import decode_e2m1, encode_e2m1, encode_fp8, pack_bits, unpack_bits

ml_dtypes = pytest.importorskip("ml_dtypes", reason="ml_dtypes (oracle for element casts) is not installed")


def _torchao_f4():
    kernels = pytest.importorskip("torchao.prototype.mx_formats.kernels", reason="torchao 0.18 is not installed")
    return kernels.f32_to_f4_unpacked


def e2m1_inputs() -> torch.Tensor:
    grid = torch.arange(-8 * 4096, 8 * 4096 + 1, dtype=torch.float32) / 4096  # [-8, 8] step 2^-12
    ties = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    near = torch.cat([ties, torch.nextafter(ties, torch.zeros(())), torch.nextafter(ties, torch.full((), 9.0))])
    special = torch.tensor([0.0, -0.0, 1e-45, -1e-45, 1e-40, 1.17e-38, 6.0, 6.5, 7.0, 100.0, 3.4e38,
                            float("inf"), -float("inf")])
    g = torch.Generator().manual_seed(1)
    bits = torch.randint(-(2**31), 2**31 - 1, (1 << 18,), generator=g, dtype=torch.int64).to(torch.int32)
    rnd = bits.view(torch.float32)
    x = torch.cat([grid, near, -near, special, rnd])
    return x[~torch.isnan(x)]


def test_e2m1_matches_ml_dtypes_exhaustive_grid():
    x = e2m1_inputs()
    ours = encode_e2m1(x)
    ref = torch.from_numpy(x.numpy().astype(ml_dtypes.float4_e2m1fn).view(np.uint8).copy())
    assert torch.equal(ours, ref), f"{int((ours != ref).sum())} mismatches"


def test_e2m1_matches_torchao_including_nan():
    f4 = _torchao_f4()
    nan_bits = torch.tensor([0x7FC00000, 0x7FF00000, 0x7F800001, 0x7FFFFFFF, -0x400000, -1], dtype=torch.int32)
    x = torch.cat([e2m1_inputs(), torch.tensor([float("nan"), -float("nan")]), nan_bits.view(torch.float32)])
    assert torch.equal(encode_e2m1(x), f4(x))


def test_e2m1_nan_documented_difference_from_ml_dtypes():
    # kvlab follows torchao: NaN -> 0x3 (+ sign bit); ml_dtypes 0.6 gives 0x8 for +NaN.
    x = torch.tensor([float("nan"), -float("nan")])
    assert encode_e2m1(x).tolist() == [0x3, 0xB]
    assert x[:1].numpy().astype(ml_dtypes.float4_e2m1fn).view(np.uint8).tolist() == [0x8]


def test_e2m1_decode_roundtrip_all_codes():
    codes = torch.arange(16, dtype=torch.uint8)
    vals = decode_e2m1(codes)
    assert vals[:8].tolist() == [0, 0.5, 1, 1.5, 2, 3, 4, 6]
    again = encode_e2m1(vals)
    assert torch.equal(again, codes)  # -0.0 keeps its sign: code 0x8 round-trips


@pytest.mark.parametrize("bits", [2, 4, 8])
def test_pack_unpack_roundtrip_and_layout(bits):
    g = torch.Generator().manual_seed(bits)
    n = 8 // bits * 5 + 1  # odd length: the last byte is partly empty
    codes = torch.randint(0, 2**bits, (3, n), generator=g, dtype=torch.int64).to(torch.uint8)
    packed = pack_bits(codes, bits)
    assert packed.shape[-1] == -(-n * bits // 8)
    assert torch.equal(unpack_bits(packed, bits, n), codes)
    if bits == 4:  # even element in the low nibble
        assert torch.equal(packed[:, 0], codes[:, 0] | (codes[:, 1] << 4))


def test_pack_matches_kivi_int32_layout():
    # KIVI packs 32/b codes per int32, element j at bits [b j, b (j+1)) (jy-yuan/KIVI): our bytes,
    # read as little-endian int32 words, are that word.
    g = torch.Generator().manual_seed(3)
    for bits in (2, 4):
        per = 32 // bits
        codes = torch.randint(0, 2**bits, (4, 2 * per), generator=g, dtype=torch.int64)
        words = torch.zeros(4, 2, dtype=torch.int64)
        for j in range(per):
            words |= codes.reshape(4, 2, per)[..., j] << (bits * j)
        ours = pack_bits(codes.to(torch.uint8), bits).view(torch.int32).to(torch.int64) & 0xFFFFFFFF
        assert torch.equal(ours, words)


def fp8_inputs(element) -> torch.Tensor:
    g = torch.Generator().manual_seed(2)
    n = 1 << 18
    rnd = torch.randint(-(2**31), 2**31 - 1, (n,), generator=g, dtype=torch.int64).to(torch.int32).view(torch.float32)
    # random bit patterns focused on the format's range: exponents around [min subnormal, max]
    lo, hi = (127 - 12, 127 + 10) if element is E4M3 else (127 - 19, 127 + 17)
    exp = torch.randint(lo, hi, (n,), generator=g, dtype=torch.int32)
    man = torch.randint(0, 1 << 23, (n,), generator=g, dtype=torch.int32)
    sign = torch.randint(0, 2, (n,), generator=g, dtype=torch.int32) << 31
    focused = (sign | (exp << 23) | man).view(torch.float32)
    special = torch.tensor([0.0, -0.0, element.max, 464.0, 1e6, -1e6, float("inf"), -float("inf")])
    x = torch.cat([rnd, focused, special])
    return x[~torch.isnan(x)]


@pytest.mark.parametrize("element,npdt", [(E4M3, "float8_e4m3fn"), (E5M2, "float8_e5m2")])
def test_fp8_matches_ml_dtypes_after_clamp(element, npdt):
    x = fp8_inputs(element)
    ours = encode_fp8(x, element)
    ref_np = np.clip(x.numpy(), -element.max, element.max).astype(getattr(ml_dtypes, npdt)).view(np.uint8)
    ref = torch.from_numpy(ref_np.copy())
    assert torch.equal(ours, ref), f"{int((ours != ref).sum())} mismatches"


@pytest.mark.parametrize("element", [E4M3, E5M2])
def test_fp8_saturates_and_keeps_nan(element):
    x = torch.tensor([1e9, -1e9, float("inf"), -float("inf"), float("nan")])
    c = encode_fp8(x, element)
    top = 0x7E if element is E4M3 else 0x7B  # 448 / 57344
    assert c[:4].tolist() == [top, top | 0x80, top, top | 0x80]
    assert torch.isnan(c[4:].view(torch.float8_e4m3fn if element is E4M3 else torch.float8_e5m2).float()).all()
