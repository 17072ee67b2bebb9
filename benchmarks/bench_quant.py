"""Quantize + pack throughput: kvlab vs torchao on one 4096 x 4096 tensor, side by side.

For NVFP4 (single level) and MXFP4 (FLOOR) it times kvlab.quant.quantize and torchao's
`nvfp4_quantize` / `to_mx` on the same fp32 tensor in this process, checks the bytes are equal,
and prints throughput, the kvlab / torchao speed ratio (> 1: kvlab faster) and the fraction of a
plain tensor copy's throughput (the memory-bandwidth floor).
"""
from __future__ import annotations

import time
import warnings

import torch

from kvlab.quant import quantize


def _time(fn, repeat: int = 5) -> float:
    """Best wall time of `repeat` runs after one warm-up (seconds)."""
    fn()
    best = float("inf")
    for _ in range(repeat):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t)
    return best


def run(n: int = 4096, device: str = "cpu", repeat: int = 5) -> dict[str, dict[str, float]]:
    """Figures per format: seconds for kvlab, torchao and a copy; ratios; bit-exactness."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from torchao.prototype.mx_formats.config import ScaleCalculationMode
        from torchao.prototype.mx_formats.mx_tensor import to_mx
        from torchao.prototype.mx_formats.nvfp4_tensor import nvfp4_quantize
    x = torch.randn(n, n, generator=torch.Generator().manual_seed(0)).to(device)
    t_copy = _time(lambda: x.clone(), repeat)
    peers = {
        "nvfp4": lambda: nvfp4_quantize(x),
        "mxfp4": lambda: to_mx(x, torch.float4_e2m1fn_x2, 32, ScaleCalculationMode.FLOOR),
    }
    out = {}
    for fmt, peer in peers.items():
        q = quantize(x, fmt)
        s_ref, d_ref = peer()
        exact = torch.equal(q.scales, s_ref.view(torch.uint8)) and torch.equal(q.codes, d_ref.view(torch.uint8))
        t_ours = _time(lambda: quantize(x, fmt), repeat)
        t_peer = _time(peer, repeat)
        out[fmt] = {"kvlab_s": t_ours, "torchao_s": t_peer, "copy_s": t_copy, "speedup_vs_torchao": t_peer / t_ours,
                    "fraction_of_copy": t_copy / t_ours, "bit_exact": exact}
    return out


def main() -> None:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    n = 4096
    gb = n * n * 4 / 1e9
    print(f"quantize + pack of a {n} x {n} fp32 tensor on {device} ({torch.get_num_threads()} threads), best of 5")
    for fmt, r in run(n, device).items():
        print(f"{fmt:6s} kvlab {gb / r['kvlab_s']:6.2f} GB/s  torchao {gb / r['torchao_s']:6.2f} GB/s  "
              f"copy {gb / r['copy_s']:6.2f} GB/s  kvlab/torchao speed x{r['speedup_vs_torchao']:.2f}  "
              f"kvlab/copy {r['fraction_of_copy']:.2f}  bit-exact {r['bit_exact']}")


if __name__ == "__main__":
    main()
