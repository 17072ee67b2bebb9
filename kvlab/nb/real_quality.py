"""Notebook 10's parameters and glue (quality on a real pretrained model). Checked on construction, so a bad value
stops the notebook in its second cell."""
from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import ParameterError
from ..hf.quality import Setting, format_settings, mechanism_label, mechanism_settings, press_settings
from .params import NotebookParams


@dataclass
class RealQualityParams(NotebookParams):
    """Notebook 10's parameters, checked on construction: a bad one stops the notebook with one message."""

    models: list  # real models: kvlab.hf.pretrained names, GGUF files or model folders
    task: str  # kvlab.quality.tasks name (RULER's definitions)
    contexts: list  # context tokens per sample
    formats: list  # kvlab formats (integer ones KIVI-style with `residual`)
    residual: int  # recent tokens the integer formats keep unquantized
    mechanisms: list  # kvlab.hf.mechanisms strings; a/b is that fraction of the context
    presses: list  # 'name keep budget [format]' (kvlab.hf.presses; budget a fraction of the context)
    protocol: str  # question_agnostic (kvpress's pipeline) or question_aware
    samples: int  # samples per context: the least
    model_samples: dict  # {model: samples}: a model answering fewer (or more) samples than `samples`
    halfwidth: float  # more samples, in rounds, until every Wilson 95% interval is this narrow (0: exactly `samples`)
    max_samples: int  # the most samples per context
    round_size: int  # samples per round
    max_new_tokens: int  # cap on generated tokens per answer (0: each sample's own, RULER's)
    text_windows: int  # windows of prose for the perplexity change (0: none)
    text_tokens: int  # tokens per prose window
    seed: int  # seed of the samples and windows
    threads: int  # torch CPU threads (0: torch's default)
    paths: dict = field(init=False)  # model -> its folder

    def __post_init__(self):
        from ..hf.pretrained import resolve_model
        from ..quality.prompt import PROTOCOLS
        from ..quality.tasks import TASKS
        models = self.need_names("models")
        if len(set(models)) != len(models):
            raise ParameterError(f"parameter models names a model twice: {models}")
        self.paths = {m: str(self.need_lookup("models", resolve_model, m)) for m in models}
        self.need_choice("task", TASKS)
        self.need_ints("contexts", 64, 1 << 17)
        for f in self.need_names("formats"):
            from ..formats import get_format
            self.need_lookup("formats", get_format, f)
        if "bf16" not in self.formats:
            raise ParameterError("parameter formats: include 'bf16', the reference every change is paired with")
        for m in self.need_names("mechanisms", empty=True):
            self.need_lookup("mechanisms", mechanism_label, m)
        press_settings(self.need_names("presses", empty=True))
        self.need_choice("protocol", PROTOCOLS)
        self.need_int("residual", 0)
        self.need_int("samples", 1)
        if not isinstance(self.model_samples, dict):
            raise ParameterError(f"parameter model_samples must be a dict {{model: samples}}, got "
                                 f"{self.model_samples!r}")
        for m, n in self.model_samples.items():
            self.need_choice("model_samples", models, value=m)
            self.need_int("model_samples", 1, value=n)
        self.need_number("halfwidth", 0, 0.49)
        self.need_int("max_samples", max([self.samples, *self.model_samples.values()]))
        self.need_int("round_size", 1)
        self.need_int("max_new_tokens", 0)
        self.need_int("text_windows", 0)
        self.need_int("text_tokens", 16)
        self.need_int("seed", 0)
        self.need_int("threads", 0)

    def samples_of(self, model: str) -> int:
        """The least samples per context `model` answers."""
        return self.model_samples.get(model, self.samples)

    def settings(self) -> list[Setting]:
        """Formats, then mechanisms and presses with K/V at the model's precision."""
        return (format_settings(self.formats, self.residual) + mechanism_settings(self.mechanisms)
                + press_settings(self.presses, residual=self.residual))


def describe(name: str, model, source: dict) -> str:
    """One line on a loaded model: class, layers (sliding ones and their window), KV heads, parameters, licence."""
    cfg = model.config
    types = list(getattr(cfg, "layer_types", None) or [])
    sliding = types.count("sliding_attention")
    layers = (f"{cfg.num_hidden_layers} layers ({sliding} sliding over {cfg.sliding_window} tokens, "
              f"{cfg.num_hidden_layers - sliding} full)" if sliding else f"{cfg.num_hidden_layers} layers (all full)")
    return (f"{name}: {type(model).__name__}, {layers}, {cfg.num_key_value_heads} KV heads of {cfg.head_dim}, "
            f"{sum(p.numel() for p in model.parameters()):,} parameters, {model.dtype}; licence "
            f"{source.get('licence', 'not recorded')}")


