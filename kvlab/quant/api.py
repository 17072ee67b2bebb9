"""`quantize(x, fmt, **options) -> QuantizedTensor`: one entry point for every format of the table.

Along the last dimension: each vector of the last dim is one entry; blocks never cross vectors,
per-token scope means one scale per last-dim vector. Unscaled formats (fp32 / bf16 / fp16)
store the raw bytes, so a cache can hold any format of the table through this one path.

Input: a float32 / bfloat16 / float16 tensor with at least one dim, on a device with data (computation runs
in fp32); anything else (a list, complex or integer tensors, a meta tensor) is refused naming what fits.
Empty tensors give empty codes and scales (nbytes = the format's per-tensor bytes).
Ranges: what each format holds is in kvlab.quant.ranges; finite values beyond it are refused (QuantizeError naming
the format that fits), never clipped or stored as inf: NVFP4 single level beyond 2,688, FP16 storage, FP16 scales.
NaN / Inf: NVFP4 and MX follow torchao (NaN makes its block's scale NaN; Inf gives the largest
scale and saturates); FP8 scales come from the finite values, Inf saturates to +-max and NaN
stays NaN; integer groups reject non-finite input (min / max would be meaningless).
"""
from __future__ import annotations

import numbers

import torch

from ..checks import need_type
from ..errors import KvlabError, ParameterError, WrongTypeError
from ..formats import Format, get_format
from .e2m1 import encode_e2m1, pack_bits
from .fp8 import encode_fp8, finite_amax, fp32_scale
from .intgroup import encode_int, int_group_params
from .mx import RULES, quantize_mx_blocks
from .nvfp4 import RECIPES, global_scale_from_amax, quantize_nvfp4_blocks
from .ranges import fits, max_input, over
from .tensor import TORCH_DTYPES, QuantizedTensor

INPUT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
AXES = ("token", "channel")


class QuantizeError(KvlabError):
    """Input that a format cannot quantize (shape not divisible by the block, NaN in int groups, ...)."""


def _f32_bytes(v: torch.Tensor) -> torch.Tensor:
    return v.reshape(1).float().contiguous().view(torch.uint8)


def _encode(d: torch.Tensor, fmt: Format) -> torch.Tensor:
    """Scaled fp32 values -> unpacked element codes."""
    return encode_e2m1(d) if fmt.element.name == "e2m1" else encode_fp8(d, fmt.element)


def _supported(fmt: Format) -> bool:
    """Element / scale combinations this package quantizes."""
    el, sc = fmt.element.name, (fmt.scale.name if fmt.scale else None)
    plain = ("fp32", "fp16", "bf16")
    if fmt.scope == "none":
        return fmt.element.kind != "pow2"
    if fmt.element.kind == "int":
        return sc in plain and fmt.zero_point is not None and fmt.zero_point.name in plain
    if el not in ("e2m1", "e4m3", "e5m2") or fmt.zero_point is not None:
        return False
    if sc == "e4m3":  # NVFP4-style E4M3 block scales
        return el == "e2m1" and fmt.scope == "block"
    if fmt.scale.kind == "pow2":  # E8M0 block scales (MX)
        return fmt.scope == "block"
    return sc in plain and (fmt.tensor_scale is None)


