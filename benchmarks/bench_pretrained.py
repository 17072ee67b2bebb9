"""The real registry models (kvlab.hf.pretrained) on this machine: conversion, load, prefill and decode speed.

For each registry model whose package is installed: the conversion's wall time and size on disk (from its
kvlab_source.json; the first run converts), the time to load the converted folder (model and tokenizer, BF16),
prefill time at 1K / 2K / 4K tokens through kvlab's BF16 cache and through transformers' DynamicCache, and greedy
decode tokens/s after a 1K-token prompt (teacher forced, the same ids for both caches). Rounds interleave the two
caches so each pair sees the same machine state; the report gives the best round and the range. Bytes held after
each prefill are measured from the cache's tensors and checked against kvlab's prediction. One torch thread by
default: on a shared 2-core machine two threads spinning against other jobs made decode 10-30x slower (measured:
0.2-0.5 tok/s against 6-7 with one thread).
"""
from __future__ import annotations

import time
import warnings

import torch


def _time(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def _prefill(model, cache, ids):
    with torch.no_grad():
        model(ids, cache=cache, use_cache=True)


def _decode(model, cache, ids, prompt: int) -> float:
    """Prefill ids[:, :prompt], then one-token steps over the rest: decode tokens/s."""
    with torch.no_grad():
        model(ids[:, :prompt], cache=cache, use_cache=True)
        t0 = time.perf_counter()
        for i in range(prompt, ids.shape[1]):
            model(ids[:, i:i + 1], cache=cache, use_cache=True)
    return (ids.shape[1] - prompt) / (time.perf_counter() - t0)


def run(name: str, contexts=(1024, 2048, 4096), prompt: int = 1024, steps: int = 32, rounds: int = 3) -> dict:
    from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache
    from kvlab.hf import make_cache, pretrained
    t0 = time.perf_counter()
    folder = pretrained.resolve_model(name)
    resolve_s = time.perf_counter() - t0
    rec = pretrained.record(folder)
    loads = []
    for _ in range(rounds):
        t = time.perf_counter()
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16, local_files_only=True).eval()
        AutoTokenizer.from_pretrained(folder, local_files_only=True)
        loads.append(time.perf_counter() - t)
    vocab = model.config.vocab_size
    ids = torch.randint(100, vocab, (1, max(max(contexts), prompt + steps)), generator=torch.Generator().manual_seed(0))
    caches = {"kvlab bf16": lambda: make_cache(model), "DynamicCache": lambda: DynamicCache(config=model.config)}
    _decode(model, make_cache(model), ids[:, :prompt + 2], prompt)  # warm up
    prefill = {t: {k: [] for k in caches} for t in contexts}
    held = {}
    for t in contexts:
        for _ in range(rounds):
            for k, make in caches.items():
                c = make()
                prefill[t][k].append(_time(lambda: _prefill(model, c, ids[:, :t])))
                if k == "kvlab bf16":
                    held[t] = (c.nbytes, c.predicted_bytes())
    decode = {k: [] for k in caches}
    for _ in range(rounds):
        for k, make in caches.items():
            decode[k].append(_decode(model, make(), ids[:, :prompt + steps], prompt))
    return dict(name=name, folder=str(folder), resolve_s=resolve_s, convert_s=rec["converted"]["wall_s"],
                size=rec["converted"]["size_on_disk"], gguf_size=rec["source"]["size"], load=loads,
                prefill=prefill, held=held, decode=decode, prompt=prompt, steps=steps, threads=torch.get_num_threads())


def _rng(xs, fmt="{:.2f}") -> str:
    return f"{fmt.format(min(xs))} [{fmt.format(min(xs))}, {fmt.format(max(xs))}]"


def main(models=None, rounds: int = 3, threads: int = 1) -> list[dict]:
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return _report(models, rounds)
    finally:
        torch.set_num_threads(before)


def _report(models, rounds: int) -> list[dict]:
    import importlib.util
    from kvlab.hf import pretrained
    out = []
    for name, p in pretrained.REGISTRY.items():
        if models and name not in models:
            continue
        if importlib.util.find_spec(p.module) is None:
            print(f"{name}: not installed ({p.install}); skipped")
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            r = run(name, rounds=rounds)
        out.append(r)
        print(f"{name}: {r['folder']} (GGUF {r['gguf_size'] / 1e6:,.0f} MB -> {r['size'] / 1e6:,.0f} MB float32; "
              f"converted in {r['convert_s']:,.1f} s); resolve {r['resolve_s']:.3f} s; load folder (BF16) "
              f"{_rng(r['load'])} s; torch threads {r['threads']}")
        for t, by in r["prefill"].items():
            nb, pred = r["held"][t]
            print(f"  prefill {t:>5,} tokens: " + "; ".join(f"{k} {_rng(v)} s" for k, v in by.items())
                  + f"; kvlab held {nb:,} B (predicted {pred:,}{'' if nb == pred else ' DIFFERS'})")
        d = r["decode"]
        ratio = sorted(a / b for a, b in zip(d["kvlab bf16"], d["DynamicCache"]))
        print(f"  decode after {r['prompt']:,} tokens ({r['steps']} steps, best round [range]): "
              + "; ".join(f"{k} {max(v):.1f} [{min(v):.1f}, {max(v):.1f}] tok/s" for k, v in d.items())
              + f"; kvlab / DynamicCache {ratio[len(ratio) // 2]:.3f} [{ratio[0]:.3f}, {ratio[-1]:.3f}]")
    return out


if __name__ == "__main__":
    import sys
    main(sys.argv[1:] or None)
