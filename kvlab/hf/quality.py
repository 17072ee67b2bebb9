"""The memory / quality frontier on trained models (notebook 08): every way of holding a model's KV cache,
measured for held-out perplexity, task accuracy and the bytes it really holds, at several context lengths.

A `Setting` is one way to hold the cache: a kvlab plan (formats, residual, mechanism; `kvlab.hf.make_cache`)
or one of transformers' own caches (`kvlab.hf.evaluate.peer_cache`). `sweep` runs each over the same
held-out text windows and task samples (kvlab.train) through `kvlab.hf.evaluate.run_pass`, so the
protocol is `kvlab eval`'s: chunks of `chunk` tokens, each reading the cache as it stands, bytes measured
from the cache's tensors at the end of each window. `frontier` keeps, per model and context, the settings
no other beats on both bytes and perplexity.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..errors import ParameterError
from .evaluate import PEERS, Pass, decode_rate, peer_cache, run_pass

# The formats of the frontier: integer groups get KIVI's treatment (keys per channel, values per
# token) and a residual; the float formats quantize every token.
FORMATS = ("bf16", "fp8_e4m3", "mxfp8", "nvfp4", "mxfp4", "int4", "int2")
MECHANISMS = ("window=64", "topk=32", "capped=8x8,topk=32", "csa=4,topk=16,window=32", "hca=16,window=32")


@dataclass(frozen=True)
class Setting:
    """One way to hold a model's KV cache."""

    label: str  # its name in tables and plots
    kind: str  # "kvlab" (make_cache) or "peer" (a transformers cache)
    options: dict = field(default_factory=dict, hash=False)  # make_cache keywords, or {"peer": name}

    def make(self, model):
        from .cache import make_cache
        if self.kind == "peer":
            return peer_cache(model, self.options["peer"])
        return make_cache(model, **self.options)


def format_settings(formats=FORMATS, residual: int = 32) -> list[Setting]:
    """One setting per format; integer formats KIVI-style with a residual of `residual` tokens."""
    out = []
    for f in formats:
        kivi = f.startswith("int")
        opts = dict(kv_format=f, residual=residual if kivi else 0)
        out.append(Setting(f"{f} (KIVI, r={residual})" if kivi and residual else f, "kvlab", opts))
    return out


def mechanism_settings(mechanisms=MECHANISMS, kv_format: str = "bf16") -> list[Setting]:
    """One setting per mechanism, K/V in `kv_format`."""
    return [Setting(m if kv_format == "bf16" else f"{m} {kv_format}", "kvlab", dict(kv_format=kv_format, mechanism=m))
            for m in mechanisms]


def peer_settings(peers=("quanto4", "quanto2", "fp8")) -> list[Setting]:
    """transformers' QuantizedCache backends (quanto 4 / 2 bits, FP8) as settings."""
    for p in peers:
        if p not in PEERS:
            raise ParameterError(f"unknown peer cache {p!r}; choose one of {', '.join(PEERS)}")
    return [Setting(f"QuantizedCache {p}", "peer", dict(peer=p)) for p in peers]


def text_windows(encode, length: int, n: int, seed: int) -> torch.Tensor:
    """`n` windows of `length` tokens of kvlab's held-out text at seeded offsets: ids [n, length]."""
    from ..train.data import load_corpus
    corpus = load_corpus()
    g = torch.Generator().manual_seed(seed)
    text = corpus.text("heldout")
    out = []
    for _ in range(n):
        start = int(torch.randint(0, max(1, len(text) - 8 * length), (1,), generator=g))
        ids = encode(text[start:start + 8 * length])
        if len(ids) < length:
            raise ParameterError(f"held-out text too short for windows of {length} tokens")
        out.append(torch.tensor(ids[:length]))
    return torch.stack(out)


@dataclass
class Row:
    """One (model, setting, context) measurement."""

    model: str  # model name
    setting: str  # Setting.label
    kind: str  # "kvlab" or "peer"
    context: int  # tokens per window / task sample
    perplexity: float  # held-out, over every next token of every window
    accuracy: float | None  # task accuracy (None: no task)
    held_bytes: int  # measured after one window of `context` tokens (mean over windows)
    predicted_bytes: int | None  # kvlab's prediction for the same (kvlab settings)

    @property
    def bytes_per_token(self) -> float:
        return self.held_bytes / self.context


def is_v41(model) -> bool:
    """kvlab's V4.1-like model (kvlab.train.v41): its cache is its own Stack's, not a transformers cache."""
    return getattr(model.config, "model_type", None) == "kvlab_v41"