def plot_frontier(ax, table: list[dict], title: str, least: float | None = None):
    """Accuracy (Wilson 95% bars) against bytes held, one point per setting, labels beside the points; `least`:
    the smallest bytes share the x axis shows (panels side by side share it), default the table's."""
    import numpy as np
    colors = {"format": "#0072B2", "mechanism": "#E69F00", "press": "#009E73"}
    for r in table:
        kind = ("press" if " keep " in r["setting"] else
                "mechanism" if any(c in r["setting"] for c in ("window", "topk", "hca", "csa", "capped"))
                else "format")
        y, lo, hi = r["accuracy"], r["accuracy_low"], r["accuracy_high"]
        ax.errorbar(r["bytes_share"], y, yerr=[[y - lo], [hi - y]], fmt="o", color=colors[kind], capsize=3,
                    label=kind)
    order = sorted(table, key=lambda r: (r["bytes_share"], r["accuracy"]))
    for i, r in enumerate(order):  # labels alternate above and below, so neighbours do not overlap
        dy = 10 if i % 2 == 0 else -14
        ax.annotate(r["setting"], (r["bytes_share"], r["accuracy"]), textcoords="offset points", xytext=(4, dy),
                    fontsize=7)
    h, lab = ax.get_legend_handles_labels()
    seen = dict(zip(lab, h))
    ax.legend(seen.values(), seen.keys(), loc="lower right", fontsize=8)
    ax.set_xscale("log", base=2)
    lo = min(r["bytes_share"] for r in table) if least is None else least
    ticks = [2.0 ** k for k in range(int(np.floor(np.log2(lo))), 1)]
    ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
    ax.set_xlim(lo / 1.4, 1.4)
    ax.set_ylim(-0.05, 1.1)
    ax.set_yticks(np.linspace(0, 1, 6))
    ax.grid(alpha=0.3)
    ax.set_xlabel("bytes held / BF16's (context in the cache; log scale)")
    ax.set_ylabel("accuracy (Wilson 95%)")
    ax.set_title(title, fontsize=10)


def grid_markdown(folder) -> str:
    """The accuracy table of a notebook-10 sweep (`kvlab sweep 10`, its results.csv) as Markdown: one row per model
    and setting, bytes held over BF16's at each context, then per context the accuracy with its Wilson 95%
    interval (n: the samples answered); rows by bytes, most first, BF16 first. docs/quality.md's grids are printed
    with it (`python -m kvlab.nb.figures --grid DIR`)."""
    import json
    from pathlib import Path

    import pandas as pd

    from ..stats import wilson
    df = pd.read_csv(Path(folder) / "results.csv", keep_default_na=False, dtype=str)
    df = df[df["status"] == "ok"]
    if df.empty:
        raise ParameterError(f"{folder}: no point of the sweep finished (results.csv has no 'ok' row)")
    acc, held, n = {}, {}, {}
    for r in df.itertuples():
        acc.update(json.loads(r.accuracy))
        held.update(json.loads(r.context_bytes))
        n.update(json.loads(r.samples_answered))
    keys = [k.rsplit("|", 2) for k in acc]  # model, setting, context
    contexts = sorted({int(c) for _, _, c in keys})
    models = list(dict.fromkeys(m for m, _, _ in keys))
    name = {c: f"{c / 1024:g}K" for c in contexts}
    lines = [f"| model | setting | bytes/BF16 ({' / '.join(name.values())}) | "
             + " | ".join(f"{name[c]} acc [Wilson 95%]" for c in contexts) + " |",
             "|---|---|---|" + "---|" * len(contexts)]
    for m in models:
        settings = list(dict.fromkeys(s for mm, s, _ in keys if mm == m))

        def share(s, c=contexts[0]):
            b, bf = held.get(f"{m}|{s}|{c}"), held.get(f"{m}|bf16|{c}")
            return b / bf if b is not None and bf else float("nan")
        settings.sort(key=lambda s: (s != "bf16", -share(s), s))
        for s in settings:
            cells = []
            for c in contexts:
                a = acc.get(f"{m}|{s}|{c}")
                if a is None:
                    cells.append("-")
                    continue
                k = n[f"{m}|{c}"]
                lo, hi = wilson(round(a * k), k)
                cells.append(f"{a:.2f} [{lo:.2f}, {hi:.2f}] (n={k})")
            shares = " / ".join(f"{share(s, c):.3f}" for c in contexts)
            lines.append(f"| {m} | {s} | {shares} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
