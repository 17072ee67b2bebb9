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

import re
from dataclasses import dataclass, field, replace
from fractions import Fraction
from pathlib import Path

import torch

from ..checks import need_int, need_list
from ..errors import ParameterError
from ..models import DATA_DIR
from .evaluate import (PEERS, Pass, decode_rate, is_v41, peer_cache, question_start, run_pass, score_samples,
                       stack_layout, task_rounds,
                       stack_pass, text_windows)
from .presses import PRESSES

CHECKPOINTS = DATA_DIR / "checkpoints"  # the small trained models (kvlab.train; `make train` rebuilds them)
COMPUTE_DTYPES = ("float32", "bfloat16")


def resolve_model(name: str) -> str:
    """A model directory as given, or a checkpoint name under data/checkpoints, or (otherwise) a Hub id."""
    p = Path(name).expanduser()
    if p.is_dir():
        return str(p)
    if (CHECKPOINTS / name).is_dir():
        return str(CHECKPOINTS / name)
    return name


# What `full=True` runs (notebook 08): every format, each mechanism and every press at 1/8, 1/4 and 1/2 of the
# context, every setting on every model at both contexts, samples in rounds until every Wilson 95% interval is at most
# +-0.05 (385 bound it at any accuracy: kvlab.stats.samples_for_halfwidth) and a heatmap of every setting and model.
FULL_BUDGETS = ("1/8", "1/4", "1/2")
FULL = dict(
    formats=("bf16", "fp8_e4m3", "mxfp8", "nvfp4", "mxfp4", "int4", "int2"),
    mechanisms=tuple(m for b in FULL_BUDGETS for m in (f"window={b}", f"topk={b}"))
    + ("capped=1/64x8,topk=1/16", "csa=4,topk=1/16,window=1/16", "hca=2,window=1/16", "hca=4,window=1/16",
       "hca=8,window=1/16"),
    presses=tuple(f"{p} keep {b}" for p in PRESSES for b in FULL_BUDGETS),
    others=("*",), longer=("*",), heatmap=("*",), contexts=(1024, 2048), heatmap_contexts=(256, 512, 1024, 2048),
    samples=32, halfwidth=0.05, windows=32, depth_samples=20)


# The formats of the frontier: integer groups get KIVI's treatment (keys per channel, values per
# token) and a residual; the float formats quantize every token.
FORMATS = ("bf16", "fp8_e4m3", "mxfp8", "nvfp4", "mxfp4", "int4", "int2")
MECHANISMS = ("window=64", "topk=32", "capped=8x8,topk=32", "csa=4,topk=16,window=32", "hca=16,window=32")


FRACTION = re.compile(r"(\d+)/(\d+)")  # a budget written as a fraction of the context: window=1/8


def at_context(text: str, tokens: int) -> str:
    """`text` with every fraction a/b replaced by round(tokens * a / b) (at least 2): 'window=1/8' at 1,024
    tokens is 'window=128'."""
    def one(m):
        a, b = int(m.group(1)), int(m.group(2))
        if b == 0 or a > b:
            raise ParameterError(f"budget {m.group(0)} in {text!r} is not a fraction of the context in (0, 1]")
        return str(max(2, round(tokens * a / b)))
    return FRACTION.sub(one, text)


@dataclass(frozen=True)
class Setting:
    """One way to hold a model's KV cache. Options may state budgets as fractions of the context (a mechanism's
    'window=1/8', a press's keep < 1): `make(model, tokens)` resolves them for a context of `tokens` tokens."""

    label: str  # its name in tables and plots
    kind: str  # "kvlab" (make_cache) or "peer" (a transformers cache)
    options: dict = field(default_factory=dict, hash=False)  # make_cache keywords, or {"peer": name}

    @property
    def press(self) -> bool:
        """A token-eviction press: its context is prefilled in one forward and compressed (kvpress's protocol)."""
        return self.options.get("press") is not None

    def make(self, model, tokens: int | None = None):
        from .cache import make_cache
        if self.kind == "peer":
            return peer_cache(model, self.options["peer"])
        o = dict(self.options)
        if isinstance(o.get("mechanism"), str) and FRACTION.search(o["mechanism"]):
            if tokens is None:
                raise ParameterError(f"setting {self.label!r} states its budget as a fraction: give the context")
            o["mechanism"] = at_context(o["mechanism"], tokens)
        return make_cache(model, **o)


