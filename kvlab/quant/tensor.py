"""QuantizedTensor: one result type for every format (packed codes, scale bytes, decode)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from ..checks import need_choice, need_int, need_type
from ..errors import ParameterError, ShapeError, WrongTypeError
from ..formats import Format, get_format
from .e2m1 import decode_e2m1, unpack_bits
from .fp8 import decode_fp8
from .mx import e8m0_to_float

TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def decode_scale_bytes(b: torch.Tensor, element) -> torch.Tensor:
    """Scale bytes uint8 [..., k * width] of one scale type -> fp32 [..., k]."""
    b = b.contiguous().flatten().reshape(b.shape)  # fresh strides: size-1 dims may keep odd ones, which view refuses
    if element.name in ("e4m3", "e5m2"):
        return decode_fp8(b, element)
    if element.kind == "pow2":
        return e8m0_to_float(b)
    return b.view(TORCH_DTYPES[element.name]).float()


@dataclass
class QuantizedTensor:
    """A tensor stored in a kvlab.formats format. Quantization runs along the last dim: each
    vector of the last dim is one entry with its own scales (blocks never cross vectors), except
    integer groups with axis "channel" (KIVI keys: G tokens of one channel share a scale)."""

    fmt: Format  # the number format (sizes come from its table entry)
    shape: tuple[int, ...]  # shape of the original tensor [*lead, D]
    dtype: torch.dtype  # dtype of the original tensor; dequantize() returns it
    codes: torch.Tensor  # uint8 [*lead, fmt.data_bytes(D)]: packed element codes (even element in the low bits)
    scales: torch.Tensor  # uint8: per-entry scale bytes [*lead, fmt.scale_bytes(D)] (int: scale then zero point per
    #                       group; channel axis [*lead[:-1], T/G, D * width]); the FP32 scale [4] for per-tensor formats
    global_scale: torch.Tensor | None = None  # uint8 [4]: FP32 second-level decode scale (nvfp4_2level)
    axis: str = "token"  # "token" (groups along the last dim) or "channel" (int groups over G tokens, dim -2)
    options: dict = field(default_factory=dict)  # recipe / scale_rule used (kept for the record)

    def __post_init__(self):
        self.check()

    def check(self) -> "QuantizedTensor":
        """Refuse parts that do not fit together (codes or scales truncated, extended or from another format, a
        float tensor where bytes belong): decoding them would fail deep in torch or decode garbage. Runs at
        construction and again before every decode, since the fields (and their arrays) can be replaced or
        resized afterwards. The sizes come from the formats table (`Format.data_bytes`, `scale_bytes`,
        `tensor_bytes`)."""
        self.fmt = get_format(self.fmt)
        need_type("QuantizedTensor.shape", self.shape, (tuple, list, torch.Size), "a tuple of dims")
        self.shape = tuple(need_int("QuantizedTensor.shape", n) for n in self.shape)
        if not self.shape:
            raise ParameterError("QuantizedTensor.shape must have at least one dim (quantization runs along the last)")
        _float_dtype("QuantizedTensor.dtype", self.dtype)
        need_choice("QuantizedTensor.axis", self.axis, ("token", "channel"))
        *lead, d = self.shape
        f = self.fmt
        if self.axis == "channel":
            if f.element.kind != "int":
                raise ParameterError(f"QuantizedTensor.axis 'channel' is for integer groups, not {f.name}")
            t = lead[-1] if lead else 0
            if not lead or t % f.block:
                raise ShapeError(f"QuantizedTensor: axis 'channel' groups {f.block} tokens (dim -2), but shape "
                                 f"{list(self.shape)} has no whole groups")
            scales = (*lead[:-1], t // f.block, d * f.scale_bytes(f.block))  # one group's scale + zero per channel
        else:
            scales = (f.tensor_bytes,) if f.scope == "tensor" else (*lead, f.scale_bytes(d))
        _bytes("codes", self.codes, (*lead, f.data_bytes(d)), f, self.shape)
        _bytes("scales", self.scales, scales, f, self.shape)
        if (self.global_scale is None) != (f.tensor_scale is None):
            raise ParameterError(f"QuantizedTensor: {f.name} " + (
                f"needs a global_scale (uint8 [{f.tensor_bytes}])" if f.tensor_scale
                else "has no per-tensor second-level scale; global_scale must be None"))
        if self.global_scale is not None:
            _bytes("global_scale", self.global_scale, (f.tensor_bytes,), f, self.shape)
        for name in ("scales", "global_scale"):
            part = getattr(self, name)
            if part is not None and part.device != self.codes.device:
                raise ParameterError(f"QuantizedTensor.{name} is on {part.device} but codes are on "
                                     f"{self.codes.device}; move all parts to one device")
        return self

    @property
    def nbytes(self) -> int:
        """Stored bytes: codes + scales (+ second-level scale); equals the formats table's bytes."""
        return self.codes.numel() + self.scales.numel() + (0 if self.global_scale is None else self.global_scale.numel())

    @property
    def device(self) -> torch.device:
        return self.codes.device

    def element_values(self) -> torch.Tensor:
        """Decoded element values fp32 [*lead, D] before scaling (int: the integer codes)."""
        self.check()
        el, d = self.fmt.element, self.shape[-1]
        if el.name in TORCH_DTYPES:
            return self.codes.contiguous().view(TORCH_DTYPES[el.name]).float()
        if el.name in ("e4m3", "e5m2"):
            return decode_fp8(self.codes, el)
        if el.name == "e2m1":
            return decode_e2m1(unpack_bits(self.codes, 4, d))
        if el.kind == "int":
            return unpack_bits(self.codes, el.bits, d).float()
        raise TypeError(f"cannot decode element type {el.name}")

    def _per_block(self, t: torch.Tensor) -> torch.Tensor:
        """[*lead, nb] -> [*lead, D]: repeat each block's value over its elements."""
        return t.repeat_interleave(self.fmt.block, dim=-1)[..., : self.shape[-1]]

    def _int_params(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Int groups: (s, mn) fp32 per group: [*lead, nb] (channel axis: [*, T/G, D])."""
        f = self.fmt
        sw, zw = f.scale.bits // 8, f.zero_point.bits // 8
        if f.scale == f.zero_point and f.scale.name in TORCH_DTYPES:  # (s, mn) pairs of one type: one view
            sz = self.scales.contiguous().view(TORCH_DTYPES[f.scale.name]).float()  # [..., 2 nb]
            sz = sz.reshape(*sz.shape[:-1], -1, 2)
            return sz[..., 0], sz[..., 1]
        b = self.scales.reshape(*self.scales.shape[:-1], -1, sw + zw)
        return (decode_scale_bytes(b[..., :sw], f.scale).squeeze(-1),
                decode_scale_bytes(b[..., sw:], f.zero_point).squeeze(-1))

    def _split_int_scales(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Int groups: (s, mn) fp32, broadcastable to the original shape."""
        s, z = self._int_params()
        if self.axis == "channel":  # [*, T/G, D] -> [*, T, D]
            return (s.repeat_interleave(self.fmt.block, dim=-2), z.repeat_interleave(self.fmt.block, dim=-2))
        return self._per_block(s), self._per_block(z)

    def _scaled(self, v: torch.Tensor, s: torch.Tensor, z: torch.Tensor | None = None) -> torch.Tensor:
        """v x s (+ z) with one s (and z) per group, broadcast over the group's elements rather than
        repeated per element: the same fp32 products and sums, fewer passes over memory."""
        g = self.fmt.block
        if self.axis == "channel":  # v [*, T, D], s [*, T/G, D]
            out = v.reshape(*v.shape[:-2], -1, g, v.shape[-1]) * s.unsqueeze(-2)
            return (out if z is None else out + z.unsqueeze(-2)).reshape(v.shape)
        d, nb = v.shape[-1], s.shape[-1]
        if nb == 1:  # one group per vector: broadcast its scale as is
            return v * s if z is None else v * s + z
        if nb * g != d:
            v = torch.nn.functional.pad(v, (0, nb * g - d))
        out = v.reshape(*v.shape[:-1], nb, g) * s.unsqueeze(-1)  # [*lead, nb, G]
        out = (out if z is None else out + z.unsqueeze(-1)).reshape(*v.shape[:-1], nb * g)
        return out[..., :d]

    def element_scale(self) -> torch.Tensor:
        """fp32 decode scale of every element (broadcastable to the shape); int: the group's s."""
        self.check()
        f = self.fmt
        if f.scope == "none":
            s = torch.ones((), device=self.device)
        elif f.element.kind == "int":
            s = self._split_int_scales()[0]
        elif f.scope == "tensor":
            s = self.scales.contiguous().view(torch.float32).reshape(())
        elif f.scope == "token":
            s = decode_scale_bytes(self.scales, f.scale)  # [*lead, 1]
        else:
            s = self._per_block(decode_scale_bytes(self.scales, f.scale))
        if self.global_scale is not None:
            s = s * self.global_scale.contiguous().view(torch.float32).reshape(())
        return s

    def dequantize(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        """Decoded tensor of the original shape, in `dtype` (default: the input's dtype)."""
        self.check()
        dtype = self.dtype if dtype is None else _float_dtype("dequantize: dtype", dtype)
        if self.codes.numel() == 0:
            return torch.zeros(self.shape, dtype=dtype, device=self.device)
        v = self.element_values()
        f = self.fmt
        if f.element.kind == "int":
            out = self._scaled(v, *self._int_params())
        elif f.scope == "none":
            out = v
        elif f.scope == "block":
            s = decode_scale_bytes(self.scales, f.scale)  # [*lead, nb]
            if self.global_scale is not None:
                s = s * self.global_scale.contiguous().view(torch.float32).reshape(())
            out = self._scaled(v, s)
        else:
            out = v * self.element_scale()
        return out.reshape(self.shape).to(dtype)

    def step(self) -> torch.Tensor:
        """Per-element quantization step: the group's s (int) or the spacing of the element
        grid's top binade times the element's scale (floats); RNE error is at most step / 2
        unless a value was clipped."""
        el = self.fmt.element
        if el.kind == "int":
            return self.element_scale().expand(self.shape)
        top = 2.0 ** (math.floor(math.log2(el.max)) - el.man_bits)  # spacing of the top binade
        return (self.element_scale() * top).expand(self.shape)



def _float_dtype(name: str, dtype) -> torch.dtype:
    """A real floating torch dtype (torch.bfloat16, ...): decoded values are real numbers."""
    if not isinstance(dtype, torch.dtype):
        raise WrongTypeError(f"{name} must be a torch dtype such as torch.bfloat16, got {type(dtype).__name__} "
                             f"{dtype!r}" + (f" (use torch.{dtype})" if isinstance(dtype, str)
                                             and isinstance(getattr(torch, dtype, None), torch.dtype) else ""))
    if not dtype.is_floating_point:
        raise ParameterError(f"{name} must be a real floating dtype (float32, bfloat16, float16, ...), got {dtype}")
    return dtype


def _bytes(name: str, t, shape: tuple, fmt: Format, of: tuple) -> None:
    """`t` is a uint8 tensor of exactly `shape` (the bytes `fmt` stores for a tensor of shape `of`)."""
    if not isinstance(t, torch.Tensor) or t.dtype != torch.uint8:
        raise WrongTypeError(f"QuantizedTensor.{name} must be a uint8 tensor of bytes, got "
                             + (f"a {t.dtype} tensor" if isinstance(t, torch.Tensor) else type(t).__name__))
    if tuple(t.shape) != tuple(shape):
        raise ShapeError(f"QuantizedTensor.{name} holds {t.numel():,} bytes {list(t.shape)} but shape {list(of)} in "
                         f"{fmt.name} needs {math.prod(shape):,} {list(shape)} (truncated, edited or from another "
                         f"format?)")
