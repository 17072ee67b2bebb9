"""Decode speed inside transformers: kvlab's cache against DynamicCache and QuantizedCache, same model, same text.

The model is kvlab's tiny dense preset (Qwen3: hidden 128, 4 layers, 4 query / 2 KV heads of 32; random weights,
since speed does not depend on training), in BF16 on CPU, one torch thread. Each cache prefills `prompt` tokens,
then decodes `steps` tokens teacher forced on the same ids (the same work for every cache). Pairs, at the same bits:
  BF16   DynamicCache                  | kvlab bf16
  4-bit  QuantizedCache quanto, nbits 4 | kvlab int4_g64: keys and values per channel in groups of 64 tokens
  2-bit  QuantizedCache quanto, nbits 2 | kvlab int2_g64       (QuantizedCache groups both the same way)
  FP8    QuantizedCache fp8 (per tensor) | kvlab fp8_e4m3 (one FP32 scale per tensor)
quanto keeps up to residual_length - 1 = 127 recent tokens in BF16 and then re-quantizes the whole cache; the
kvlab caches here quantize 128 tokens at a time (block=128, residual 0: the same 0-127 BF16 tokens waiting), each
token once. Rounds interleave every cache so each pair sees the same machine state; the machine is shared, so the
report gives the median and the range of tokens/s over rounds, and the per-round ratio of each pair. Bytes held
are measured from each cache's tensors after the run (kvlab.hf.evaluate.held_bytes).
Besides end-to-end tokens/s (the model's own work is most of a step, and is the same for every cache), the time
spent inside `cache.update` is reported: the cache's own cost per step, the sharper comparison on a busy machine.
Goals (issue 11): at 4 bits kvlab at least as fast as quanto while holding no more bytes; BF16 kvlab within 1.5x
of DynamicCache.
"""
from __future__ import annotations

import time
import warnings

import torch

from kvlab.hf.quality import PEER_PAIRS

# (name, peer, make_cache options): BF16 against DynamicCache, then notebook 08's pairs (kvlab.hf.quality.PEER_PAIRS)
PAIRS = [("bf16", "dynamic", dict(kv_format=None))] + [
    (s.label.removeprefix("kvlab "), peer, s.options) for peer, s in PEER_PAIRS.items()]


def tiny_model(seed: int = 0):
    from transformers import AutoModelForCausalLM, Qwen3Config
    cfg = Qwen3Config(vocab_size=256, hidden_size=128, intermediate_size=384, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=4096,
                      tie_word_embeddings=True, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16, attn_implementation="sdpa").eval()


def _decode(model, cache, ids: torch.Tensor, prompt: int) -> tuple[float, float]:
    """Prefill ids[:, :prompt], then one-token steps over the rest: (decode tokens/s, ms per step inside
    cache.update, i.e. the cache's own work, apart from the model's)."""
    inside = [0.0]
    update = cache.update

    def timed(*a, **k):
        t = time.perf_counter()
        out = update(*a, **k)
        inside[0] += time.perf_counter() - t
        return out

    steps = ids.shape[1] - prompt
    with torch.no_grad():
        model(ids[:, :prompt], cache=cache, use_cache=True)
        cache.update = timed
        t0 = time.perf_counter()
        for i in range(prompt, ids.shape[1]):
            model(ids[:, i:i + 1], cache=cache, use_cache=True)
        dt = time.perf_counter() - t0
    del cache.update
    return steps / dt, 1e3 * inside[0] / steps


def run(prompt: int = 512, steps: int = 64, rounds: int = 9, seed: int = 0) -> list[dict]:
    from kvlab.hf import make_cache
    from kvlab.hf.evaluate import held_bytes, peer_cache
    model = tiny_model(seed)
    ids = torch.randint(0, 256, (1, prompt + steps), generator=torch.Generator().manual_seed(seed))
    makers = {}
    for name, peer, opts in PAIRS:
        makers[f"kvlab {name}"] = lambda o=opts: make_cache(model, **o)
        makers[peer] = lambda p=peer: peer_cache(model, p)
    for make in makers.values():  # warm up (numba compiles its decoder once per machine)
        _decode(model, make(), ids[:, :prompt + 4], prompt)
    rates = {k: [] for k in makers}
    inside = {k: [] for k in makers}
    held = {}
    for _ in range(rounds):
        for k, make in makers.items():
            cache = make()
            r, ms = _decode(model, cache, ids, prompt)
            rates[k].append(r)
            inside[k].append(ms)
            held[k] = held_bytes(cache)
    rows = []
    for name, peer, _ in PAIRS:
        ours, theirs = rates[f"kvlab {name}"], rates[peer]
        ratio = sorted(a / b for a, b in zip(ours, theirs))
        rows.append(dict(bits=name, kvlab=f"kvlab {name}", peer=peer, kvlab_best=max(ours), peer_best=max(theirs),
                         kvlab_range=(min(ours), max(ours)), peer_range=(min(theirs), max(theirs)),
                         ratio=_median(ratio), ratio_range=(ratio[0], ratio[-1]),
                         kvlab_cache_ms=min(inside[f"kvlab {name}"]), peer_cache_ms=min(inside[peer]),
                         kvlab_bytes=held[f"kvlab {name}"], peer_bytes=held[peer]))
    return rows


def _median(xs):
    s = sorted(xs)
    return s[len(s) // 2]


def main(prompt: int = 512, steps: int = 64, rounds: int = 9, threads: int = 1) -> list[dict]:
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            rows = run(prompt, steps, rounds)
    finally:
        torch.set_num_threads(before)
    print(f"decode inside transformers: tiny Qwen3 (4 layers, 2 KV heads x 32), BF16, CPU, {threads} thread(s); "
          f"{prompt}-token prompt, {steps} decode steps, {rounds} interleaved rounds")
    print("tokens/s: best round (range); kvlab/peer: median of per-round ratios (range); cache ms/step: time inside "
          "cache.update, best round")
    print(f"{'pair':<26} {'kvlab tok/s':>19} {'peer tok/s':>19} {'kvlab/peer':>17} {'cache ms/step':>15} "
          f"{'kvlab B':>9} {'peer B':>9}")
    for r in rows:
        print(f"{r['kvlab'] + ' | ' + r['peer']:<26} {r['kvlab_best']:6.1f} ({r['kvlab_range'][0]:4.1f}-"
              f"{r['kvlab_range'][1]:4.1f}) {r['peer_best']:6.1f} ({r['peer_range'][0]:4.1f}-{r['peer_range'][1]:4.1f}) "
              f"{r['ratio']:5.2f} ({r['ratio_range'][0]:.2f}-{r['ratio_range'][1]:.2f}) "
              f"{r['kvlab_cache_ms']:6.2f} / {r['peer_cache_ms']:5.2f} {r['kvlab_bytes']:>9,} {r['peer_bytes']:>9,}")
    return rows


if __name__ == "__main__":
    main()