def format_settings(formats=FORMATS, residual: int = 32, dtype: torch.dtype | None = None) -> list[Setting]:
    """One setting per format; integer formats KIVI-style with a residual of `residual` tokens; `dtype` is the
    cache's own (its residual's), default the model's."""
    out = []
    for f in formats:
        r = kivi_residual(f, residual)
        opts = dict(kv_format=f, residual=r, dtype=dtype)
        out.append(Setting(f"{f} (KIVI, r={residual})" if r else f, "kvlab", opts))
    return out


def kivi_residual(fmt: str, residual: int) -> int:
    """The residual a setting in `fmt` keeps: integer formats are run KIVI-style with `residual` recent tokens
    unquantized, the float formats quantize every token."""
    return residual if fmt.startswith("int") else 0


def mechanism_label(text: str) -> str:
    """A mechanism's label, checked: kvlab.hf.mechanisms' own ('window:64' and 'window=64' alike), fractions of the
    context kept as written ('window=1/8')."""
    from .mechanisms import parse_mechanism
    if not isinstance(text, str):
        raise ParameterError(f"mechanism must be a string such as 'window=1/8', got {text!r}")
    if not FRACTION.search(text):
        return parse_mechanism(text).label()
    parse_mechanism(at_context(text, 1 << 16))  # the same checks at a nominal context
    return re.sub(r"\s+", "", text).replace(":", "=")


def mechanism_settings(mechanisms=MECHANISMS, kv_format: str = "bf16", dtype: torch.dtype | None = None
                       ) -> list[Setting]:
    """One setting per mechanism, K/V in `kv_format`."""
    out = []
    for m in mechanisms:
        label = mechanism_label(m)
        out.append(Setting(label if kv_format == "bf16" else f"{label} {kv_format}", "kvlab",
                           dict(kv_format=kv_format, mechanism=m, dtype=dtype)))
    return out


def peer_settings(peers=("quanto4", "quanto2", "fp8")) -> list[Setting]:
    """transformers' QuantizedCache backends (quanto 4 / 2 bits, FP8) as settings."""
    for p in peers:
        if p not in PEERS:
            raise ParameterError(f"unknown peer cache {p!r}; choose one of {', '.join(PEERS)}")
    return [Setting(f"QuantizedCache {p}", "peer", dict(peer=p)) for p in peers]


def press_settings(presses=("snapkv keep 1/4",), kv_format: str = "bf16", dtype: torch.dtype | None = None,
                   residual: int = 32) -> list[Setting]:
    """One setting per press and budget (kvlab.hf.presses), written 'snapkv keep 1/4', 'snapkv 1/4' or
    'snapkv=1/4': the budget a fraction of the context (1/4, 0.25) or a token count; K/V in `kv_format`, or in
    the format a third word names ('snapkv keep 1/4 nvfp4': the press composed with that format,
    kvlab.hf.presses.Composed; integer formats KIVI-style with a residual of `residual` tokens, as the formats'
    own settings)."""
    from .presses import Composed
    out = []
    for spec in need_list("presses", presses, "a list of 'press keep budget' strings"):
        c = Composed.parse(spec, kv_format)  # checks the name, the budget and the format now, before any model runs
        c = replace(c, residual=kivi_residual(c.kv_format, residual))
        out.append(Setting(c.label(), "kvlab", dict(c.cache_options(), dtype=dtype)))
    return out


def same_label(a: str, b: str) -> bool:
    """Two setting labels name the same setting ('window:1/4' is 'window=1/4': notebooks write ':')."""
    norm = lambda x: re.sub(r"\s+", " ", x.strip()).replace(":", "=")  # noqa: E731
    return norm(a) == norm(b)


