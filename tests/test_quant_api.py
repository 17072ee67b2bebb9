"""kvlab.quant.quantize: bytes equal the formats table, bad input, NaN / Inf, metrics, devices."""
import math

import pytest
import torch

from kvlab.errors import KvlabError, ParameterError, UnknownFormatError
from kvlab.formats import get_format, list_formats
from kvlab.attention.metrics import attention_error
from kvlab.quant import (QuantizeError, cosine, max_step_error, quantize, rel_error, sqnr,
                         vllm_kv_scales)

VARIANTS = ["int4_g64", "int2_g128", "fp8_e4m3_b64", "nvfp4_b32", "mxfp8_e4m3_b64_fp32"]
ALL = [f.name for f in list_formats()] + VARIANTS + ["fp8_e4m3_b64_ue8m0"]
SHAPES = [(3, 128), (2, 5, 64), (1, 512), (0, 128), (7, 256)]


def _x(shape, seed=0, dtype=torch.float32):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


@pytest.mark.parametrize("name", ALL)
def test_nbytes_equals_formats_table(name):
    fmt = get_format(name)
    for shape in SHAPES:
        if fmt.block and shape[-1] % fmt.block:
            continue
        q = quantize(_x(shape), fmt)
        vectors = math.prod(shape[:-1])
        assert q.nbytes == fmt.entry_bytes(shape[-1]) * vectors + fmt.tensor_bytes, (name, shape)
        assert q.codes.dtype == torch.uint8 and q.scales.dtype == torch.uint8
        assert q.dequantize().shape == shape


@pytest.mark.parametrize("name", ["nvfp4", "mxfp4", "int4", "int2", "fp8_e4m3_b128"])
def test_padding_is_explicit_and_not_stored(name):
    fmt = get_format(name)
    x = _x((4, fmt.block + 7))
    with pytest.raises(QuantizeError, match="not divisible"):
        quantize(x, fmt)
    q = quantize(x, fmt, pad=True)
    assert q.nbytes == 4 * fmt.entry_bytes(fmt.block + 7) + fmt.tensor_bytes
    assert q.dequantize().shape == x.shape
    assert sqnr(x, q.dequantize()) > 5


