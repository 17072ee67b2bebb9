"""Step-by-step derivations of bytes per token, with every number shown."""
from __future__ import annotations

from collections import defaultdict
from fractions import Fraction


def fmt_bytes(x) -> str:
    """147,456 / 3,514.25 / 2.5: exact numbers with thousands separators, no float noise."""
    x = Fraction(x)
    if x.denominator == 1:
        return f"{x.numerator:,}"
    f = float(x)
    s = f"{f:,.6f}".rstrip("0").rstrip(".")
    return s


def _layers(ids: list[int]) -> str:
    if len(ids) > 6:
        runs = ids == list(range(ids[0], ids[-1] + 1))
        return f"layers {ids[0]}-{ids[-1]}" if runs else f"layers {', '.join(map(str, ids[:3]))}, ..., {ids[-1]}"
    return ("layer " if len(ids) == 1 else "layers ") + ", ".join(map(str, ids))


def explain_layout(layout) -> list[str]:
    """Lines of arithmetic that add up to `layout.bytes_per_token`."""
    spec = layout.model
    scheme = layout.kv_format or layout.scheme
    lines = [f"{spec.name} ({spec.description}), counted as {scheme}:"]
    groups: dict[tuple, list[int]] = defaultdict(list)
    entries = {}
    for layer, c in layout.components(True):
        key = (c.role, c.entry.nbytes, c.entry.format_name, c.copies, c.ratio)
        groups[key].append(layer.index)
        entries[(c.role, c.entry.nbytes, c.entry.format_name)] = c.entry
    total = layout.bytes_per_token
    # Dense K and V with identical groups: the classic one-liner.
    kv = {k: v for k, v in groups.items() if k[0] in ("k", "v")}
    if spec.family == "dense" and len(kv) == 2 and len(groups) == 2:
        (k1, ids), = [(k, v) for k, v in kv.items() if k[0] == "k"]
        e = entries[(k1[0], k1[1], k1[2])]
        part = e.parts[0]
        per_el = Fraction(part.fmt.entry_bytes(part.elements), part.elements)
        unit = f"{fmt_bytes(per_el)} B" if part.fmt.scope in ("none", "tensor") else \
            f"{fmt_bytes(per_el)} B ({part.fmt.name} with scales: {part.fmt.describe(part.elements)} per head)"
        lines.append(f"2 (K,V) x {len(ids)} layers x {k1[3]} KV heads x {part.elements} dims x {unit} "
                     f"= {fmt_bytes(total)} B per token")
        _bounded(layout, lines)
        return lines
    for (role, nbytes, fname), e in entries.items():
        lines.append(f"{role} entry ({fname}): {e.describe()}")
    for (role, nbytes, fname, copies, ratio), ids in groups.items():
        n = len(ids)
        cp = f" x {copies} heads" if copies > 1 else ""
        per = Fraction(n * copies * nbytes, ratio)
        rt = f" / {ratio} tokens per entry" if ratio > 1 else ""
        lines.append(f"{role}: {_layers(ids)} ({n}){cp} x {nbytes:,} B{rt} = {fmt_bytes(per)} B per token")
    # DeepSeek-style factorisation: (entries per token) x (bytes per position), when every storing layer
    # holds the same set of entries.
    per_layer = defaultdict(list)
    for layer, c in layout.components(True):
        per_layer[layer.index].append((c.role, c.entry_bytes, c.ratio))
    sets = {tuple(sorted((r, b) for r, b, _ in v)) for v in per_layer.values()}
    if spec.family in ("dsv41",) and len(sets) == 1:
        ept = sum((Fraction(1, v[0][2]) for v in per_layer.values()), Fraction(0))
        first = per_layer[min(per_layer)]
        pos = sum(b for _, b, _ in first)
        terms = " + ".join(f"{len([i for i, v in per_layer.items() if v[0][2] == r])} x 1/{r}"
                           for r in sorted({v[0][2] for v in per_layer.values()}, reverse=True))
        lines.append(f"entries per token: {terms} = {fmt_bytes(ept)}")
        lines.append(f"{fmt_bytes(ept)} x ({' + '.join(f'{b:,}' for _, b, _ in first)}) = "
                     f"{fmt_bytes(ept * pos)} B per token")
    lines.append(f"total: {fmt_bytes(total)} B per token")
    _bounded(layout, lines)
    return lines


def _bounded(layout, lines):
    if layout.bounded_bytes:
        lines.append(f"bounded state (windows, compressor tails, per-tensor scales), apart from the above: "
                     f"{layout.bounded_bytes:,} B per session at most")