@dataclass
class Measured:
    """One setting over a model's text windows and task samples."""

    perplexity: float  # exp(mean NLL) over every next token of every window
    accuracy: float | None  # task answers right / answers (None: no samples)
    held_bytes: int  # bytes held after a window (mean over windows)
    predicted_bytes: int | None  # kvlab's prediction after a window (None: a peer)
    matches: bool | None  # held == predicted after every window and sample (None: a peer)
    bytes_per_token: Fraction | None  # the layout's growth per token (None: a peer)
    window_nll: list = field(default_factory=list)  # summed next-token NLL of each text window (nats)
    window_tokens: list = field(default_factory=list)  # next tokens scored in each window
    right: int = 0  # task answers right
    answers: int = 0  # task answers scored (the accuracy's n)
    samples: int = 0  # task samples drawn (one answer each for niah / needle / vartrack; several for mqar / recall)
    sample_held_bytes: int | None = None  # bytes held after a task sample (mean; a press holds its budget there)
    sample_right: list = field(default_factory=list)  # answers right in each task sample (seeded order)
    sample_answers: list = field(default_factory=list)  # answers in each task sample

    @property
    def accuracy_ci(self) -> list | None:
        """[low, high]: the accuracy's Wilson 95% interval (None: no answers)."""
        from ..stats import wilson
        return list(wilson(self.right, self.answers)) if self.answers else None

    @property
    def perplexity_ci(self) -> list:
        """[low, high]: the perplexity's bootstrap 95% interval over the windows (seeded)."""
        from ..stats import bootstrap_perplexity
        return bootstrap_perplexity(self.window_nll, self.window_tokens).pair()


@dataclass(kw_only=True)
class Row(Measured):
    """One (model, setting, context) measurement."""

    model: str  # model name
    setting: str  # Setting.label
    kind: str  # "kvlab" or "peer"
    context: int  # tokens per window / task sample


def runner(model, setting: Setting, chunk: int):
    """(run, growth): run(ids [B, T], prefill=None) -> Pass through a fresh cache of `setting` (the V4.1-like
    model: its Stack, one row at a time), the first `prefill` tokens in one forward when the setting is a press
    (its context, compressed once); growth() -> the layout's bytes per token once a pass has run (None: a peer)."""
    growth = None
    if is_v41(model):
        from ..toy.v41 import to_stack
        f = setting.options.get("kv_format") or "bf16"
        roles = {r: f for r in ("main", "index", "swa")}
        stack = to_stack(model, roles)
        growth = stack_layout(model, f).bytes_per_token

        def run(ids, prefill=None):
            ps = [stack_pass(model, row[None], roles, chunk, stack) for row in ids]
            return Pass(sum(p.nll for p in ps), sum(p.scored for p in ps), torch.cat([p.predictions for p in ps]),
                        sum(p.held_bytes for p in ps), sum(p.predicted_bytes for p in ps), [p.nll for p in ps])
    else:
        def run(ids, prefill=None):
            nonlocal growth
            cache = setting.make(model, ids.shape[1])
            p = run_pass(model, ids, cache, chunk, prefill if setting.press else None)
            if hasattr(cache, "layout"):
                growth = cache.layout.bytes_per_token
            return p
    return run, (lambda: growth)