@pytest.mark.parametrize("name", ["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_unscaled_formats_store_raw_bytes(name, dtype):
    x = _x((3, 8, 16), dtype=dtype)
    q = quantize(x, name)
    target = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[name]
    assert torch.equal(q.codes, x.to(target).view(torch.uint8).reshape(3, 8, -1))
    assert q.dequantize().dtype == dtype
    if dtype == target or name == "fp32":
        assert torch.equal(q.dequantize(), x)  # lossless


def test_fp8_scopes_and_vllm_convention():
    k, v = _x((64, 128), 1) * 3, _x((64, 128), 2)
    k_scale, v_scale = vllm_kv_scales(k, v)
    assert k_scale == float(k.abs().max()) / 200 and v_scale == float(v.abs().max()) / 100
    q = quantize(k, "fp8_e4m3", scale=k_scale)
    ref = (k / k_scale).clamp(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8)
    assert torch.equal(q.codes, ref) and q.scales.view(torch.float32).item() == pytest.approx(k_scale)
    assert torch.equal(q.dequantize(), ref.view(torch.float8_e4m3fn).float() * torch.tensor(k_scale))
    t = quantize(k, "fp8_e4m3_token")
    assert torch.equal(t.scales.view(torch.float32).squeeze(-1), k.abs().amax(-1) / 448)
    b = quantize(k, "fp8_e4m3_b128")
    assert torch.equal(b.scales, t.scales)  # one block of 128 per 128-wide vector: the same scales
    assert max_step_error(k, q) <= 0.5 and max_step_error(k, t) <= 0.5


def test_fp8_nan_inf_documented():
    x = _x((2, 128))
    x[0, 0], x[1, 1] = float("inf"), float("nan")
    for name in ("fp8_e4m3", "fp8_e4m3_token", "fp8_e4m3_b128"):
        q = quantize(x, name)
        assert q.codes[0, 0] == 0x7E  # Inf saturates to 448; the scale comes from the finite values
        assert (q.codes[1, 1] & 0x7F) == 0x7F  # NaN stays NaN
        d = q.dequantize()
        assert torch.isfinite(d[0]).all() and torch.isnan(d[1, 1])
        assert sqnr(x[0, 1:], d[0, 1:]) > 25


def test_empty_tensors():
    for name in ("nvfp4_2level", "fp8_e4m3", "int4", "bf16"):
        fmt = get_format(name)
        q = quantize(torch.zeros(0, 64), name)
        assert q.nbytes == fmt.tensor_bytes and q.dequantize().shape == (0, 64)


@pytest.mark.parametrize("bad,err,match", [
    (torch.zeros(2, 32, dtype=torch.int32), TypeError, "dtype"),
    (torch.zeros(2, 32, dtype=torch.float64), TypeError, "dtype"),
    ([1.0, 2.0], TypeError, "torch.Tensor"),
    (torch.tensor(1.0), KvlabError, "0-dim"),
])
def test_bad_input_types(bad, err, match):
    with pytest.raises(err, match=match):
        quantize(bad, "nvfp4")


def test_bad_names_and_options():
    x = _x((2, 32))
    with pytest.raises(UnknownFormatError, match="fp5"):
        quantize(x, "fp5")
    assert issubclass(UnknownFormatError, ValueError)
    with pytest.raises(ParameterError, match="recipe"):
        quantize(x, "nvfp4", recipe="cutlass")
    with pytest.raises(ParameterError, match="recipe"):
        quantize(x, "mxfp4", recipe="modelopt")
    with pytest.raises(ParameterError, match="scale_rule"):
        quantize(x, "nvfp4", scale_rule="rceil")
    with pytest.raises(ParameterError, match="axis"):
        quantize(x, "fp8_e4m3", axis="channel")
    with pytest.raises(ParameterError, match="scale"):
        quantize(x, "fp8_e4m3", scale=0.0)
    with pytest.raises(ParameterError, match="global_scale"):
        quantize(x, "nvfp4", global_scale=1.0)
    with pytest.raises(TypeError):
        quantize(x, "nvfp4", blocksize=16)


def test_metrics():
    x = _x((256, 64))
    assert sqnr(x, x) == math.inf and rel_error(x, x) == 0 and cosine(x, x) == pytest.approx(1.0)
    noise = _x((256, 64), 9) * 0.1
    y = x + noise
    assert sqnr(x, y) == pytest.approx(10 * math.log10(float((x.double() ** 2).sum() / (noise.double() ** 2).sum())))
    assert rel_error(x, y) == pytest.approx(10 ** (-sqnr(x, y) / 20))
    k, v = _x((2, 64, 32), 3), _x((2, 64, 32), 4)
    assert attention_error(k, v, k, v) == 0
    kq, vq = quantize(k, "nvfp4").dequantize(), quantize(v, "nvfp4").dequantize()
    e4, e8 = attention_error(k, v, kq, vq), attention_error(k, v, quantize(k, "fp8_e4m3").dequantize(),
                                                           quantize(v, "fp8_e4m3").dequantize())
    assert 0 < e8 < e4 < 0.2
    with pytest.raises(ValueError, match="shapes"):
        sqnr(x, x[:1])


@pytest.mark.parametrize("name,lo,hi", [("nvfp4", 19.9, 20.9), ("mxfp4", 18.3, 19.3), ("mxfp8_e4m3", 30.1, 31.1),
                                        ("fp8_e4m3", 31.1, 32.1), ("fp8_e5m2", 25.1, 26.1), ("int4", 21.6, 22.6),
                                        ("int2", 7.6, 8.6)])
def test_sqnr_matches_expected_figures_on_gaussian(name, lo, hi):
    # SQNR measured on CPU for Gaussian 4096 x 128 with torchao / optimum-quanto (here 1024 x 128; +-0.5 dB)
    x = _x((1024, 128), 7)
    assert lo < sqnr(x, quantize(x, name).dequantize()) < hi


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here")
@pytest.mark.parametrize("name", ["nvfp4", "nvfp4_2level", "mxfp4", "mxfp8_e4m3", "fp8_e4m3", "int4", "int2"])
def test_cuda_matches_cpu(name):
    x = _x((64, 256), 5)
    a, b = quantize(x, name), quantize(x.cuda(), name)
    assert torch.equal(a.codes, b.codes.cpu()) and torch.equal(a.scales, b.scales.cpu())
    assert torch.equal(a.dequantize(), b.dequantize().cpu())


@pytest.mark.parametrize("name", ["bf16_b32", "int4_g32_ue8m0", "fp8_e4m3_b32_e4m3", "int4_g32_e4m3"])
def test_unsupported_combinations_are_named(name):
    with pytest.raises(QuantizeError, match="no quantizer"):
        quantize(_x((2, 64)), name)


def test_fp8_ue8m0_blocks_round_the_scale_up():
    # fp8_e4m3_b64_ue8m0 (DeepSeek V4 style) defaults to the RCEIL rule: no clipping
    x = _x((16, 128), 11) * 5
    q = quantize(x, "fp8_e4m3_b64_ue8m0")
    assert q.options["scale_rule"] == "rceil" and max_step_error(x, q) <= 0.5
    assert quantize(x, "fp8_e4m3_b64_ue8m0", scale_rule="floor").options["scale_rule"] == "floor"
