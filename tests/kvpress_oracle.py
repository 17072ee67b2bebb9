"""kvpress (NVIDIA/kvpress 0.5.5) as the oracle of kvlab.hf.presses: the cases, and the runner that executes
kvpress's own presses in its own venv (.venv-kvpress: kvpress pins transformers < 5.3; `make oracle-kvpress`).

    .venv-kvpress/bin/python tests/kvpress_oracle.py CHECKPOINT OUT.json [INPUTS.json]

INPUTS.json, when given, replaces the texts and budgets: {"ids": [[token ids], ...], "keeps": [0.25, ...]} (a real
model's tokenized context, as tests/test_kvpress_oracle.py writes it for SmolLM2-135M and Gemma-3-270M), and
optionally "dtype" ("float32", the default, or "bfloat16": the model's weights and cache, as kvpress's pipeline runs
it) and "presses" (kvlab press names: only these cases). For every case (press, options, keep) and text, it prefills
the context through kvpress's press (its forward hooks; on Gemma 3 the full-attention layers only, `hooked`) into a
DynamicCache and reads back the kept positions per layer and KV head by matching each compressed
key row to the uncompressed cache's rows (kvpress keeps them in score order: sets, not sequences; AdaKV keeps
every row and masks: its `masked_key_indices`), and the scores its scorer gave (for ties at the cutoff).
This file imports nothing from kvpress at import time: tests/test_kvpress_oracle.py reads its cases.
"""
from __future__ import annotations

import json
import sys
from contextlib import contextmanager

# Fixed texts, fed as bytes (the checkpoint is byte-level): code and prose, 512 tokens each.
TEXTS = [
    ("def merge(a, b):\n    \"\"\"Merge two sorted lists into one sorted list.\"\"\"\n    out, i, j = [], 0, 0\n"
     "    while i < len(a) and j < len(b):\n        if a[i] <= b[j]:\n            out.append(a[i]); i += 1\n"
     "        else:\n            out.append(b[j]); j += 1\n    return out + a[i:] + b[j:]\n\n\n"
     "class Counter(dict):\n    def __missing__(self, key):\n        return 0\n\n    def update(self, items):\n"
     "        for x in items:\n            self[x] += 1\n        return self\n\n\nif __name__ == '__main__':\n"
     "    print(merge([1, 4, 9], [2, 3, 10]))\n    c = Counter().update('mississippi')\n    print(sorted(c.items()))\n"
     "    for k, v in c.items():\n        assert v > 0, k\n"),
    ("The library keeps its catalogue in a single long room under the roof, where the light is good in the "
     "morning and poor after three. Readers who come for the maps are asked to sign the ledger by the door, "
     "to leave their coats on the hooks, and to turn the pages with the wooden paddle rather than their "
     "fingers. Nobody remembers who made the rule about the paddle, but everybody follows it, and the maps "
     "have lasted. On Thursdays the keeper opens the east cabinet, which holds the harbour charts, and on "
     "Fridays the west one with the mountain surveys. A visitor once asked why the cabinets are never open "
     "together; the keeper said the room is too small for two kinds of longing at once."),
]
TOKENS = 512
KEEPS = (0.25, 0.6)

# press name in kvlab -> (kvpress class, options shared by both, attention implementation kvpress needs)
CASES = {
    "streaming_llm": ("StreamingLLMPress", {}, "sdpa"),
    "knorm": ("KnormPress", {}, "sdpa"),
    "snapkv": ("SnapKVPress", {}, "sdpa"),
    "tova": ("TOVAPress", {}, "sdpa"),
    "h2o": ("ObservedAttentionPress", {}, "eager"),
    "expected_attention": ("ExpectedAttentionPress", {}, "sdpa"),
    "random": ("RandomPress", {"seed": 0}, "sdpa"),
    "pyramidkv": ("PyramidKVPress", {"window_size": 8}, "sdpa"),  # a small window: the pyramid is not flat
    "adakv": ("AdaKVPress", {}, "sdpa"),  # over SnapKV
    "keydiff": ("KeyDiffPress", {}, "sdpa"),
    "lagkv": ("LagKVPress", {}, "sdpa"),
    "chunkkv": ("ChunkKVPress", {}, "sdpa"),  # over SnapKV
    "cur": ("CURPress", {}, "sdpa"),  # leverage of keys x values in windows of 16, 4 sinks
}
WRAPPED = {"adakv", "chunkkv"}  # kvpress wrappers: the inner scorer is SnapKVPress


