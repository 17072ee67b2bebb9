"""NVFP4 against torchao 0.18 `nvfp4_quantize`, single and two level, zero tolerance,
and the documented ModelOpt / TransformerEngine differences. Single level refuses finite values beyond 2,688
(tests/test_bad_input.py), so its comparisons run on data within that range (Inf and NaN included)."""
import pytest
import torch

from kvlab.quant import quantize
from quant_data import distributions

nvfp4_mod = pytest.importorskip("torchao.prototype.mx_formats.nvfp4_tensor", reason="torchao 0.18 is not installed")

DATA = distributions()


def _ours(x, fmt="nvfp4", **kw):
    q = quantize(x, fmt, **kw)
    return q.scales, q.codes, q


def _in_range(x):
    """Finite values clipped to single level's 2,688 (6 x 448) as torchao would; kvlab refuses beyond it."""
    return torch.where(torch.isfinite(x), x.clamp(-2688.0, 2688.0), x)


@pytest.mark.parametrize("name", list(DATA))
def test_single_level_matches_torchao(name):
    x = _in_range(DATA[name])
    s_ref, d_ref = nvfp4_mod.nvfp4_quantize(x.clone())
    s, c, _ = _ours(x)
    assert torch.equal(s, s_ref.view(torch.uint8)), f"{int((s != s_ref.view(torch.uint8)).sum())} scale mismatches"
    assert torch.equal(c, d_ref.view(torch.uint8)), f"{int((c != d_ref.view(torch.uint8)).sum())} code mismatches"


@pytest.mark.parametrize("name", list(DATA))
def test_two_level_matches_torchao(name):
    x = DATA[name]
    s, c, q = _ours(x, "nvfp4_2level")
    g = q.global_scale.view(torch.float32)  # ours: finite amax / (448 x 6); torchao takes it as input
    s_ref, d_ref = nvfp4_mod.nvfp4_quantize(x.clone(), per_tensor_scale=g)
    assert torch.equal(s, s_ref.view(torch.uint8))
    assert torch.equal(c, d_ref.view(torch.uint8))


def test_two_level_global_scale_is_torchaos():
    x = DATA["gaussian"]
    q = quantize(x, "nvfp4_2level")
    ref = nvfp4_mod.per_tensor_amax_to_scale(x.abs().amax())
    assert torch.equal(q.global_scale.view(torch.float32), ref.reshape(1))


def test_bf16_input_matches_torchao():
    x = DATA["student_t"].bfloat16()
    s_ref, d_ref = nvfp4_mod.nvfp4_quantize(x.clone())
    s, c, _ = _ours(x)
    assert torch.equal(s, s_ref.view(torch.uint8)) and torch.equal(c, d_ref.view(torch.uint8))


def tie_order_blocks() -> torch.Tensor:
    """For each normal E4M3 scale s: a block anchor 6 s (so the block scale is s) and the inputs
    fl(t s) and its neighbours one ulp away for every FP4 tie t, both signs."""
    ties = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    rows = []
    for b in range(0x08, 0x7F):
        s = torch.tensor([b], dtype=torch.uint8).view(torch.float8_e4m3fn).float()
        v = ties * s
        cand = torch.cat([v, torch.nextafter(v, torch.zeros(())), torch.nextafter(v, torch.full((), 1e9))])
        cand = torch.cat([cand, -cand])  # 42 values
        for chunk in cand.split(15):
            blk = torch.zeros(16)
            blk[0] = 6 * s
            blk[1:1 + len(chunk)] = chunk
            rows.append(blk)
    return torch.stack(rows)


@pytest.mark.parametrize("fmt", ["nvfp4", "nvfp4_2level"])
def test_tie_order_matches_torchao(fmt):
    x = tie_order_blocks()
    s, c, q = _ours(x, fmt)
    g = q.global_scale.view(torch.float32) if q.global_scale is not None else None
    s_ref, d_ref = nvfp4_mod.nvfp4_quantize(x.clone(), per_tensor_scale=g)
    assert torch.equal(s, s_ref.view(torch.uint8))
    assert torch.equal(c, d_ref.view(torch.uint8))


def test_tie_order_reciprocal_differs_from_division():
    # torchao multiplies by 1/s; near ties a division gives other codes.
    x = tie_order_blocks()
    a = quantize(x, "nvfp4").codes
    b = quantize(x, "nvfp4", recipe="modelopt").codes  # divides
    assert int((a != b).sum()) > 0


def test_torchao_edge_semantics():
    x = torch.zeros(4, 16)
    x[1, 3] = float("inf")
    x[2, 0] = float("nan")
    x[3] = -0.0
    s, c, _ = _ours(x)
    assert s[:, 0].tolist() == [0x08, 0x7E, 0x7F, 0x08]  # zero -> 2^-6, Inf -> 448, NaN -> NaN
    assert c[0].tolist() == [0] * 8
    assert (c[1, 1] >> 4) == 0x7  # the Inf became 6 (element 3 = high nibble of byte 1)
    assert c[3].tolist() == [0x88] * 8  # -0.0 keeps its sign bit


@pytest.mark.parametrize("name", ["gaussian", "student_t"])
@pytest.mark.parametrize("recipe", ["modelopt", "te"])
def test_recipes_agree_on_ordinary_data(name, recipe):
    x = DATA[name]
    ref = quantize(x, "nvfp4")
    q = quantize(x, "nvfp4", recipe=recipe)
    assert torch.equal(q.scales, ref.scales)
    # division vs reciprocal multiply may move a value sitting exactly at a tie: allow none here
    assert int((q.codes != ref.codes).sum()) <= 2, "recipes should agree on ordinary data"


def test_recipe_documented_differences():
    x = torch.zeros(3, 16)
    x[1] = 1e-30
    x[2] = -0.0
    ta, mo, te = (quantize(x, "nvfp4", recipe=r) for r in ("torchao", "modelopt", "te"))
    assert ta.scales[:, 0].tolist() == [0x08, 0x08, 0x08]  # 2^-6 floor
    assert mo.scales[:, 0].tolist() == [0x38, 0x01, 0x38]  # zero -> 1.0; floor 2^-9 (subnormal)
    assert te.scales[:, 0].tolist() == [0x00, 0x00, 0x00]  # no floor: 1e-30 / 6 underflows to 0
    assert ta.codes[2].tolist() == [0x88] * 8 and mo.codes[2].tolist() == [0] * 8  # -0.0
    assert torch.equal(te.dequantize(), torch.zeros(3, 16))  # zero scale -> zero codes (kvlab guard)


def test_dequantize_is_code_times_scale():
    x = DATA["gaussian"][:4, :32]
    q = quantize(x, "nvfp4_2level")
    from kvlab.quant import decode_e2m1, unpack_bits

    vals = decode_e2m1(unpack_bits(q.codes, 4, 32))
    s = q.scales.view(torch.float8_e4m3fn).float().repeat_interleave(16, -1)
    assert torch.equal(q.dequantize(), vals * (s * q.global_scale.view(torch.float32)))  # torchao's order