def stack_pass(model, ids: torch.Tensor, formats: dict, chunk: int, stack=None) -> Pass:
    """`run_pass` for the V4.1-like model: its trained weights in a kvlab.attention Stack whose packed stores
    hold compressed entries, index keys and the window in `formats` (role -> format), fed in chunks."""
    from ..train.v41 import to_stack
    stack = stack or to_stack(model, formats)
    stack.reset()
    nll, preds = 0.0, []
    with torch.no_grad():
        for a in range(0, ids.shape[1], chunk):
            logits = stack.forward(ids[:, a:a + chunk]).float()  # [1, c, V]
            preds.append(logits.argmax(-1))
            target = ids[:, a + 1:a + chunk + 1]
            n = target.shape[1]
            if n:
                nll += float(torch.nn.functional.cross_entropy(logits[0, :n], target[0], reduction="sum"))
    return Pass(nll, ids.shape[1] - 1, torch.cat(preds, 1), stack.cache_bytes()["total"], None)


def measure(model, setting: Setting, windows: torch.Tensor, samples, encode, chunk: int) -> tuple:
    """(perplexity, accuracy, held bytes, predicted bytes) of one setting over text windows [n, T] and task
    samples, each window and sample through a fresh cache."""
    from ..train.tasks import render, score_predictions
    if is_v41(model):
        from ..train.v41 import to_stack
        f = setting.options.get("kv_format") or "bf16"
        stack = to_stack(model, {r: f for r in ("main", "index", "swa")})
        run = lambda ids: stack_pass(model, ids, {}, chunk, stack)  # noqa: E731
    else:
        run = lambda ids: run_pass(model, ids, setting.make(model), chunk)  # noqa: E731
    nll = scored = 0
    held, pred = [], []
    for w in windows:
        p = run(w[None])
        nll, scored = nll + p.nll, scored + p.scored
        held.append(p.held_bytes)
        pred.append(p.predicted_bytes)
    right = total = 0
    for s in samples:
        ids, labels = render(s, encode)
        p = run(ids[None])
        r, n = score_predictions(p.predictions, labels[None])
        right, total = right + r, total + n
    ppl = float(torch.tensor(nll / scored).exp())
    acc = right / total if total else None
    mean = round(sum(held) / len(held))
    return ppl, acc, mean, (round(sum(pred) / len(pred)) if pred[0] is not None else None)


def applies(model, setting: Setting) -> bool:
    """Whether a setting applies to a model: the V4.1-like model takes plain formats (its compression and
    selection are its own, learned), not mechanisms, residuals or transformers' caches."""
    if not is_v41(model):
        return True
    o = setting.options
    return setting.kind == "kvlab" and not o.get("mechanism") and not o.get("residual")


def sweep(models: dict, settings: list[Setting], contexts: list[int], task: str | None, samples: int, windows: int,
          chunk: int, seed: int = 0, progress: bool = True) -> list[Row]:
    """Every (model, setting, context): models maps a name to (model, encode)."""
    from tqdm.auto import tqdm

    from ..train.tasks import get_task
    rows = []
    jobs = [(name, T) for name in models for T in contexts]
    bar = tqdm(total=len(jobs) * len(settings), disable=not progress, desc="settings")
    for name, T in jobs:
        model, encode = models[name]
        win = text_windows(encode, T, windows, seed)
        ss = get_task(task).samples(seed, samples, T) if task else []
        for s in settings:
            if not applies(model, s):
                bar.update()
                continue
            try:
                ppl, acc, held, pred = measure(model, s, win, ss, encode, chunk)
            except (ValueError, TypeError, RuntimeError) as e:
                if s.kind != "peer":
                    raise
                bar.update()  # a transformers cache that cannot hold this model: said, not hidden
                bar.write(f"{name} / {s.label}: not measured ({type(e).__name__}: {str(e).splitlines()[0]})")
                continue
            rows.append(Row(name, s.label, s.kind, T, ppl, acc, held, pred))
            bar.update()
    bar.close()
    return rows


def frontier(rows: list[Row]) -> list[Row]:
    """Rows no other row of the same model and context beats on both held bytes and perplexity."""
    out = []
    for r in rows:
        same = [o for o in rows if o.model == r.model and o.context == r.context]
        if not any((o.held_bytes <= r.held_bytes and o.perplexity < r.perplexity)
                   or (o.held_bytes < r.held_bytes and o.perplexity <= r.perplexity) for o in same):
            out.append(r)
    return out


def decode_speeds(model, settings: list[Setting], ids: torch.Tensor, prompt: int, steps: int, rounds: int = 3) -> dict:
    """Decode tokens/s per setting, interleaved over rounds (the machine may be shared): label -> list of rates."""
    rates = {s.label: [] for s in settings}
    for _ in range(rounds):
        for s in settings:
            rates[s.label] += decode_rate(model, lambda s=s: s.make(model), ids, prompt, steps, repeats=1)
    return rates
