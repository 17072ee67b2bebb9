"""`kvlab eval`: a model's perplexity, task accuracy, bytes held and decode speed with a kvlab cache."""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import torch

from ..quality.prompt import PROTOCOLS
from .args import count, number


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


def _real_tasks() -> list[str]:
    from ..quality.tasks import TASKS
    return list(TASKS)


def _presses() -> tuple[list[str], list[str]]:
    """The registered presses (kvlab.hf.presses.PRESSES) and those defined as decode-time eviction too."""
    from ..hf.presses import DECODING, PRESSES
    return list(PRESSES), list(DECODING)


def _toy_tasks() -> list[str]:
    from ..toy.tasks import TASKS
    return list(TASKS)


def register(sub) -> None:
    p = sub.add_parser("eval", help="quality, bytes and speed of a model with a kvlab KV cache against BF16 "
                                    "DynamicCache")
    p.add_argument("model", help="a real model by name (kvlab pretrained list: smollm2-135m, gemma-3-270m), a GGUF "
                                 "file, a model directory, a committed checkpoint name (qwen3-tiny, ...) or a Hugging "
                                 "Face Hub id (HF_HUB_OFFLINE and the local cache are honoured)")
    p.add_argument("--kv-format", default=None, help="one kvlab format for K and V (default: bf16, as served, whatever the compute dtype)")
    p.add_argument("--k-format", default=None, help="format of keys (MLA: the latent)")
    p.add_argument("--v-format", default=None, help="format of values (MLA: the RoPE key)")
    p.add_argument("--residual", type=count("--residual"), default=0,
                   help="most recent tokens kept unquantized (KIVI's residual)")
    p.add_argument("--block", type=count("--block"), default=1,
                   help="tokens quantized together as they leave the residual (faster decoding; they wait in BF16)")
    p.add_argument("--mechanism", default=None,
                   help="window=W, topk=K, capped=BxS,topk=K, csa=M,topk=K,window=W or hca=M,window=W; a count "
                        "written a/b is that fraction of each context (window=1/4: a quarter of --tokens for the "
                        "perplexity windows, of each task sample's context)")
    p.add_argument("--press", default=None,
                   help=f"token eviction on full-attention layers: {', '.join(_presses()[0])} "
                        "(kvlab.hf.presses; 'adakv:knorm' names a wrapper's inner scorer)")
    p.add_argument("--keep", type=keep_budget, default=None,
                   help="the press's budget: < 1 the fraction of the context's tokens kept, >= 1 a token count")
    p.add_argument("--keep-bytes", type=count("--keep-bytes", 1), default=None,
                   help="the press's budget as bytes the cache holds after compressing the context")
    p.add_argument("--press-mode", choices=("prefill", "decode"), default="prefill",
                   help="prefill: compress the context once (kvpress); decode: evict back to the budget after "
                        f"every forward ({', '.join(_presses()[1])})")
    p.add_argument("--context", type=count("--context", 1), default=None,
                   help="with a press: tokens of each window prefilled as its context (default: half)")
    p.add_argument("--tokens", type=count("--tokens"), default=512, help="tokens per held-out window (and task "
                                                                           "sample)")
    p.add_argument("--windows", type=count("--windows"), default=8,
                   help="held-out windows scored, each through a fresh cache (the intervals' n)")
    p.add_argument("--chunk", type=count("--chunk"), default=32, help="tokens per forward (1: token by token)")
    p.add_argument("--task", default=None, metavar="TASK",
                   help="also score a task. On a real model, RULER's (generated offline, answered greedily): "
                        f"{', '.join(_real_tasks())}; on the byte-level checkpoints trained here, their own "
                        f"formats (teacher forced): {', '.join(_toy_tasks())}")
    p.add_argument("--task-file", default=None, metavar="FILE.jsonl",
                   help="score your own samples: JSON lines in kvpress's dataset columns (context, question, "
                        "answer_prefix, answer (a string or a list), max_new_tokens), answered greedily")
    p.add_argument("--task-tokens", type=count("--task-tokens", 64), default=None,
                   help="tokens of each generated task sample (RULER tasks: its context, default 1,024; checkpoint "
                        "tasks: default --tokens)")
    p.add_argument("--protocol", choices=PROTOCOLS, default="question_agnostic",
                   help="question_agnostic (kvpress's pipeline): the context alone is compressed, the question read "
                        "after it; question_aware: the question is inside the compressed context")
    p.add_argument("--samples", type=count("--samples", 1), default=16,
                   help="task samples: at least this many (default 16), then more until --halfwidth")
    p.add_argument("--halfwidth", type=number("--halfwidth", 0.0, 0.499), default=0.1,
                   help="draw task samples in rounds until the accuracies' Wilson 95%% intervals are at most this "
                        "wide on each side (default 0.1; 0: exactly --samples)")
    p.add_argument("--max-samples", type=count("--max-samples", 1), default=96,
                   help="the most task samples drawn while narrowing the intervals")
    p.add_argument("--batch", type=count("--batch", 1), default=32,
                   help="checkpoint tasks: samples per forward pass, as notebook 08's batch (a press's context is "
                        "everything before the batch's earliest question)")
    p.add_argument("--compute-dtype", choices=("auto", "bfloat16", "float32"), default="auto",
                   help="the model's compute dtype (auto: float32 for the checkpoints trained here, as notebook 08; "
                        "bfloat16 for pretrained models, as notebook 10)")
    p.add_argument("--max-new-tokens", type=count("--max-new-tokens", 1), default=None,
                   help="cap on tokens generated per answer (default: each sample's own; RULER's 128 / 30 / 120)")
    p.add_argument("--seed", type=count("--seed"), default=0, help="seed of the text windows and the samples")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--decode-steps", type=count("--decode-steps"), default=32, help="timed decode steps")
    p.add_argument("--device", default="auto", help="auto, cpu or cuda (auto: cuda when available)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_eval)


def _model_path(name: str) -> str:
    """A registry name or GGUF file converted once (kvlab.hf.pretrained); a checkpoint name; else as given."""
    from ..hf.pretrained import REGISTRY, resolve_model
    from ..hf.quality import resolve_model as checkpoint
    if name in REGISTRY or name.lower().endswith(".gguf"):
        return str(resolve_model(name))
    return checkpoint(name)


def cmd_eval(args) -> int:
    from ..errors import ParameterError
    from ..hf.evaluate import TEACHER_FORCED, evaluate, load
    from ..hf.quality import Setting
    from ..quality.evaluate import evaluate as answer_all
    from ..quality.evaluate import evaluate_task
    if args.kv_format and (args.k_format or args.v_format):
        raise ParameterError("give --kv-format, or --k-format and --v-format, not both")
    if not (args.kv_format or args.k_format or args.v_format):
        args.kv_format = "bf16"
    if args.task and args.task_file:
        raise ParameterError("give --task or --task-file, not both")
    real = args.task in _real_tasks() or args.task_file is not None
    if args.task is not None and not real and args.task not in _toy_tasks():
        raise ParameterError(f"task must be one of RULER's (a real model) {', '.join(_real_tasks())} or a checkpoint's "
                             f"{', '.join(_toy_tasks())}; got {args.task!r}")
    from ..hf.quality import at_context, mechanism_label
    from ..layout import kv_plan
    kv_plan(args.kv_format, args.k_format, args.v_format, args.residual, args.block)  # checked before the model loads
    if args.mechanism is not None:
        mechanism_label(args.mechanism)  # 'window=1/4': a fraction of each context, resolved per length below
    if args.press is not None:
        from ..hf.presses import make_plan
        make_plan(args.press, args.keep, args.keep_bytes, args.press_mode)
    samples = None
    if args.task_file:
        from ..quality.samples import read_samples
        samples = read_samples(args.task_file)
    path = _model_path(args.model)
    dtype = getattr(torch, args.compute_dtype if args.compute_dtype != "auto" else
                    "float32" if (Path(path) / "train_record.json").is_file() else "bfloat16")
    model, tok = load(path, dtype)
    if real and (tok is None or not hasattr(tok, "decode") or model.config.vocab_size <= 256):
        raise ParameterError(f"{args.task or args.task_file} is answered in text by a pretrained model: {args.model} "
                             f"has no tokenizer of words (the byte-level checkpoints trained here take their own "
                             f"tasks: {', '.join(_toy_tasks())})")
    def budget_fits(t: int, what: str) -> None:
        """A press's token budget above a context it compresses fails now, not after minutes of running."""
        if args.press is not None and args.keep is not None and args.keep >= 1 and args.press_mode == "prefill" \
                and int(args.keep) > t:
            raise ParameterError(f"--keep {int(args.keep):,} tokens is more than {what}: {t:,} tokens; a press "
                                 "keeps part of the context it compresses")
    budget_fits(args.context or max(1, args.tokens // 2), "each held-out window's context (--context; default "
                                                        "half of --tokens)")
    if real:  # before the perplexity run: a context the model cannot read fails now, not after minutes
        from ..quality.evaluate import check_samples, check_task_tokens
        if samples is not None:
            budget_fits(min(check_samples(model, tok, samples, args.protocol)), "the task file's shortest context")
        else:
            check_task_tokens(model, args.task_tokens or 1024)
            budget_fits(args.task_tokens or 1024, "the task's contexts (--task-tokens)")
    r = evaluate(args.model, args.kv_format, args.k_format, args.v_format, args.residual,
                 None if args.mechanism is None else at_context(args.mechanism, args.tokens),
                 tokens=args.tokens, task=None if real else args.task, samples=args.samples, chunk=args.chunk,
                 block=args.block, decode_steps=args.decode_steps, device=args.device, windows=args.windows,
                 press=args.press, keep=args.keep, keep_bytes=args.keep_bytes, press_mode=args.press_mode,
                 context=args.context, seed=args.seed, model=model, tokenizer=tok, batch=args.batch,
                 halfwidth=args.halfwidth, max_samples=args.max_samples, task_tokens=None if real else args.task_tokens)
    task_tokens = args.task_tokens or 1024
    if real:
        opts = dict(kv_format=args.kv_format, k_format=args.k_format, v_format=args.v_format, residual=args.residual,
                    block=args.block, mechanism=args.mechanism, press=args.press, keep=args.keep,
                    keep_bytes=args.keep_bytes, press_mode=args.press_mode)
        mine = Setting("setting", "kvlab", {k: v for k, v in opts.items() if v is not None})
        ref = Setting("reference", "kvlab", {})
        progress = not args.no_progress and not args.json
        if samples is not None:
            scores = answer_all(model, tok, samples, [mine, ref], args.protocol, args.max_new_tokens,
                                progress=progress)
            label, n_drawn = args.task_file, len(samples)
        else:
            run = evaluate_task(model, tok, args.task, task_tokens, [mine, ref], seed=args.seed,
                                samples=args.samples, halfwidth=args.halfwidth, max_samples=args.max_samples,
                                protocol=args.protocol, max_new_tokens=args.max_new_tokens, progress=progress)
            scores, label, n_drawn = run.scores, args.task, len(run.samples)
        a, b = scores["setting"], scores["reference"]
        ch = a.change(b, seed=args.seed)
        r.task, r.samples, r.answers = label, n_drawn, a.n
        r.accuracy, r.accuracy_ci = a.accuracy, a.accuracy_ci
        r.reference_accuracy, r.reference_accuracy_ci = b.accuracy, b.accuracy_ci
        r.accuracy_change, r.accuracy_change_ci = ch.value, ch.pair()
        r.protocol, r.task_tokens = args.protocol, None if samples is not None else task_tokens
        r.task_held_bytes, r.task_reference_bytes = a.context_bytes, b.context_bytes
        r.task_bytes_match = a.matches
    if args.json:
        print(json.dumps(r.as_dict(), indent=2))
        return 0
    dyn = r.compute_dtype.upper().replace("BFLOAT", "BF")
    ref = "BF16 Stack" if r.mechanism.startswith("v41") else f"{dyn} DynamicCache"
    press = f", press {r.press} (context {r.context:,} tokens)" if r.press else ""
    print(f"{r.model}: {r.kv_format}, {r.mechanism}{press}; {r.windows} windows of {r.tokens:,} tokens of {r.text}, "
          f"chunks of {r.chunk}, computing in {r.compute_dtype} (95% intervals)")
    lo, hi = r.perplexity_ci
    clo, chi = r.perplexity_change_ci
    print(f"  perplexity   {r.perplexity:10.4f}   [{lo:.4f}, {hi:.4f}]  ({ref} {r.reference_perplexity:.4f}; change "
          f"{r.perplexity_change:+.2%} [{clo:+.2%}, {chi:+.2%}]{', within noise' if r.within_noise else ''})")
    if r.task:
        a, b = r.accuracy_ci, r.reference_accuracy_ci
        lo, hi = r.accuracy_change_ci
        how = (f"; protocol {r.protocol}{'' if r.protocol == TEACHER_FORCED else ', greedy'}, change "
               f"{r.accuracy_change:+.3f} [{lo:+.3f}, {hi:+.3f}] paired")
        print(f"  {r.task:<12} {r.accuracy:10.3f}   [{a[0]:.3f}, {a[1]:.3f}]  ({ref} {r.reference_accuracy:.3f} "
              f"[{b[0]:.3f}, {b[1]:.3f}]; {r.answers} answers in {r.samples} samples{how})")
        if r.task_held_bytes is not None:
            print(f"  context held {r.task_held_bytes:10,}   (mean per sample; {ref} {r.task_reference_bytes:,}; "
                  f"predicted {'equal' if r.task_bytes_match else 'DIFFERENT'})")
    print(f"  held bytes   {r.held_bytes:10,}   (predicted {r.predicted_bytes:,}; {ref} {r.reference_bytes:,})")
    lo, hi = r.decode_tokens_per_s_range
    print(f"  decode       {r.decode_tokens_per_s:10.1f} tokens/s ({lo:.1f}-{hi:.1f}; {ref} "
          f"{r.reference_decode_tokens_per_s:.1f})")
    return 0
