"""Number formats as data: the single source of truth for bytes.

A `Format` is an element type plus how it is scaled (nothing, one scale per block of
elements, one per token vector, or one per tensor) and, for integer groups, a zero point.
The byte math, the quantizers' packed outputs and the torch cache storage all take their
sizes from `Format.entry_bytes`, so "measured equals predicted" compares real tensors
against this one table.

Names: the canonical formats are listed in `FORMATS`; variants are parsed from names such
as ``int4_g64`` (group of 64), ``fp8_e4m3_b128`` (one FP32 scale per 128) or
``fp8_e4m3_b64_ue8m0`` (one UE8M0 scale per 64).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace
from fractions import Fraction

from .checks import cdiv, need_int
from .errors import UnknownFormatError


@dataclass(frozen=True)
class Element:
    """One stored value type."""

    name: str  # short name: "bf16", "e4m3", "e2m1", "e8m0", "int4", ...
    bits: int  # storage bits per value
    kind: str  # "float", "int" (unsigned code with zero point) or "pow2" (E8M0 exponent-only)
    exp_bits: int = 0  # exponent bits (floats)
    man_bits: int = 0  # explicit mantissa bits (floats)
    max: float = 0.0  # largest finite magnitude (floats) or largest code (ints)

    @property
    def nbytes(self) -> Fraction:
        return Fraction(self.bits, 8)


# Element types. Each constant states its largest value.
FP32 = Element("fp32", 32, "float", 8, 23, 3.4028234663852886e38)
BF16 = Element("bf16", 16, "float", 8, 7, 3.3895313892515355e38)
FP16 = Element("fp16", 16, "float", 5, 10, 65504.0)
E4M3 = Element("e4m3", 8, "float", 4, 3, 448.0)  # OCP E4M3 "fn": no Inf, NaN = S.1111.111
E5M2 = Element("e5m2", 8, "float", 5, 2, 57344.0)  # IEEE-like: has Inf
E2M1 = Element("e2m1", 4, "float", 2, 1, 6.0)  # FP4: 0, .5, 1, 1.5, 2, 3, 4, 6
E8M0 = Element("e8m0", 8, "pow2", 8, 0, 2.0**127)  # UE8M0: 2^(b-127), 255 = NaN
INT8 = Element("int8", 8, "int", max=255)
INT4 = Element("int4", 4, "int", max=15)
INT2 = Element("int2", 2, "int", max=3)

ELEMENTS = {e.name: e for e in (FP32, BF16, FP16, E4M3, E5M2, E2M1, E8M0, INT8, INT4, INT2)}
ELEMENTS["ue8m0"] = E8M0

SCOPES = ("none", "block", "token", "tensor")


@dataclass(frozen=True)
class Format:
    """A storage number format: elements, their scales, and where the scales sit."""

    name: str  # canonical name, e.g. "nvfp4"
    element: Element  # type of each stored value
    scope: str = "none"  # "none" | "block" (one scale per `block`) | "token" (per vector) | "tensor"
    block: int | None = None  # elements per scale when scope == "block"
    scale: Element | None = None  # type of each scale
    zero_point: Element | None = None  # integer groups: one zero point per group, beside the scale
    tensor_scale: Element | None = None  # second-level scale, one per tensor (NVFP4 two-level)
    description: str = ""  # what it is and where it is used

    def __post_init__(self):
        if self.scope not in SCOPES:
            raise UnknownFormatError(f"format {self.name}: unknown scale scope {self.scope!r}")
        if self.scope == "block" and (self.block is None or self.block < 1):
            raise UnknownFormatError(f"format {self.name}: a block-scaled format needs a block size >= 1")
        if self.scope != "none" and self.scale is None:
            raise UnknownFormatError(f"format {self.name}: scope {self.scope} needs a scale type")

    # --- bytes ----------------------------------------------------------------------------
    def data_bytes(self, n: int) -> int:
        """Bytes of packed element codes for a vector of n elements (whole bytes)."""
        return cdiv(need_int("n", n) * self.element.bits, 8)

    def scales_per(self, n: int) -> int:
        """Number of per-entry scales stored with a vector of n elements."""
        n = need_int("n", n)
        if self.scope == "block":
            return cdiv(n, self.block)
        if self.scope == "token":
            return 1 if n else 0
        return 0

    def scale_bytes(self, n: int) -> int:
        """Bytes of scales (and zero points) stored with a vector of n elements."""
        per = self.scale.bits if self.scale else 0
        per += self.zero_point.bits if self.zero_point else 0
        return self.scales_per(n) * per // 8

    def entry_bytes(self, n: int) -> int:
        """Exact bytes of one stored vector of n elements: codes + its own scales."""
        return self.data_bytes(n) + self.scale_bytes(n)

    @property
    def tensor_bytes(self) -> int:
        """Constant bytes per tensor (a per-tensor scale), independent of its length."""
        b = self.scale.bits if (self.scope == "tensor" and self.scale) else 0
        b += self.tensor_scale.bits if self.tensor_scale else 0
        return b // 8

    def nbytes(self, n: int) -> int:
        """Exact bytes of a tensor of n elements quantized as one vector, all scales included."""
        return self.entry_bytes(n) + self.tensor_bytes

    def bits_per_element(self, n: int | None = None) -> Fraction:
        """Bits per element with per-entry scales, over n elements (default: one block, or a
        128-element vector for per-token scales); per-tensor scales are not amortized."""
        n = {"block": self.block, "token": 128}.get(self.scope, 1) if n is None else need_int("n", n, 1)
        return Fraction(self.entry_bytes(n) * 8, n)

    def describe(self, n: int) -> str:
        """'512 x 4 bits / 8 + 32 x 1 B scale = 256 + 32 = 288 B' style arithmetic."""
        n = need_int("n", n)
        data = f"{n} x {self.element.bits} bits / 8" if self.element.bits != 8 * (self.element.bits // 8) \
            else f"{n} x {self.element.bits // 8} B"
        if self.scale_bytes(n) == 0:
            return f"{data} = {self.entry_bytes(n):,} B"
        k = self.scales_per(n)
        sz = (self.scale.bits + (self.zero_point.bits if self.zero_point else 0)) // 8
        what = "scale+zero" if self.zero_point else f"{self.scale.name} scale"
        return (f"{data} + {k} x {sz} B {what} = {self.data_bytes(n):,} + {self.scale_bytes(n):,}"
                f" = {self.entry_bytes(n):,} B")


def _f(name, element, description, **kw) -> Format:
    return Format(name=name, element=element, description=description, **kw)


# The table. Sources: ../shared/reference/formats.md and models.md (OCP MX spec, NVIDIA NVFP4,
# vLLM FP8 KV cache, DeepSeek V3.2 fp8_ds_mla and V4 storage, KIVI integer groups).
FORMATS: dict[str, Format] = {f.name: f for f in (
    _f("fp32", FP32, "IEEE single precision"),
    _f("bf16", BF16, "bfloat16: the default dtype of most published checkpoints"),
    _f("fp16", FP16, "IEEE half precision"),
    _f("fp8_e4m3", E4M3, "FP8 E4M3 with one FP32 scale per tensor (vLLM k_scale / v_scale)",
       scope="tensor", scale=FP32),
    _f("fp8_e5m2", E5M2, "FP8 E5M2 with one FP32 scale per tensor", scope="tensor", scale=FP32),
    _f("fp8_e4m3_token", E4M3, "FP8 E4M3 with one FP32 scale per token vector", scope="token", scale=FP32),
    _f("fp8_e4m3_b128", E4M3, "FP8 E4M3, one FP32 scale per 128 (DeepSeek V3.2 fp8_ds_mla latent, indexer)",
       scope="block", block=128, scale=FP32),
    _f("fp8_e4m3_b64_ue8m0", E4M3, "FP8 E4M3, one UE8M0 scale per 64 (DeepSeek V4 NoPE part)",
       scope="block", block=64, scale=E8M0),
    _f("nvfp4", E2M1, "NVFP4: E2M1 with one E4M3 scale per 16 (single level)",
       scope="block", block=16, scale=E4M3),
    _f("nvfp4_2level", E2M1, "NVFP4 with an FP32 per-tensor scale above the E4M3 block scales",
       scope="block", block=16, scale=E4M3, tensor_scale=FP32),
    _f("mxfp4", E2M1, "OCP MXFP4: E2M1 with one E8M0 scale per 32", scope="block", block=32, scale=E8M0),
    _f("mxfp8_e4m3", E4M3, "OCP MXFP8 (E4M3) with one E8M0 scale per 32", scope="block", block=32, scale=E8M0),
    _f("mxfp8_e5m2", E5M2, "OCP MXFP8 (E5M2) with one E8M0 scale per 32", scope="block", block=32, scale=E8M0),
    _f("int8", INT8, "8-bit asymmetric groups of 32: FP16 scale + FP16 zero point",
       scope="block", block=32, scale=FP16, zero_point=FP16),
    _f("int4", INT4, "4-bit asymmetric groups of 32 (KIVI): FP16 scale + FP16 zero point",
       scope="block", block=32, scale=FP16, zero_point=FP16),
    _f("int2", INT2, "2-bit asymmetric groups of 32 (KIVI): FP16 scale + FP16 zero point",
       scope="block", block=32, scale=FP16, zero_point=FP16),
)}
ALIASES = {"mxfp8": "mxfp8_e4m3", "fp8": "fp8_e4m3", "e4m3": "fp8_e4m3", "e5m2": "fp8_e5m2",
           "float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "half": "fp16"}

_VARIANT = re.compile(r"^(?P<base>[a-z0-9_]+?)_(?:g|b)(?P<block>\d+)(?:_(?P<scale>fp32|fp16|bf16|ue8m0|e8m0|e4m3))?$")


def get_format(name: str | Format) -> Format:
    """Look a format up by name (canonical, alias, or a `_g<N>` / `_b<N>[_<scale>]` variant)."""
    if isinstance(name, Format):
        return name
    if not isinstance(name, str):
        raise UnknownFormatError(f"format must be a format name (str) or a kvlab.formats.Format, "
                                 f"got {type(name).__name__} {name!r:.40}")
    key = name.strip().lower()
    key = ALIASES.get(key, key)
    if key in FORMATS:
        return FORMATS[key]
    m = _VARIANT.match(key)
    if m:
        base = FORMATS.get(ALIASES.get(m["base"], m["base"]))
        block = int(m["block"])
        if base is not None and block < 1:
            raise UnknownFormatError(f"format {name!r}: the block (group) size after _g / _b must be >= 1")
        if base is not None and base.element.kind != "pow2":
            scale = ELEMENTS[m["scale"]] if m["scale"] else (base.scale or FP32)
            return replace(base, name=key, scope="block", block=block, scale=scale,
                           description=f"{base.element.name} with one {scale.name} scale per {block}"
                           + (" + zero point" if base.zero_point else ""))
    raise UnknownFormatError(
        f"unknown number format {name!r}; known: {', '.join(FORMATS)} (variants: int4_g64, fp8_e4m3_b128, ...)")


def list_formats() -> list[Format]:
    """The canonical formats, in table order."""
    return list(FORMATS.values())


def dtype_format(torch_dtype: str | None) -> Format:
    """The unscaled format of a config's `torch_dtype` (the weights' and KV cache's default): float32, bfloat16 or
    float16 (or their short names); any other dtype is refused with the field named, since a KV cache in it
    would need scales the config does not describe (choose a kv_format instead)."""
    if torch_dtype in (None, "auto"):
        return FORMATS["bf16"]
    key = str(torch_dtype).strip().lower().replace("torch.", "")
    fmt = FORMATS.get(ALIASES.get(key, key))
    if fmt is None or fmt.scope != "none":
        plain = [n for n, f in FORMATS.items() if f.scope == "none"]
        names = [a for a, n in ALIASES.items() if n in plain]
        raise UnknownFormatError(
            f"torch_dtype {torch_dtype!r} (the config's field) is not a dtype kvlab stores a KV cache in; known: "
            f"{', '.join(names + plain)} (or pass kv_format, e.g. fp8_e4m3 or nvfp4)")
    return fmt