def _check(x, fmt: Format, recipe, scale_rule, scale, global_scale, axis) -> None:
    need_type("quantize: x", x, torch.Tensor, "a torch.Tensor (float32, bfloat16 or float16)")
    if x.is_complex():
        raise WrongTypeError(f"quantize: x is complex ({x.dtype}); a KV format stores real values and the imaginary "
                             "part would be lost: quantize x.real and x.imag separately")
    if x.dtype not in INPUT_DTYPES:
        raise WrongTypeError(f"quantize: x has dtype {x.dtype}; expected float32, bfloat16 or float16 "
                             "(convert with x.float())")
    if x.is_meta:
        raise QuantizeError("quantize: x is on the meta device, which holds shapes but no values to quantize")
    if x.dim() == 0:
        raise QuantizeError("quantize: x is a 0-dim scalar; quantization runs along the last dimension")
    if not _supported(fmt):
        raise QuantizeError(f"quantize: no quantizer for {fmt.name} ({fmt.element.name} elements with "
                            f"{fmt.scale.name if fmt.scale else 'no'} scales)")
    if recipe not in RECIPES:
        raise ParameterError(f"quantize: unknown recipe {recipe!r}; choose one of {', '.join(RECIPES)}")
    if recipe != "torchao" and fmt.scale is not None and fmt.scale.name != "e4m3":
        raise ParameterError(f"quantize: recipe= applies to NVFP4 (E4M3 block scales), not {fmt.name}")
    if scale_rule is not None and (scale_rule not in RULES or fmt.scale is None or fmt.scale.kind != "pow2"):
        raise ParameterError(f"quantize: scale_rule={scale_rule!r} needs an E8M0-scaled format and one of {RULES}")
    if scale is not None and fmt.scope != "tensor":
        raise ParameterError(f"quantize: scale= sets a per-tensor scale; {fmt.name} has scope {fmt.scope}")
    if global_scale is not None and fmt.tensor_scale is None:
        raise ParameterError(f"quantize: global_scale= needs a two-level format (nvfp4_2level), not {fmt.name}")
    if axis not in AXES or (axis == "channel" and fmt.element.kind != "int"):
        raise ParameterError(f"quantize: axis must be 'token' (or 'channel' for integer groups), got {axis!r}")
    for name, v in (("scale", scale), ("global_scale", global_scale)):
        if v is None:
            continue
        if isinstance(v, torch.Tensor):
            if v.numel() != 1 or not v.dtype.is_floating_point or v.is_meta:
                raise WrongTypeError(f"quantize: {name} must be one real number (a float or a 1-element float "
                                     f"tensor), got a {v.dtype} tensor of shape {tuple(v.shape)}")
        elif isinstance(v, bool) or not isinstance(v, numbers.Real):
            raise WrongTypeError(f"quantize: {name} must be a real number, got {type(v).__name__} {v!r:.40}")


def quantize(x: torch.Tensor, fmt: str | Format, *, recipe: str = "torchao", scale_rule: str | None = None,
             scale: float | torch.Tensor | None = None, global_scale: float | torch.Tensor | None = None,
             axis: str = "token", pad: bool = False) -> QuantizedTensor:
    """Quantize `x` [*lead, D] into format `fmt` (a name or a kvlab.formats.Format).

    recipe: NVFP4 semantics, "torchao" (default), "modelopt" or "te" (see kvlab.quant.nvfp4).
    scale_rule: E8M0 scales, "floor" (default for MX formats) or "rceil" (default for the
        non-MX UE8M0 variants such as fp8_e4m3_b64_ue8m0, which must not clip).
    scale: per-tensor FP8 scale (e.g. vLLM's k_scale); default amax / max_elem.
    global_scale: NVFP4 two-level decode scale; default amax / (448 x 6).
    axis: integer groups along the last dim ("token") or over G tokens of a channel ("channel").
    pad: zero-pad a last dim that is not a multiple of the block (the padding is not stored).
    """
    fmt = get_format(fmt)
    need_type("quantize: pad", pad, bool, "True or False")
    _check(x, fmt, recipe, scale_rule, scale, global_scale, axis)
    shape, d = tuple(x.shape), x.shape[-1]
    lead = shape[:-1]
    opts = {"recipe": recipe} if fmt.scale is not None and fmt.scale.name == "e4m3" else {}
    if fmt.scale is not None and fmt.scale.kind == "pow2":
        opts["scale_rule"] = scale_rule or ("floor" if fmt.name.startswith("mx") else "rceil")
    qt = dict(fmt=fmt, shape=shape, dtype=x.dtype, axis=axis, options=opts)
    if x.numel() == 0:
        return _empty(x, fmt, qt)
    xf = x.float()
    el = fmt.element

    if fmt.scope == "none":
        top = float(finite_amax(xf.detach())) if el.kind == "float" else 0.0
        if top > el.max:
            raise QuantizeError(f"quantize: x reaches |x| = {top:.4g}, beyond the largest {fmt.name} value "
                                f"({el.max:,g}): it would be stored as inf; use {fits(fmt)}")
        if el.name in TORCH_DTYPES:
            codes = x.to(TORCH_DTYPES[el.name]).contiguous().view(torch.uint8).reshape(*lead, -1)
        else:
            codes = pack_bits(_encode(xf, fmt), el.bits)
        return QuantizedTensor(codes=codes, scales=_no_scales(x, lead), **qt)

    if fmt.scope == "tensor":
        s = torch.as_tensor(scale, dtype=torch.float32, device=x.device) if scale is not None \
            else fp32_scale(finite_amax(xf), el)
        if not bool(torch.isfinite(s)) or float(s) <= 0:
            raise ParameterError(f"quantize: scale must be a finite positive number, got {float(s)}")
        codes = pack_bits(_encode(xf / s, fmt), el.bits)
        return QuantizedTensor(codes=codes, scales=_f32_bytes(s), **qt)

    if fmt.scope == "token":
        s = fp32_scale(finite_amax(xf, dim=-1, keepdim=True), el)  # [*lead, 1]
        s = s.to(TORCH_DTYPES[fmt.scale.name]).float()
        codes = pack_bits(_encode(xf / s, fmt), el.bits)
        sb = s.to(TORCH_DTYPES[fmt.scale.name]).contiguous().view(torch.uint8)
        return QuantizedTensor(codes=codes, scales=sb, **qt)

    if el.kind == "int":
        return _int(xf, fmt, qt, axis, pad)

    # block scope, float elements: [*lead, nb, block]
    xb = _blocks(xf, fmt.block, pad, fmt.name)
    g = None
    if fmt.scale.name == "e4m3":
        if fmt.tensor_scale is None:
            _refuse_saturation(fmt, xb.abs().amax(dim=-1))
        else:
            g = torch.as_tensor(global_scale, dtype=torch.float32, device=x.device) if global_scale is not None \
                else global_scale_from_amax(finite_amax(xf))
            if not bool(torch.isfinite(g)) or float(g) <= 0:
                raise ParameterError(f"quantize: global_scale must be a finite positive number, got {float(g)}")
        sb, codes = quantize_nvfp4_blocks(xb, recipe, g)
    elif fmt.scale.kind == "pow2":
        sb, codes = quantize_mx_blocks(xb, el, opts["scale_rule"])
    else:  # FP32 / FP16 / BF16 block scales (DeepSeek V3.2 style fp8_e4m3_b128)
        sdt = TORCH_DTYPES[fmt.scale.name]
        s = fp32_scale(finite_amax(xb, dim=-1, keepdim=True), el)  # [*lead, nb, 1]
        _refuse_scale_overflow(fmt, s)
        s = s.to(sdt)
        codes = _encode(xb / s.float(), fmt)
        sb = s.squeeze(-1).contiguous().view(torch.uint8)
    codes = pack_bits(codes.reshape(*lead, -1)[..., :d], el.bits)
    return QuantizedTensor(codes=codes, scales=sb.reshape(*lead, -1), global_scale=None if g is None
                           else _f32_bytes(g), **qt)


