"""MX formats against torchao 0.18 `to_mx`, FLOOR and RCEIL, zero tolerance."""
import pytest
import torch

from kvlab.quant import max_step_error, quantize
from quant_data import distributions

mx = pytest.importorskip("torchao.prototype.mx_formats.mx_tensor", reason="torchao 0.18 is not installed")
config = pytest.importorskip("torchao.prototype.mx_formats.config", reason="torchao 0.18 is not installed")

DATA = distributions()
ELEM = {"mxfp4": torch.float4_e2m1fn_x2, "mxfp8_e4m3": torch.float8_e4m3fn, "mxfp8_e5m2": torch.float8_e5m2}
MODE = {"floor": config.ScaleCalculationMode.FLOOR, "rceil": config.ScaleCalculationMode.RCEIL}


@pytest.mark.parametrize("rule", ["floor", "rceil"])
@pytest.mark.parametrize("fmt", list(ELEM))
@pytest.mark.parametrize("name", list(DATA))
def test_mx_matches_torchao(name, fmt, rule):
    x = DATA[name]
    s_ref, d_ref = mx.to_mx(x.clone(), ELEM[fmt], 32, MODE[rule])
    q = quantize(x, fmt, scale_rule=rule)
    s_ref, d_ref = s_ref.view(torch.uint8), d_ref.view(torch.uint8)
    assert torch.equal(q.scales, s_ref), f"{int((q.scales != s_ref).sum())} scale mismatches"
    assert torch.equal(q.codes, d_ref), f"{int((q.codes != d_ref).sum())} code mismatches"


def test_floor_is_default_and_can_clip_rceil_does_not():
    x = DATA["gaussian"]
    assert quantize(x, "mxfp4").options["scale_rule"] == "floor"
    assert max_step_error(x, quantize(x, "mxfp8_e4m3")) > 0.5  # FLOOR: scaled values reach 512 > 448
    for fmt in ELEM:
        assert max_step_error(x, quantize(x, fmt, scale_rule="rceil")) <= 0.5


def test_e8m0_edge_bytes():
    x = torch.zeros(3, 32)
    x[1, 0] = float("nan")
    x[2, 0] = 1e-40  # subnormal amax
    q = quantize(x, "mxfp4")
    assert q.scales[:, 0].tolist() == [0, 255, 0]
    assert torch.isnan(q.dequantize()[1]).all()


@pytest.mark.parametrize("rule", ["floor", "rceil"])
def test_ue8m0_fp8_blocks_of_64_match_torchao(rule):
    x = DATA["student_t"]
    s_ref, d_ref = mx.to_mx(x.clone(), torch.float8_e4m3fn, 64, MODE[rule])
    q = quantize(x, "fp8_e4m3_b64_ue8m0", scale_rule=rule)
    assert torch.equal(q.scales, s_ref.view(torch.uint8)) and torch.equal(q.codes, d_ref.view(torch.uint8))


@pytest.mark.parametrize("fmt", list(ELEM))
def test_bf16_input_matches_torchao(fmt):
    x = DATA["wide_range"].clamp(-1e30, 1e30).bfloat16()
    s_ref, d_ref = mx.to_mx(x.clone(), ELEM[fmt], 32, MODE["floor"])
    q = quantize(x, fmt)
    assert torch.equal(q.scales, s_ref.view(torch.uint8)) and torch.equal(q.codes, d_ref.view(torch.uint8))
