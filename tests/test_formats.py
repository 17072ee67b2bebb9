from fractions import Fraction

import pytest

from kvlab.errors import UnknownFormatError
from kvlab.formats import FORMATS, get_format, list_formats


@pytest.mark.parametrize("name,n,expected", [
    ("bf16", 128, 256), ("fp16", 128, 256), ("fp32", 128, 512),
    ("fp8_e4m3", 128, 128), ("fp8_e5m2", 128, 128),  # per-tensor scale: not per entry
    ("fp8_e4m3_token", 128, 132),
    ("fp8_e4m3_b128", 512, 528), ("fp8_e4m3_b128", 128, 132),  # DeepSeek V3.2 latent / indexer key
    ("fp8_e4m3_b64_ue8m0", 448, 455),  # V4 NoPE part: 448 + 7 scales
    ("nvfp4", 16, 9), ("nvfp4", 512, 288),  # a 512-element NVFP4 entry is 288 B
    ("mxfp4", 32, 17), ("mxfp4", 128, 68),  # a 128-element MXFP4 entry is 68 B
    ("mxfp8_e4m3", 32, 33), ("mxfp8_e5m2", 128, 132),
    ("int8", 32, 36), ("int4", 32, 20), ("int2", 32, 12), ("int4_g64", 128, 72), ("int2_g128", 128, 36),
])
def test_entry_bytes(name, n, expected):
    assert get_format(name).entry_bytes(n) == expected


@pytest.mark.parametrize("name,bits", [("nvfp4", Fraction(9, 2)), ("mxfp4", Fraction(17, 4)),
                                       ("mxfp8_e4m3", Fraction(33, 4)), ("bf16", 16), ("int4", 5), ("int2", 3)])
def test_bits_per_element(name, bits):
    assert get_format(name).bits_per_element() == bits


def test_tensor_scales_are_constant():
    f = get_format("fp8_e4m3")
    assert f.tensor_bytes == 4 and f.nbytes(1000) == 1004
    two = get_format("nvfp4_2level")
    assert two.entry_bytes(512) == 288 and two.tensor_bytes == 4


@pytest.mark.parametrize("f", list_formats(), ids=lambda f: f.name)
def test_bytes_add_up(f):
    for n in (1, 16, 31, 32, 128, 512, 1000):
        assert f.entry_bytes(n) == f.data_bytes(n) + f.scale_bytes(n)
        assert f.data_bytes(n) * 8 >= n * f.element.bits > (f.data_bytes(n) - 1) * 8


def test_aliases_and_variants():
    assert get_format("MXFP8") is FORMATS["mxfp8_e4m3"]
    v = get_format("fp8_e4m3_b64_ue8m0")
    assert v.block == 64 and v.scale.name == "e8m0"
    g = get_format("int4_g64")
    assert g.block == 64 and g.zero_point is not None


@pytest.mark.parametrize("bad", ["fp5", "nvfp4_g0x", "", "e8m0_g32"])
def test_unknown_format(bad):
    with pytest.raises(UnknownFormatError, match="unknown number format"):
        get_format(bad)


def test_format_name_type():
    with pytest.raises(UnknownFormatError):
        get_format(3)