def measure(model, setting: Setting, windows: torch.Tensor, task: str | None, seed: int, encode, chunk: int,
            samples: int = 32, halfwidth: float | None = None, max_samples: int | None = None,
            batch: int = 32) -> Measured:
    """One setting over text windows [n, T] and task samples of T tokens, `batch` rows per fresh cache.
    Task samples: `samples` of them, or, with `halfwidth`, more in rounds of `batch` until the accuracy's Wilson
    95% interval is at most that wide on each side (or `max_samples` are scored); the sample stream is seeded, so
    a run is reproducible. A press prefills each window's first half (a task sample: all before its question).
    Task samples are drawn and scored by kvlab.hf.evaluate.task_rounds, which `kvlab eval` calls too."""
    run, grown = runner(model, setting, chunk)
    t = windows.shape[1]
    per_nll, per_tokens, held, pred, rows = [], [], [], [], 0
    for i in range(0, windows.shape[0], batch):
        w = windows[i:i + batch]
        p = run(w, max(1, t // 2))
        per_nll += p.row_nll
        per_tokens += [t - 1] * w.shape[0]
        held.append(p.held_bytes)
        pred.append(p.predicted_bytes)
        rows += w.shape[0]
    mean = round(sum(held) / rows)
    n_window_passes = len(held)
    right = total = drawn = 0
    per_sample = []
    if task:
        tc = task_rounds(run, task, seed, t, encode, samples, batch, halfwidth or 0.0, max_samples)
        right, total, drawn, per_sample = tc.right, tc.answers, tc.samples, tc.per_sample
        held += tc.held
        pred += tc.predicted
    nll, scored = sum(per_nll), sum(per_tokens)
    ppl = float(torch.tensor(nll / scored).exp())
    acc = right / total if total else None
    counts = dict(window_nll=per_nll, window_tokens=per_tokens, right=right, answers=total, samples=drawn,
                  sample_held_bytes=round(sum(held[n_window_passes:]) / drawn) if drawn else None,
                  sample_right=[r for r, _ in per_sample], sample_answers=[n for _, n in per_sample])
    if pred[0] is None:
        return Measured(ppl, acc, mean, None, None, None, **counts)
    matches = all(h == q for h, q in zip(held, pred))
    return Measured(ppl, acc, mean, round(sum(pred[:n_window_passes]) / rows), matches, grown(), **counts)


def applies(model, setting: Setting) -> bool:
    """Whether a setting applies to a model: the V4.1-like model takes plain formats (its compression and
    selection are its own, learned), not mechanisms, residuals, presses or transformers' caches; presses score
    dense K/V heads, which an MLA latent (shared by its heads) does not have."""
    o = setting.options
    if is_v41(model):
        return setting.kind == "kvlab" and not o.get("mechanism") and not o.get("residual") and not setting.press
    return not (setting.press and getattr(model.config, "kv_lora_rank", None))


def sweep(models: dict, settings: list[Setting], contexts: list[int], task: str | None, samples: int, windows: int,
          chunk: int, seed: int = 0, progress: bool = True, halfwidth: float | None = None,
          max_samples: int | None = None, batch: int = 32, longer: list[Setting] | None = None) -> list[Row]:
    """Every (model, setting, context): models maps a name to (model, encode); `longer` (if given) limits the
    contexts after the first to those settings. The text windows are nested: a context of T tokens reads the
    first T tokens of the same windows (drawn once at the longest context), so perplexities at two contexts
    differ by the context, not by the text; task samples are drawn per context (`samples`, or with `halfwidth`
    as many as the Wilson interval needs, up to `max_samples`: `measure`)."""
    from tqdm.auto import tqdm

    contexts = [need_int("contexts", t, 2) for t in need_list("contexts", contexts, "a list of token counts")]
    for k, v in (("samples", samples), ("windows", windows), ("chunk", chunk), ("batch", batch)):
        need_int(k, v, 1)
    if halfwidth is not None and not 0 < halfwidth < 0.5:
        raise ParameterError(f"halfwidth = {halfwidth!r}: an interval's half-width is in (0, 0.5)")
    rows = []
    longest = max(contexts)
    later = settings if longer is None else [s for s in settings if any(s.label == x.label for x in longer)]
    per_model = len(settings) + (len(contexts) - 1) * len(later)
    bar = tqdm(total=len(models) * per_model, disable=not progress, desc="settings")
    for name, (model, encode) in models.items():
        text = text_windows(encode, longest, windows, seed)  # [windows, longest]
        for i, T in enumerate(contexts):
            win = text[:, :T]
            for s in (settings if i == 0 else later):
                if not applies(model, s):
                    bar.update()
                    continue
                try:
                    m = measure(model, s, win, task, seed * 7_919 + T, encode, chunk, samples, halfwidth,
                                max_samples, batch)
                except (ValueError, TypeError, RuntimeError) as e:
                    if s.kind != "peer":
                        raise
                    bar.update()  # a transformers cache that cannot hold this model: said, not hidden
                    bar.write(f"{name} / {s.label}: not measured ({type(e).__name__}: {str(e).splitlines()[0]})")
                    continue
                rows.append(Row(**vars(m), model=name, setting=s.label, kind=s.kind, context=T))
                bar.update()
    bar.close()
    return rows


@dataclass(frozen=True)
class DepthCell:
    """Accuracy of one setting on a depth-placed task (the needle heatmap's cell): one context, one depth."""

    model: str  # model name
    setting: str  # Setting.label
    context: int  # tokens per sample
    depth: float  # where the asked fact sits: 0 = the start of the filler, 1 = its end
    right: int  # answers right
    answers: int  # answers scored

    @property
    def accuracy(self) -> float:
        return self.right / self.answers

    @property
    def ci(self) -> list:
        """[low, high]: Wilson 95% interval."""
        from ..stats import wilson
        return list(wilson(self.right, self.answers))


def decile_depths(n: int = 10) -> list[float]:
    """The centres of n equal depth bins: 0.05, 0.15, ..., 0.95 for deciles."""
    from ..checks import need_int
    n = need_int("depths", n, 1)
    return [(i + 0.5) / n for i in range(n)]


def depth_grid(models: dict, settings: list[Setting], task: str, contexts: list[int], depths: list[float],
               samples: int, chunk: int, seed: int = 0, batch: int = 32) -> list[DepthCell]:
    """Accuracy by context length x depth of the asked fact (RULER / needle-in-a-haystack plots), per model and
    setting: `samples` seeded samples per cell, each through a fresh cache. models maps a name to (model, encode);
    the task must place its asked fact by a `depth` option (kvlab.toy.tasks)."""
    import inspect

    from ..checks import need_int
    from ..toy.tasks import get_task
    t = get_task(task)
    if "depth" not in inspect.signature(t.generate).parameters:
        raise ParameterError(f"task {task!r} does not place its answer by depth; a depth grid needs one that does")
    samples = need_int("samples", samples, 1)
    for d in depths:
        if not 0.0 <= float(d) <= 1.0:
            raise ParameterError(f"depth {d} is not in [0, 1]")
    out = []
    for name, (model, encode) in models.items():
        for s in settings:
            if not applies(model, s):
                continue
            run, _ = runner(model, s, chunk)
            for T in contexts:
                for j, d in enumerate(depths):
                    cell = [t.generate(((seed * 100_003 + T) * 101 + j) * 100_003 + i, T, depth=float(d))
                            for i in range(samples)]
                    right, total, _, _, _ = score_samples(run, cell, encode, batch)
                    out.append(DepthCell(name, s.label, T, float(d), right, total))
    return out


def changes(rows: list[Row], reference: str = "bf16", seed: int = 0) -> dict:
    """(model, setting, context) -> PerplexityChange against the `reference` setting of the same model and context,
    paired over the same windows (kvlab.stats.perplexity_change); rows without that reference are left out."""
    from ..stats import perplexity_change
    refs = {(r.model, r.context): r for r in rows if r.setting == reference}
    out = {}
    for r in rows:
        ref = refs.get((r.model, r.context))
        if ref is not None and r.window_tokens == ref.window_tokens and r.window_nll:
            out[r.model, r.setting, r.context] = perplexity_change(ref.window_nll, r.window_nll, r.window_tokens,
                                                                   seed=seed)
    return out


def accuracy_changes(rows: list[Row], reference: str = "bf16", seed: int = 0) -> dict:
    """(model, setting, context) -> Interval of the task accuracy's change against the `reference` setting on the
    same samples (kvlab.stats.paired_accuracy_change); rows without that reference or without samples are left out."""
    from ..stats import paired_accuracy_change
    refs = {(r.model, r.context): r for r in rows if r.setting == reference}
    out = {}
    for r in rows:
        ref = refs.get((r.model, r.context))
        if ref is None or not r.sample_right:
            continue
        k = min(len(ref.sample_right), len(r.sample_right))  # the shared prefix of one seeded sample stream
        if k and ref.sample_answers[:k] == r.sample_answers[:k]:
            out[r.model, r.setting, r.context] = paired_accuracy_change(ref.sample_right[:k], r.sample_right[:k],
                                                                        r.sample_answers[:k], seed=seed)
    return out


def kept_positions(model, setting: Setting, ids: torch.Tensor, prefill: int | None, chunk: int) -> list:
    """Which original positions each layer holds after `ids` [1, T] went through a fresh cache of `setting` (a press:
    its first `prefill` tokens compressed as the context): per layer a LongTensor [1, Hkv, held], sorted."""
    cache = setting.make(model, ids.shape[1])
    run_pass(model, ids, cache, chunk, prefill if setting.press else None)
    return [layer.positions.cpu() for layer in cache.layers]


def family(label: str) -> str:
    """A setting's method without its budget: 'snapkv keep 1/4' -> 'snapkv', 'window=1/8' -> 'window'."""
    if " keep " in label:
        return label.split(" keep ")[0]
    if " (" in label:  # 'int4 (KIVI, r=32)'
        return label.split(" (")[0]
    return label.split("=")[0] if "=" in label else label


def fewest_bytes(rows: list[Row], target: float, context: int) -> dict:
    """(model, method) -> the row holding the fewest bytes (where its accuracy was measured) among that method's
    budgets whose accuracy reaches `target` at `context` tokens, or None when no budget measured does: the budget a
    method needs for the target (the row carries its Wilson interval: how sure that reading is)."""
    out = {}
    for r in rows:
        if r.context != context or r.accuracy is None:
            continue
        k = (r.model, family(r.setting))
        held = r.sample_held_bytes if r.sample_held_bytes is not None else r.held_bytes
        ok = r.accuracy >= target
        best = out.get(k)
        if ok and (best is None or held < (best.sample_held_bytes if best.sample_held_bytes is not None
                                           else best.held_bytes)):
            out[k] = r
        else:
            out.setdefault(k, None)
    return out


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
    rounds = need_int("rounds", rounds, 1)
    rates = {s.label: [] for s in settings}
    for _ in range(rounds):
        for s in settings:
            rates[s.label] += decode_rate(model, lambda s=s: s.make(model), ids, prompt, steps, repeats=1)
    return rates


# kvlab settings matched to transformers' QuantizedCache backends at the same bits: integer groups of 64 for keys
# and values alike (per channel, as QuantizedCache groups both), 0-127 newest tokens waiting in the model's dtype
# (quanto's residual_length 128; kvlab quantizes them 128 at a time, each token once), FP8 with one scale per tensor.
PEER_PAIRS = {
    "quanto4": Setting("kvlab int4_g64", "kvlab", dict(kv_format="int4_g64", block=128, value_axis="channel")),
    "quanto2": Setting("kvlab int2_g64", "kvlab", dict(kv_format="int2_g64", block=128, value_axis="channel")),
    "fp8": Setting("kvlab fp8_e4m3", "kvlab", dict(kv_format="fp8_e4m3")),
}


def load_models(paths: list[str], dtype: torch.dtype) -> dict:
    """name -> (model, encode) for directories or Hub ids (kvlab.hf.evaluate.load), computing in `dtype`."""
    from .evaluate import encoder, load
    out = {}
    for p in paths:
        model, tok = load(p, dtype)
        out[Path(p).name if Path(p).is_dir() else p] = (model, encoder(tok, model.config.vocab_size))
    return out


def count_parameters(model) -> int:
    """Distinct parameters (tied embeddings once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def peer_table_settings(peers=("quanto4", "quanto2", "fp8")) -> list[Setting]:
    """The side-by-side table's caches: kvlab BF16 beside transformers' DynamicCache, then each QuantizedCache
    backend beside kvlab's setting at the same bits (PEER_PAIRS)."""
    out = [Setting("kvlab bf16", "kvlab", dict(kv_format="bf16")), Setting("DynamicCache", "peer", dict(peer="dynamic"))]
    for p in peers:
        out += [PEER_PAIRS[p], *peer_settings([p])]
    return out


def table(rows: list[Row]):
    """The rows as one pandas table per (model, setting): bytes per token (the layout's), and per context the
    bytes held (measured), whether they equal kvlab's prediction, perplexity and task accuracy."""
    import pandas as pd
    df = pd.DataFrame([dict(model=r.model, setting=r.setting, kind=r.kind, context=r.context,
                            bytes_per_token=None if r.bytes_per_token is None else float(r.bytes_per_token),
                            held_bytes=r.held_bytes, exact=r.matches, perplexity=r.perplexity, accuracy=r.accuracy)
                       for r in rows])
    order = list(dict.fromkeys(zip(df.model, df.setting)))
    wide = df.pivot_table(index=["model", "setting"], columns="context", aggfunc="first",
                          values=["held_bytes", "perplexity", "accuracy"], dropna=False)
    wide.columns = [f"{v} @{t}" for v, t in wide.columns]
    head = df.groupby(["model", "setting"], sort=False)[["kind", "bytes_per_token", "exact"]].first()
    out = head.join(wide).loc[order]
    cols = ["kind", "bytes_per_token", "exact"] + [f"{v} @{t}" for v in ("held_bytes", "perplexity", "accuracy")
                                                   for t in sorted(df.context.unique())]
    out = out[cols]
    for c in out.columns:
        if c.startswith("held_bytes"):
            out[c] = out[c].astype("Int64")
    return out
