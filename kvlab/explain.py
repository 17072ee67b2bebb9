"""Step-by-step derivations of bytes per token, with every number shown.

`explain_layout` is the generic derivation (entries, then each run of layers); a family adds its own
shortcut through `Family.explain` (dense K/V's one line, DeepSeek V4.1's entries-per-token factorisation),
built from the helpers here.
"""
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


def fmt_size(x) -> str:
    """A byte count in decimal units for a reader: 512 B, 113.9 kB, 448.1 MB, 87.89 GB (4 significant digits;
    exact integers belong in --json)."""
    x = float(x)
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:,.4g} {unit}"
    return f"{x:,.4g} B"


def layer_list(ids: list[int]) -> str:
    if len(ids) > 6:
        runs = ids == list(range(ids[0], ids[-1] + 1))
        return f"layers {ids[0]}-{ids[-1]}" if runs else f"layers {', '.join(map(str, ids[:3]))}, ..., {ids[-1]}"
    return ("layer " if len(ids) == 1 else "layers ") + ", ".join(map(str, ids))


def heading(layout) -> str:
    spec = layout.model
    scheme = layout.kv_format or layout.scheme
    where = "" if layout.shard.whole else f", one GPU of {layout.shard.label()}"
    return f"{spec.name} ({spec.description}), counted as {scheme}{where}:"


def groups(layout):
    """Growing components grouped by (role, entry bytes, format, copies, ratio, interleave) -> layer ids, and the
    entries by (role, bytes, format)."""
    out: dict[tuple, list[int]] = defaultdict(list)
    entries = {}
    for layer, c in layout.components(True):
        key = (c.role, c.entry.nbytes, c.entry.format_name, c.copies, c.tokens_per_entry, c.interleave)
        out[key].append(layer.index)
        entries[(c.role, c.entry.nbytes, c.entry.format_name)] = c.entry
    return out, entries


def kv_one_liner(layout) -> list[str] | None:
    """'2 (K,V) x 36 layers x 8 KV heads x 128 dims x 2 B = 147,456 B per token' when every growing component is
    a K or V head of one shape in every attention layer; None otherwise."""
    g, entries = groups(layout)
    kv = {k: v for k, v in g.items() if k[0] in ("k", "v")}
    if len(kv) != 2 or len(g) != 2 or len({k[1:] for k in kv}) != 1:
        return None
    (k1, ids), = [(k, v) for k, v in kv.items() if k[0] == "k"]
    part = entries[(k1[0], k1[1], k1[2])].parts[0]
    per_el = Fraction(part.fmt.entry_bytes(part.elements), part.elements)
    unit = f"{fmt_bytes(per_el)} B" if part.fmt.scope in ("none", "tensor") else \
        f"{fmt_bytes(per_el)} B ({part.fmt.name} with scales: {part.fmt.describe(part.elements)} per head)"
    dcp = f" / {k1[5]} DCP ranks" if k1[5] > 1 else ""
    lines = [heading(layout),
             f"2 (K,V) x {len(ids)} layers x {k1[3]} KV heads x {part.elements} dims x {unit}{dcp} "
             f"= {fmt_bytes(layout.bytes_per_token)} B per token"]
    bounded_line(layout, lines)
    return lines


def explain_layout(layout, summary=None) -> list[str]:
    """Lines of arithmetic that add up to `layout.bytes_per_token`; `summary(layout)` may add lines (a
    factorisation) before the total."""
    lines = [heading(layout)]
    g, entries = groups(layout)
    for (role, nbytes, fname), e in entries.items():
        lines.append(f"{role} entry ({fname}): {e.describe()}")
    for (role, nbytes, fname, copies, ratio, inter), ids in g.items():
        n = len(ids)
        cp = f" x {copies} heads" if copies > 1 else ""
        per = Fraction(n * copies * nbytes, ratio * inter)
        rt = f" / {ratio} tokens per entry" if ratio > 1 else ""
        dcp = f" / {inter} DCP ranks" if inter > 1 else ""
        lines.append(f"{role}: {layer_list(ids)} ({n}){cp} x {nbytes:,} B{rt}{dcp} = {fmt_bytes(per)} B per token")
    if summary is not None:
        lines += summary(layout)
    lines.append(f"total: {fmt_bytes(layout.bytes_per_token)} B per token")
    bounded_line(layout, lines)
    return lines


def bounded_line(layout, lines: list[str]) -> None:
    states = [(l, c) for l, c in layout.components(False) if c.state]
    if states:
        c = states[0][1]
        lines.append(f"fixed-size state of {len(states)} linear-attention / SSM layers: {c.entry.describe()} per "
                     f"layer{'' if c.copies == 1 else f' x {c.copies}'}; {layout.state_bytes:,} B per session, "
                     f"whatever its length")
    windows: dict[int, list] = {}
    for l, c in layout.components(False):
        if c.window is not None and not c.pending:
            windows.setdefault(c.window, []).append((l.index, c.entry_bytes))
    for held, items in windows.items():
        ids = sorted(dict.fromkeys(i for i, _ in items))
        per = sum(b for _, b in items)
        lines.append(f"sliding windows: {layer_list(ids)} ({len(ids)}) keep {held:,} tokens between steps x "
                     f"{per // len(ids):,} B per token per layer = {held * per:,} B at most")
    if layout.bounded_bytes:
        what = "windows, compressor tails, fixed-size states, per-tensor scales" if states else \
            "windows, compressor tails, per-tensor scales"
        lines.append(f"bounded state ({what}), apart from the above: {layout.bounded_bytes:,} B per session at most")
