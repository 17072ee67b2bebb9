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
from fractions import Fraction
from pathlib import Path

import torch

from ..checks import need_int, need_list
from ..errors import ParameterError
from ..models import DATA_DIR
from ..nb.params import NotebookParams
from .evaluate import (PEERS, Pass, decode_rate, is_v41, peer_cache, run_pass, stack_layout, stack_pass,
                       text_windows)

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


@dataclass
class QualityParams(NotebookParams):
    """Notebook 08's parameters, checked on construction: a bad one stops the notebook with one message."""

    models: list  # trained dense / MLA checkpoints: names under data/checkpoints, directories or Hub ids
    v41_model: str  # the V4.1-like checkpoint ("" leaves it out)
    formats: list  # kvlab formats (integer ones KIVI-style)
    residual: int  # recent tokens the integer formats keep unquantized
    mechanisms: list  # kvlab.hf.mechanisms strings
    peers: list  # transformers QuantizedCache backends
    contexts: list  # tokens per held-out window and task sample
    task: str  # kvlab.train.tasks name
    samples: int  # task samples per context
    windows: int  # held-out windows per context
    chunk: int  # tokens per forward
    compute_dtype: str  # the models' compute dtype
    decode_steps: int  # decode steps timed per peer pair
    decode_rounds: int  # interleaved timing rounds
    seed: int  # seed of windows and samples
    threads: int  # torch CPU threads
    paths: list = field(init=False)  # models (and the V4.1-like one) resolved to directories (or Hub ids)
    dtype: torch.dtype = field(init=False)  # compute_dtype as a torch dtype

    def __post_init__(self):
        from ..formats import get_format
        from .evaluate import quiet
        from .mechanisms import parse_mechanism
        names = self.need_names("models")
        if self.need_text("v41_model"):
            names = names + [self.v41_model]
        self.paths = [resolve_model(m) for m in names]
        for f in self.need_names("formats"):
            self.need_lookup("formats", get_format, f)
        for m in self.need_names("mechanisms", empty=True):
            self.need_lookup("mechanisms", parse_mechanism, m)
        self.need_names("peers", PEERS[1:], empty=True)
        self.need_ints("contexts", 16)
        with quiet():  # kvlab.train registers its model with transformers: imports that log timestamps
            from ..train.tasks import TASKS
        self.need_choice("task", TASKS)
        self.need_int("residual", 0)
        for k in ("samples", "windows", "chunk", "decode_steps", "decode_rounds", "threads"):
            self.need_int(k, 1)
        self.need_int("seed", 0)
        self.need_choice("compute_dtype", COMPUTE_DTYPES)
        self.dtype = getattr(torch, self.compute_dtype)


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


def format_settings(formats=FORMATS, residual: int = 32, dtype: torch.dtype | None = None) -> list[Setting]:
    """One setting per format; integer formats KIVI-style with a residual of `residual` tokens; `dtype` is the
    cache's own (its residual's), default the model's."""
    out = []
    for f in formats:
        kivi = f.startswith("int")
        opts = dict(kv_format=f, residual=residual if kivi else 0, dtype=dtype)
        out.append(Setting(f"{f} (KIVI, r={residual})" if kivi and residual else f, "kvlab", opts))
    return out


def mechanism_settings(mechanisms=MECHANISMS, kv_format: str = "bf16", dtype: torch.dtype | None = None
                       ) -> list[Setting]:
    """One setting per mechanism, K/V in `kv_format`."""
    from .mechanisms import parse_mechanism
    out = []
    for m in mechanisms:
        label = parse_mechanism(m).label()  # 'window:64' and 'window=64' alike
        out.append(Setting(label if kv_format == "bf16" else f"{label} {kv_format}", "kvlab",
                           dict(kv_format=kv_format, mechanism=m, dtype=dtype)))
    return out


def peer_settings(peers=("quanto4", "quanto2", "fp8")) -> list[Setting]:
    """transformers' QuantizedCache backends (quanto 4 / 2 bits, FP8) as settings."""
    for p in peers:
        if p not in PEERS:
            raise ParameterError(f"unknown peer cache {p!r}; choose one of {', '.join(PEERS)}")
    return [Setting(f"QuantizedCache {p}", "peer", dict(peer=p)) for p in peers]


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
    """(run, growth): run(ids [1, T]) -> Pass through a fresh cache of `setting` (the V4.1-like model: its Stack);
    growth() -> the layout's bytes per token once a pass has run (None for a peer)."""
    growth = None
    if is_v41(model):
        from ..train.v41 import to_stack
        f = setting.options.get("kv_format") or "bf16"
        roles = {r: f for r in ("main", "index", "swa")}
        stack = to_stack(model, roles)
        growth = stack_layout(model, f).bytes_per_token

        def run(ids):
            return stack_pass(model, ids, roles, chunk, stack)
    else:
        def run(ids):
            nonlocal growth
            cache = setting.make(model)
            p = run_pass(model, ids, cache, chunk)
            if hasattr(cache, "layout"):
                growth = cache.layout.bytes_per_token
            return p
    return run, (lambda: growth)


