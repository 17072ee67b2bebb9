"""Notebooks 01 and 02: tables that compare models, formats and ways of counting, and the two notebooks' parameters."""
from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction

from ..checks import need_list, need_type
from ..engines import Allocation, allocate
from ..errors import KvlabError, ParameterError
from ..formats import get_format
from ..layout import SCHEMES, Layout, build_layout
from ..models import catalog_names, load_model
from .params import NotebookParams


def _num(x: Fraction):
    return int(x) if x.denominator == 1 else float(x)


def catalog_table(formats: list[str], models: list[str] | None = None) -> list[dict]:
    """Bytes per token for each model: its own storage layout, then each format applied uniformly."""
    formats = need_list("formats", formats, "a list of format names")
    for f in formats:
        get_format(f)  # fail early on a bad name
    models = catalog_names() if models is None else need_list("models", models, "a list of model names")
    rows = []
    for name in models:
        spec = load_model(name)
        row = {"model": spec.name, "family": spec.family, "storage": _num(build_layout(spec).bytes_per_token)}
        for f in formats:
            row[f] = _num(build_layout(spec, "storage", f).bytes_per_token)
        rows.append(row)
    return rows


def countings(model: str) -> list[dict]:
    """Every way of counting one model's bytes per token: BF16, storage, vLLM exact and padded."""
    load_model(model)  # a bad model is an error, not an empty table
    rows = []
    for label, scheme, padded in (("BF16", "bf16", False), ("storage format", "storage", False),
                                  ("vLLM, unpadded", "vllm", False), ("vLLM, pages padded", "vllm", True)):
        try:
            a = allocate(model, scheme)
        except KvlabError:
            continue
        bpt = a.bytes_per_token if padded else a.layout.bytes_per_token
        if padded and not a.paged:
            continue
        rows.append({"counted as": label, "scheme": scheme, "bytes_per_token": _num(bpt)})
    return rows


def layer_summary(layout: Layout) -> list[dict]:
    """Runs of consecutive layers with the same role: mode, what they store, bytes per token."""
    need_type("layout", layout, Layout, "a kvlab.layout.Layout (build_layout(model))")
    rows: list[dict] = []
    for layer in layout.layers:
        stores = ", ".join(f"{c.role} " + (f"{c.copies} x " if c.copies > 1 else "")
                           + f"{c.entry.format_name} {c.entry.nbytes} B" + (f" /{c.ratio}" if c.ratio > 1 else "")
                           + (f" (window {c.window})" if c.window else "") for c in layer.components
                           if c.tail_of is None) or "-"
        bpt = sum((c.bytes_per_token for c in layer.components), Fraction(0))
        key = (layer.mode, stores, layer.source, bpt)
        if rows and rows[-1]["_key"] == key and rows[-1]["last"] == layer.index - 1:
            rows[-1]["last"] = layer.index
            continue
        rows.append({"_key": key, "first": layer.index, "last": layer.index, "mode": layer.mode,
                     "reads layer": layer.source, "stores": stores, "bytes_per_token": _num(bpt)})
    return [{"layers": f"{r['first']}-{r['last']}" if r["first"] != r["last"] else str(r["first"]),
             "mode": r["mode"], "reads layer": r["reads layer"], "stores": r["stores"],
             "bytes_per_token": r["bytes_per_token"]} for r in rows]


def session_table(model, lengths: list[int], scheme: str = "storage", kv_format=None) -> list[dict]:
    """Growing, bounded and total bytes of a session at several lengths."""
    a = allocate(model, scheme, kv_format)
    rows = []
    for t in need_list("lengths", lengths, "a list of token counts"):
        s = a.session(t)
        rows.append({"tokens": t, "growing_bytes": s.growing, "bounded_bytes": s.bounded, "total_bytes": s.total,
                     "total_GiB": round(s.total / 2**30, 3)})
    return rows


@dataclass
class BytesPerTokenParams(NotebookParams):
    """Notebook 01's parameters (KV bytes per token), checked on construction."""

    model: str  # catalog name or path to a config.json
    kv_format: str  # one format for every cached component ("": the layout's own formats)
    layout: str  # how it is counted: storage | vllm | bf16
    context_tokens: int  # session length for the cost at the end
    compare_formats: list  # formats for the catalog table
    k_format: str  # keys' own format, with v_format instead of kv_format ("": kv_format / the layout's own)
    v_format: str  # values' own format (an MLA latent counts as keys, its RoPE key as values)
    hybrid_models: list  # models for the hybrid table
    alloc: Allocation = field(init=False, repr=False)  # the model laid out and allocated as asked

    def __post_init__(self):
        self.need_choice("layout", SCHEMES)
        self.need_int("context_tokens")
        for f in self.need_names("compare_formats"):
            self.need_lookup("compare_formats", get_format, f)
        for name in ("kv_format", "k_format", "v_format"):
            if self.need_text(name):
                self.need_lookup(name, get_format)
        if self.kv_format and (self.k_format or self.v_format):
            raise ParameterError("parameters kv_format and k_format / v_format: give one or the other, not both")
        for m in self.need_names("hybrid_models"):
            self.need_lookup("hybrid_models", load_model, m)
        self.need_lookup("model", load_model, self.need_text("model"))
        self.alloc = self.need_lookup("model", lambda m: allocate(m, self.layout, self.kv_format or None,
                                                                  k_format=self.k_format or None,
                                                                  v_format=self.v_format or None))


@dataclass
class DeepSeek890Params(NotebookParams):
    """Notebook 02's parameters (DeepSeek V4.1-Flash's 890 bytes), checked on construction."""

    model: str  # the model derived bottom-up (catalog name or config.json path)
    baseline: str  # the previous generation it is compared with
    first_generation: str  # the "V1" of the 437x claim
    kv_format: str  # one format for every cached component ("": the published storage formats)
    context_tokens: int  # session length
    layout: Layout = field(init=False, repr=False)  # the model in its storage layout (or kv_format)

    def __post_init__(self):
        self.need_int("context_tokens")
        if self.need_text("kv_format"):
            self.need_lookup("kv_format", get_format)
        for name in ("baseline", "first_generation"):
            self.need_lookup(name, build_layout, self.need_text(name))
        self.layout = self.need_lookup("model", lambda m: build_layout(m, "storage", self.kv_format or None),
                                   self.need_text("model"))


def state_table(models: list[str], lengths: list[int], scheme: str = "storage") -> list[dict]:
    """Hybrid (attention + linear / SSM) models beside each other: bytes per token (attention KV, growing), the
    fixed-size state per session (whatever its length), and a session's bytes at each length."""
    rows = []
    for name in need_list("models", models, "a list of model names"):
        L = build_layout(name, scheme)
        kinds = L.model.layer_kinds
        row = {"model": L.model.name, "family": L.model.family,
               "attention layers": sum(k in ("attention", "hybrid") for k in kinds) if kinds else len(L.layers),
               "state layers": sum(k in ("linear", "hybrid") for k in kinds),
               "bytes_per_token": _num(L.bytes_per_token), "state_bytes": L.state_bytes}
        for t in need_list("lengths", lengths, "a list of token counts"):
            s = L.session(t)
            row[f"session_{t}"] = s.total
            row[f"state_share_{t}"] = round(L.state_bytes / s.total, 4) if s.total else None
        rows.append(row)
    return rows
