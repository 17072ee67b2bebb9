"""Tables that compare models, formats and ways of counting (the notebooks show these)."""
from __future__ import annotations

from fractions import Fraction

from .checks import need_list, need_type
from .engines import allocate
from .errors import KvlabError
from .formats import get_format
from .layout import Layout, build_layout
from .models import catalog_names, load_model


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
        stores = ", ".join(f"{c.role} " + (f"{c.copies} x " if c.copies > 1 else "") + f"{c.entry.format_name} {c.entry.nbytes} B" + (f" /{c.ratio}" if c.ratio > 1 else "")
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
