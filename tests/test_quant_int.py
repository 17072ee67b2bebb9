"""Integer groups against optimum-quanto 0.2.7 (MaxOptimizer + quantize_affine), zero tolerance
(b in {2, 4}, G in {32, 64}, both axes), plus the constant-group definition and KIVI's cache layout."""
import pytest
import torch

from kvlab.formats import get_format
from kvlab.quant import QuantizeError, kivi_quantize, quantize, unpack_bits

quanto = pytest.importorskip("optimum.quanto", reason="optimum-quanto 0.2.7 is not installed")
from optimum.quanto.tensor.grouped import ungroup  # noqa: E402
from optimum.quanto.tensor.optimizers import MaxOptimizer  # noqa: E402

QTYPES = {2: quanto.qint2, 4: quanto.qint4}


def _data(seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(128, 128, generator=g)
    x[:, 5] *= 20  # an outlier channel
    return x


@pytest.mark.parametrize("bits", [2, 4])
@pytest.mark.parametrize("group", [32, 64])
@pytest.mark.parametrize("axis", ["token", "channel"])
def test_int_groups_match_quanto(bits, group, axis):
    x = _data(bits * group)
    q_axis = 0 if axis == "token" else -1  # quanto axis 0: G consecutive values of a row; -1: G rows of a column
    scale, shift = MaxOptimizer()(x, qtype=QTYPES[bits], axis=q_axis, group_size=group)
    data = torch.ops.quanto.quantize_affine(x, bits, q_axis, group, scale, shift)
    ref = ungroup(data, axis=q_axis, orig_shape=x.shape)
    q = quantize(x, f"int{bits}_g{group}", axis=axis)
    assert torch.equal(unpack_bits(q.codes, bits, 128), ref), "codes differ from optimum-quanto"
    # stored scale and zero point are quanto's fp32 s and -shift rounded to the table's FP16
    b = q.scales.reshape(*q.scales.shape[:-1], -1, 4)
    s, z = b[..., :2].contiguous().view(torch.float16).squeeze(-1), b[..., 2:].contiguous().view(torch.float16).squeeze(-1)
    if axis == "token":
        s_ref, z_ref = scale.reshape(128, -1), (-shift).reshape(128, -1)
    else:
        s_ref, z_ref = scale.reshape(128, -1).T, (-shift).reshape(128, -1).T
    assert torch.equal(s, s_ref.half()) and torch.equal(z, z_ref.half())


@pytest.mark.parametrize("fmt", ["int8", "int4", "int2"])
def test_constant_group_is_defined(fmt):
    x = torch.full((2, 64), 0.3)
    x[1, :32] = -7.0
    q = quantize(x, fmt)
    assert int(q.codes.sum()) == 0  # s = 0: every code is 0
    assert torch.equal(q.dequantize(), x.half().float())  # decodes to the stored zero point mn


def test_int_rejects_non_finite():
    x = torch.zeros(1, 32)
    x[0, 1] = float("nan")
    with pytest.raises(QuantizeError, match="finite"):
        quantize(x, "int4")


def test_channel_axis_needs_whole_token_groups():
    with pytest.raises(QuantizeError, match="tokens"):
        quantize(torch.randn(40, 32), "int4", axis="channel")


def test_kivi_split_bytes_and_residual():
    g = torch.Generator().manual_seed(0)
    k, v = torch.randn(2, 100, 64, generator=g), torch.randn(2, 100, 64, generator=g)
    kv = kivi_quantize(k, v, bits=2, group=32, residual=32)
    assert kv.k.shape == (2, 64, 64) and kv.k_residual.shape == (2, 36, 64)  # 64 quantized, 36 kept
    fmt = get_format("int2_g32")
    assert kv.nbytes == 2 * (2 * 64 * fmt.entry_bytes(64)) + 2 * 2 * 36 * 64 * 4
    k_hat, v_hat = kv.dequantize()
    assert torch.equal(k_hat[:, 64:], k[:, 64:]) and k_hat.shape == k.shape
    assert (k_hat - k).abs().max() < 2.0