def _no_scales(x: torch.Tensor, lead) -> torch.Tensor:
    return torch.zeros((*lead, 0), dtype=torch.uint8, device=x.device)


def _blocks(xf: torch.Tensor, block: int, pad: bool, name: str) -> torch.Tensor:
    """[*lead, D] -> [*lead, nb, block], zero-padding the last dim when asked."""
    d = xf.shape[-1]
    if d % block:
        if not pad:
            raise QuantizeError(f"quantize: last dimension {d} is not divisible by the block of {block} of {name}; "
                                f"pass pad=True to zero-pad it")
        xf = torch.nn.functional.pad(xf, (0, block - d % block))
    return xf.reshape(*xf.shape[:-1], -1, block)


def _int(xf: torch.Tensor, fmt: Format, qt: dict, axis: str, pad: bool) -> QuantizedTensor:
    if not bool(torch.isfinite(xf).all()):
        raise QuantizeError(f"quantize: {fmt.name} (integer groups) needs finite input; x has NaN or Inf")
    bits, g, d = fmt.element.bits, fmt.block, xf.shape[-1]
    sdt, zdt = TORCH_DTYPES[fmt.scale.name], TORCH_DTYPES[fmt.zero_point.name]
    if axis == "channel":
        if xf.dim() < 2 or xf.shape[-2] % g:
            raise QuantizeError(f"quantize: axis='channel' groups {g} tokens (dim -2); shape {tuple(xf.shape)} "
                                f"does not divide")
        xg = xf.reshape(*xf.shape[:-2], -1, g, d)  # [*, T/G, G, D]
        s, mn = int_group_params(xg, bits, dim=-2)  # [*, T/G, 1, D]
    else:
        xg = _blocks(xf, g, pad, fmt.name)  # [*lead, nb, G]
        s, mn = int_group_params(xg, bits, dim=-1)  # [*lead, nb, 1]
    _refuse_int_overflow(fmt, s, mn)
    if axis == "channel":
        codes = encode_int(xg, s, mn, bits).reshape(xf.shape)
        s, mn = s.squeeze(-2), mn.squeeze(-2)  # [*, T/G, D]
    else:
        codes = encode_int(xg, s, mn, bits).reshape(*xf.shape[:-1], -1)[..., :d]
        s, mn = s.squeeze(-1), mn.squeeze(-1)  # [*lead, nb]
    sb = s.to(sdt).unsqueeze(-1).contiguous().view(torch.uint8)
    zb = mn.to(zdt).unsqueeze(-1).contiguous().view(torch.uint8)
    scales = torch.cat([sb, zb], dim=-1).reshape(*s.shape[:-1], -1)
    return QuantizedTensor(codes=pack_bits(codes, bits), scales=scales, **qt)


