"""`kvlab eval`: a model's perplexity, task accuracy, bytes held and decode speed with a kvlab cache."""
from __future__ import annotations

import argparse
import json
import math

from .args import count


def keep_budget(s: str) -> float | int:
    """--keep: a fraction in (0, 1) of the context's tokens, or a whole number of tokens >= 1."""
    try:
        v = float(s.replace(",", "").replace("_", ""))
    except ValueError:
        v = math.nan
    if not math.isfinite(v) or v <= 0 or (v >= 1 and v != int(v)):
        raise argparse.ArgumentTypeError(f"--keep must be a fraction in (0, 1) or a whole number of tokens >= 1, "
                                         f"got {s!r}")
    return v if v < 1 else int(v)


def register(sub) -> None:
    p = sub.add_parser("eval", help="quality, bytes and speed of a model with a kvlab KV cache against BF16 "
                                    "DynamicCache")
    p.add_argument("model", help="a model directory (save_pretrained output) or a Hugging Face Hub id "
                                 "(HF_HUB_OFFLINE and the local cache are honoured)")
    p.add_argument("--kv-format", default=None, help="one kvlab format for K and V (default: the model's dtype)")
    p.add_argument("--k-format", default=None, help="format of keys (MLA: the latent)")
    p.add_argument("--v-format", default=None, help="format of values (MLA: the RoPE key)")
    p.add_argument("--residual", type=count("--residual"), default=0,
                   help="most recent tokens kept unquantized (KIVI's residual)")
    p.add_argument("--block", type=count("--block"), default=1,
                   help="tokens quantized together as they leave the residual (faster decoding; they wait in BF16)")
    p.add_argument("--mechanism", default=None,
                   help="window=W, topk=K, capped=BxS,topk=K, csa=M,topk=K,window=W or hca=M,window=W")
    p.add_argument("--press", default=None,
                   help="token eviction on full-attention layers: streaming_llm, knorm, snapkv, tova, h2o, "
                        "expected_attention, random, pyramidkv, adakv, keydiff, lagkv, chunkkv, cur "
                        "(kvlab.hf.presses)")
    p.add_argument("--keep", type=keep_budget, default=None,
                   help="the press's budget: < 1 the fraction of the context's tokens kept, >= 1 a token count")
    p.add_argument("--keep-bytes", type=count("--keep-bytes", 1), default=None,
                   help="the press's budget as bytes the cache holds after compressing the context")
    p.add_argument("--press-mode", choices=("prefill", "decode"), default="prefill",
                   help="prefill: compress the context once (kvpress); decode: evict back to the budget after "
                        "every forward (h2o, tova, streaming_llm)")
    p.add_argument("--context", type=count("--context", 1), default=None,
                   help="with a press: tokens of each window prefilled as its context (default: half)")
    p.add_argument("--tokens", type=count("--tokens"), default=512, help="tokens per held-out window (and task "
                                                                           "sample)")
    p.add_argument("--windows", type=count("--windows"), default=8,
                   help="held-out windows scored, each through a fresh cache (the intervals' n)")
    p.add_argument("--chunk", type=count("--chunk"), default=32, help="tokens per forward (1: token by token)")
    p.add_argument("--task", default=None, help="also score a task: mqar, needle or vartrack")
    p.add_argument("--samples", type=count("--samples"), default=8, help="task samples")
    p.add_argument("--decode-steps", type=count("--decode-steps"), default=32, help="timed decode steps")
    p.add_argument("--device", default="auto", help="auto, cpu or cuda (auto: cuda when available)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_eval)


def cmd_eval(args) -> int:
    from ..errors import ParameterError
    from ..hf.evaluate import evaluate
    if args.kv_format and (args.k_format or args.v_format):
        raise ParameterError("give --kv-format, or --k-format and --v-format, not both")
    r = evaluate(args.model, args.kv_format, args.k_format, args.v_format, args.residual, args.mechanism,
                 tokens=args.tokens, task=args.task, samples=args.samples, chunk=args.chunk, block=args.block,
                 decode_steps=args.decode_steps, device=args.device, windows=args.windows, press=args.press,
                 keep=args.keep, keep_bytes=args.keep_bytes, press_mode=args.press_mode, context=args.context)
    if args.json:
        print(json.dumps(r.as_dict(), indent=2))
        return 0
    ref = "BF16 Stack" if r.mechanism.startswith("v41") else "BF16 DynamicCache"
    press = f", press {r.press} (context {r.context:,} tokens)" if r.press else ""
    print(f"{r.model}: {r.kv_format}, {r.mechanism}{press}; {r.windows} windows of {r.tokens:,} tokens of {r.text}, "
          f"chunks of {r.chunk} (95% intervals)")
    lo, hi = r.perplexity_ci
    clo, chi = r.perplexity_change_ci
    print(f"  perplexity   {r.perplexity:10.4f}   [{lo:.4f}, {hi:.4f}]  ({ref} {r.reference_perplexity:.4f}; change "
          f"{r.perplexity_change:+.2%} [{clo:+.2%}, {chi:+.2%}]{', within noise' if r.within_noise else ''})")
    if r.task:
        a, b = r.accuracy_ci, r.reference_accuracy_ci
        print(f"  {r.task:<12} {r.accuracy:10.3f}   [{a[0]:.3f}, {a[1]:.3f}]  ({ref} {r.reference_accuracy:.3f} "
              f"[{b[0]:.3f}, {b[1]:.3f}]; {r.answers} answers in {r.samples} samples)")
    print(f"  held bytes   {r.held_bytes:10,}   (predicted {r.predicted_bytes:,}; {ref} {r.reference_bytes:,})")
    lo, hi = r.decode_tokens_per_s_range
    print(f"  decode       {r.decode_tokens_per_s:10.1f} tokens/s ({lo:.1f}-{hi:.1f}; {ref} "
          f"{r.reference_decode_tokens_per_s:.1f})")
    return 0