def ids(text: str):
    import torch
    b = list(text.encode("utf-8"))
    b = (b * (TOKENS // len(b) + 1))[:TOKENS]
    return torch.tensor(b)[None]  # [1, T]


def kept_rows(full, comp):
    """Positions of comp's rows [B, H, k, D] in full [B, H, T, D]: [B][H] sorted lists (nearest row)."""
    import torch
    d = torch.cdist(comp.float(), full.float())  # [B, H, k, T]
    return d.argmin(-1).sort(-1).values.tolist(), float(d.min(-1).values.max())


def full_layers(model) -> list[int]:
    """The layers a press acts on: every layer, or on Gemma 3 the full-attention ones (kvpress 0.5.5's rule for
    Gemma3ForConditionalGeneration in BasePress.__call__, presses/base_press.py, applied to Gemma3ForCausalLM too)."""
    layers = model.model.layers
    return [i for i, layer in enumerate(layers) if not getattr(layer.self_attn, "is_sliding", False)]


@contextmanager
def hooked(press, model):
    """`with press(model)`, except that on Gemma 3 (Gemma3ForCausalLM, which kvpress 0.5.5 hooks on every layer as
    "not tested") the sliding-window layers are skipped as kvpress's own __call__ skips them for
    Gemma3ForConditionalGeneration: the same post_init, rotary_emb and forward hook, on the full layers only."""
    if getattr(model.config, "model_type", "") != "gemma3_text":
        with press(model):
            yield
        return
    press.post_init_from_model(model)
    hooks = []
    try:
        for i in full_layers(model):
            attn = model.model.layers[i].self_attn
            attn.rotary_emb = model.model.rotary_emb
            hooks.append(attn.register_forward_hook(press.forward_hook, with_kwargs=True))
        yield
    finally:
        for h in hooks:
            h.remove()


def run(checkpoint: str, inputs: dict | None = None) -> dict:
    """Every case on every text (or `inputs`' token ids) and budget, in float32."""
    import torch
    import kvpress
    from transformers import AutoModelForCausalLM, DynamicCache
    from transformers.utils import logging
    logging.disable_progress_bar()
    logging.set_verbosity_error()
    torch.manual_seed(0)
    inputs = inputs or {}
    dtype = getattr(torch, inputs.get("dtype", "float32"))
    cases = {k: v for k, v in CASES.items() if k in inputs.get("presses", CASES)}
    models = {impl: AutoModelForCausalLM.from_pretrained(checkpoint, dtype=dtype,
                                                         attn_implementation=impl).eval()
              for impl in sorted({c[2] for c in cases.values()})}
    out = {"kvpress": kvpress.__version__ if hasattr(kvpress, "__version__") else "0.5.5",
           "transformers": __import__("transformers").__version__, "torch": torch.__version__, "dtype": str(dtype),
           "cases": []}
    texts = [torch.tensor(t)[None] for t in inputs["ids"]] if "ids" in inputs else [ids(t) for t in TEXTS]  # [1, T]
    keeps = inputs.get("keeps", KEEPS)
    for ti, x in enumerate(texts):
        fulls = {}
        for name, (cls, opts, impl) in cases.items():
            model = models[impl]
            if impl not in fulls:
                with torch.no_grad():
                    fulls[impl] = DynamicCache()
                    model(x, past_key_values=fulls[impl], use_cache=True)
            full = fulls[impl]
            for keep in keeps:
                ratio = 1 - keep
                if name in WRAPPED:
                    inner = kvpress.SnapKVPress(compression_ratio=ratio)
                    press = getattr(kvpress, cls)(press=inner, **opts)
                    scorer = inner
                else:
                    press = getattr(kvpress, cls)(compression_ratio=ratio, **opts)
                    scorer = press
                scores = []
                score = scorer.score

                def wrapped(module, *a, _score=score, **k):
                    s = _score(module, *a, **k)
                    scores.append(s.float().tolist())
                    return s
                scorer.score = wrapped
                cache = DynamicCache()
                try:
                    with torch.no_grad(), hooked(press, model):
                        model(x, past_key_values=cache, use_cache=True)
                except Exception as e:  # kvpress itself fails on this model: recorded, not compared
                    out["cases"].append(dict(press=name, text=ti, keep=keep, options=opts, attn=impl,
                                             error=f"{type(e).__name__}: {str(e).splitlines()[0]}"))
                    continue
                layers, far, scored = [], 0.0, full_layers(model)
                for i, layer in enumerate(cache.layers):
                    if i not in scored:  # a sliding layer kvpress does not compress (Gemma 3)
                        layers.append(None)
                        continue
                    attn = model.model.layers[i].self_attn
                    if name == "adakv":
                        b, h, s = (t.tolist() for t in attn.masked_key_indices)
                        t = layer.keys.shape[2]
                        kept = [[sorted(set(range(t)) - {q for bb, hh, q in zip(b, h, s) if bb == 0 and hh == j})
                                 for j in range(layer.keys.shape[1])]]
                        del attn.masked_key_indices
                    else:
                        kept, dist = kept_rows(full.layers[i].keys, layer.keys)
                        far = max(far, dist)
                    layers.append(kept)
                out["cases"].append(dict(press=name, text=ti, keep=keep, options=opts, attn=impl, kept=layers,
                                         scores=scores, match_distance=far, full_layers=scored))
    return out


if __name__ == "__main__":
    json.dump(run(sys.argv[1], json.load(open(sys.argv[3])) if len(sys.argv) > 3 else None), open(sys.argv[2], "w"))