def measure(model, setting: Setting, windows: torch.Tensor, samples, encode, chunk: int) -> Measured:
    """One setting over text windows [n, T] and task samples, each window and sample through a fresh cache."""
    from ..train.tasks import render, score_predictions
    run, grown = runner(model, setting, chunk)
    nll = scored = 0
    held, pred = [], []
    per_nll, per_tokens = [], []
    for w in windows:
        p = run(w[None])
        nll, scored = nll + p.nll, scored + p.scored
        per_nll.append(p.nll)
        per_tokens.append(p.scored)
        held.append(p.held_bytes)
        pred.append(p.predicted_bytes)
    right = total = 0
    matches = all(h == q for h, q in zip(held, pred))
    for s in samples:
        ids, labels = render(s, encode)
        p = run(ids[None])
        r, n = score_predictions(p.predictions, labels[None])
        right, total = right + r, total + n
        matches = matches and p.held_bytes == p.predicted_bytes
    ppl = float(torch.tensor(nll / scored).exp())
    acc = right / total if total else None
    mean = round(sum(held) / len(held))
    counts = dict(window_nll=per_nll, window_tokens=per_tokens, right=right, answers=total)
    growth = grown()
    if pred[0] is None:
        return Measured(ppl, acc, mean, None, None, None, **counts)
    return Measured(ppl, acc, mean, round(sum(pred) / len(pred)), matches, growth, **counts)


def applies(model, setting: Setting) -> bool:
    """Whether a setting applies to a model: the V4.1-like model takes plain formats (its compression and
    selection are its own, learned), not mechanisms, residuals or transformers' caches."""
    if not is_v41(model):
        return True
    o = setting.options
    return setting.kind == "kvlab" and not o.get("mechanism") and not o.get("residual")


def sweep(models: dict, settings: list[Setting], contexts: list[int], task: str | None, samples: int, windows: int,
          chunk: int, seed: int = 0, progress: bool = True) -> list[Row]:
    """Every (model, setting, context): models maps a name to (model, encode). The text windows are nested:
    a context of T tokens reads the first T tokens of the same windows (drawn once at the longest context),
    so perplexities at two contexts differ by the context, not by the text; task samples are drawn per context."""
    from tqdm.auto import tqdm

    from ..train.tasks import get_task
    contexts = [need_int("contexts", t, 2) for t in need_list("contexts", contexts, "a list of token counts")]
    for k, v in (("samples", samples), ("windows", windows), ("chunk", chunk)):
        need_int(k, v, 1)
    rows = []
    longest = max(contexts)
    bar = tqdm(total=len(models) * len(contexts) * len(settings), disable=not progress, desc="settings")
    for name, (model, encode) in models.items():
        text = text_windows(encode, longest, windows, seed)  # [windows, longest]
        for T in contexts:
            win = text[:, :T]
            ss = get_task(task).samples(seed, samples, T) if task else []
            for s in settings:
                if not applies(model, s):
                    bar.update()
                    continue
                try:
                    m = measure(model, s, win, ss, encode, chunk)
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
               samples: int, chunk: int, seed: int = 0) -> list[DepthCell]:
    """Accuracy by context length x depth of the asked fact (RULER / needle-in-a-haystack plots), per model and
    setting: `samples` seeded samples per cell, each through a fresh cache. models maps a name to (model, encode);
    the task must place its asked fact by a `depth` option (kvlab.train.tasks)."""
    import inspect

    from ..checks import need_int
    from ..train.tasks import get_task, render, score_predictions
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
                    right = total = 0
                    for i in range(samples):
                        sample = t.generate(((seed * 100_003 + T) * 101 + j) * 100_003 + i, T, depth=float(d))
                        ids, labels = render(sample, encode)
                        r, n = score_predictions(run(ids[None]).predictions, labels[None])
                        right, total = right + r, total + n
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


def training_record(path: str) -> dict:
    """What a kvlab.train checkpoint says about its training (train_record.json), or {} for other models."""
    import json
    f = Path(path) / "train_record.json"
    if not f.is_file():
        return {}
    r = json.loads(f.read_text())
    final = r.get("final") or {}
    return dict(steps=r.get("steps_run"), tokens=r.get("tokens"), parameters=r.get("parameters"),
                heldout_loss=final.get("heldout_loss"), tasks=final.get("tasks") or {})


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
