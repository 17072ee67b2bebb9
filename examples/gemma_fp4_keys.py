"""NVFP4 / MXFP4 keys in Gemma-3-270M's three full-attention layers alone, with and without the first token's key
kept in BF16: does the attention sink explain NVFP4's loss (docs/quality.md)?

    .venv/bin/python examples/gemma_fp4_keys.py [--tokens 4096] [--samples 16] [--new 32] [--formats F,F,...]

The keys are fake-quantized inside attention (read back through the format, `kvlab.quant.roundtrip`; both formats
scale per token along head_dim, so quantizing the whole cache at every read equals quantizing each token once) on
forwards that read a cache, never on the context's own prefill, as kvlab's cache does under the question-agnostic
protocol; values and the sliding layers stay BF16. Greedy, `--new` tokens at most, niah_single_2, seed 0 (the grid's
samples). `--formats` runs those key formats instead (any kvlab format or variant: nvfp4_b32 is NVFP4's E4M3 scale
over 32, mxfp4_b16 MXFP4's power-of-two scale over 16). Measured 2026-12-06 on 2 shared cores: 539 s at 4,096 tokens.
"""
from __future__ import annotations

import argparse
import time

import torch
from transformers import AttentionInterface, DynamicCache
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

from kvlab.hf.evaluate import load
from kvlab.hf.pretrained import resolve_model
from kvlab.quality.evaluate import generate_answer
from kvlab.quality.prompt import sample_prompt
from kvlab.quality.scoring import is_right
from kvlab.quality.tasks import generate
from kvlab.quant.roundtrip import roundtrip
from kvlab.stats import wilson

MODES = {"bf16": (None, False), "nvfp4 keys": ("nvfp4", False), "nvfp4 keys, BOS in BF16": ("nvfp4", True),
         "mxfp4 keys": ("mxfp4", False)}  # label -> (key format on the full layers, first token kept in BF16)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--samples", type=int, default=16)
    ap.add_argument("--new", type=int, default=32, help="new tokens at most per answer")
    ap.add_argument("--formats", help="comma-separated key formats to run instead of the default four settings")
    a = ap.parse_args(argv)
    modes = {f"{f} keys": (f, False) for f in a.formats.split(",")} if a.formats else MODES
    model, tok = load(str(resolve_model("gemma-3-270m")))
    full = {i for i, t in enumerate(model.config.layer_types) if t == "full_attention"}
    mode = {"fmt": None, "keep_first": False}

    def attention(module, q, k, v, mask, **kw):  # q [B, H, Tq, D], k [B, Hkv, Tk, D]
        if mode["fmt"] and module.layer_idx in full and q.shape[2] < k.shape[2]:  # a read through the cache
            kq = roundtrip(k.float(), mode["fmt"]).to(k.dtype)
            if mode["keep_first"]:
                kq[:, :, 0] = k[:, :, 0]
            k = kq
        return sdpa_attention_forward(module, q, k, v, mask, **kw)

    ALL_MASK_ATTENTION_FUNCTIONS.register("kvlab_fake_keys", sdpa_mask)
    AttentionInterface.register("kvlab_fake_keys", attention)
    model.set_attn_implementation("kvlab_fake_keys")

    def answer(p, smp) -> str:
        """The context prefilled (keys unquantized), then kvlab's greedy reader to `--new` tokens."""
        cache = DynamicCache(config=model.config)
        with torch.no_grad():
            model(torch.tensor([p.context_ids]), past_key_values=cache, use_cache=True)
        return generate_answer(model, tok, cache, p.question_ids, smp.answer, a.new, stop_when_right=False)[0]

    right = {m: 0 for m in modes}
    t0 = time.perf_counter()
    samples = generate("niah_single_2", tok, a.tokens, a.samples, 0, None)
    for i, smp in enumerate(samples):
        p = sample_prompt(tok, smp)
        texts = {}
        for m, (fmt, keep_first) in modes.items():
            mode.update(fmt=fmt, keep_first=keep_first)
            texts[m] = answer(p, smp)
            right[m] += is_right(texts[m], smp.answer)
        print(i, " | ".join(f"{m}: {t[:24]!r}" for m, t in texts.items()), flush=True)
    for m, r in right.items():
        lo, hi = wilson(r, len(samples))
        print(f"{m:26s} {r}/{len(samples)} [{lo:.2f}, {hi:.2f}]")
    print(f"{time.perf_counter() - t0:,.0f} s")


if __name__ == "__main__":
    main()