def _refuse_scale_overflow(fmt: Format, s: torch.Tensor) -> None:
    """Float elements with FP16 (or other narrow) block scales: a scale beyond its type would be stored as inf."""
    n, total, top = over(s, fmt.scale.max)
    if n:
        raise QuantizeError(f"quantize: {n} of {total} blocks of x need a scale up to {top:.4g} (block amax / "
                            f"{fmt.element.max:g}), beyond {fmt.scale.name}'s {fmt.scale.max:,g}: x reaches "
                            f"{top * fmt.element.max:.4g}, {fmt.name} holds |x| <= {max_input(fmt):.4g}; "
                            f"use {fits(fmt)}")


def _refuse_saturation(fmt: Format, amax: torch.Tensor) -> None:
    """NVFP4 single level: E4M3 block scales top out at 448, so a block of finite values beyond 6 x 448 = 2,688
    would be clipped to +-2,688 (torchao does, silently): refused instead, as every other range limit is."""
    limit = max_input(fmt)
    n, total, top = over(amax, limit)
    if n:
        raise QuantizeError(f"quantize: {n} of {total} blocks of x reach |x| = {top:.4g}, beyond the {limit:,g} "
                            f"({fmt.element.max:g} x {fmt.scale.max:g}) that {fmt.name} holds (they would be clipped "
                            f"to +-{limit:,g}); use {fits(fmt)}")


def _refuse_int_overflow(fmt: Format, s: torch.Tensor, mn: torch.Tensor) -> None:
    """Integer groups: the zero point (min) and the scale (max - min) / (2^b - 1) must fit their stored types, or
    the group would decode to inf / NaN. The zero point first: when it overflows, no wider scale helps."""
    levels = 2**fmt.element.bits - 1
    n, total, top = over(mn.abs(), fmt.zero_point.max)
    if n:
        raise QuantizeError(f"quantize: {n} of {total} groups of x have a minimum of magnitude up to {top:.4g}, "
                            f"beyond {fmt.zero_point.name}'s {fmt.zero_point.max:,g} (the zero point); {fmt.name} "
                            f"holds |x| <= {max_input(fmt):,g}: scale x down or use a float format with FP32 block "
                            f"scales (e.g. fp8_e4m3_b{fmt.block})")
    n, total, top = over(s, fmt.scale.max)
    if n:
        raise QuantizeError(f"quantize: {n} of {total} groups of x span up to {top * levels:.4g} (max - min), so "
                            f"their scale (max - min) / {levels} = {top:.4g} exceeds {fmt.scale.name}'s "
                            f"{fmt.scale.max:,g}; use {fits(fmt)}")


def _empty(x: torch.Tensor, fmt: Format, qt: dict) -> QuantizedTensor:
    lead, d = x.shape[:-1], x.shape[-1]
    codes = torch.zeros((*lead, fmt.data_bytes(d)), dtype=torch.uint8, device=x.device)
    if fmt.scope == "tensor":
        scales = _f32_bytes(torch.ones((), device=x.device))
    elif qt["axis"] == "channel":  # no whole group of tokens: [*, 0, D x one group's scale bytes]
        scales = torch.zeros((*lead[:-1], 0, d * fmt.scale_bytes(fmt.block)), dtype=torch.uint8, device=x.device)
    else:
        scales = torch.zeros((*lead, fmt.scale_bytes(d)), dtype=torch.uint8, device=x.device)
    gs = _f32_bytes(torch.ones((), device=x.device)) if fmt.tensor_scale is not None else None
    return QuantizedTensor(codes=codes, scales=scales, global_scale=gs, **qt)
