"""Reference quantizers for KV-cache formats, bit-exact against torchao, ml_dtypes and optimum-quanto.

`quantize(x, fmt, **options) -> QuantizedTensor` covers every format of kvlab.formats; sizes
come from that table. Semantics and sources (torchao 0.18 prototype/mx_formats, ml_dtypes 0.6, optimum-quanto 0.2.7,
NVIDIA ModelOpt, TransformerEngine, KIVI): the module docstrings.
"""
from .api import QuantizeError, quantize
from .e2m1 import decode_e2m1, encode_e2m1, pack_bits, unpack_bits
from .fp8 import decode_fp8, encode_fp8, vllm_kv_scales
from .kivi import KiviKV, kivi_quantize
from .metrics import cosine, max_step_error, rel_error, sqnr
from .roundtrip import roundtrip
from .tensor import QuantizedTensor

__all__ = ["QuantizeError", "quantize", "QuantizedTensor", "encode_e2m1", "decode_e2m1", "pack_bits", "unpack_bits",
           "encode_fp8", "decode_fp8", "vllm_kv_scales", "KiviKV", "kivi_quantize", "sqnr", "rel_error", "cosine",
           "max_step_error", "roundtrip"]
