"""The notebooks' figures that a reader of the README sees, drawn so that they stay readable whatever the data.

Each function takes plain numbers (no notebook state), draws one figure and returns it, so tests can check the
matplotlib objects: labels that do not overlap, log axes that never receive a zero, a colour-blind-safe colour
scale with readable digits, and a label on every SLO line.
- `frontier`: memory against quality, one panel per metric, every context in it (no near-empty panel).
- `needle_heatmap`: accuracy by context and needle depth, per setting.
- `sessions_bars`: sessions per GPU on a log axis; a count of 0 is written, not drawn.
- `slo_line`: a target drawn as a labelled line.
"""
from __future__ import annotations

from dataclasses import dataclass

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.colors import to_rgb
from matplotlib.text import Text
from matplotlib.transforms import Bbox
from matplotlib.ticker import FuncFormatter, LogLocator

from ..explain import fmt_size

FOOT = 0.5  # the foot of a sessions axis: a bar of 1 stands out from it, a 0 is written on it
HEATMAP_CMAP = "cividis"  # colour-blind-safe and perceptually uniform (Nunez et al. 2018, PLOS ONE 13(7): e0199239)
COLOURS = ["tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown"]
MARKERS = ["o", "^", "s", "D"]  # one per context in the frontier


@dataclass(frozen=True)
class FrontierPoint:
    """One setting measured on one model at one context."""

    model: str  # model name (its colour)
    context: int  # tokens (its marker)
    label: str  # the setting, written beside the point
    held_bytes: float  # bytes the cache held per sequence (x, log)
    accuracy: float  # task accuracy
    accuracy_ci: tuple[float, float]  # its interval (low, high)
    ppl_change: float  # perplexity change against BF16, as a fraction (0.02 = +2%)
    ppl_ci: tuple[float, float]  # its interval (low, high), fractions


def _luminance(rgb) -> float:
    """Relative luminance (WCAG 2.1) of an RGB colour in [0, 1]."""
    c = [v / 12.92 if v <= 0.04045 else ((v + 0.055) / 1.055) ** 2.4 for v in rgb[:3]]
    return 0.2126 * c[0] + 0.7152 * c[1] + 0.0722 * c[2]


def contrast(a, b) -> float:
    """WCAG 2.1 contrast ratio of two colours (1 to 21; 4.5 is its minimum for normal text)."""
    la, lb = sorted((_luminance(to_rgb(a)), _luminance(to_rgb(b))), reverse=True)
    return (la + 0.05) / (lb + 0.05)


def text_colour(background) -> str:
    """Black or white, whichever contrasts more with `background`."""
    return "black" if contrast("black", background) >= contrast("white", background) else "white"


def bytes_axis(axis) -> None:
    """A log axis of byte counts with labelled ticks at 1, 2, 3 and 5 of every decade."""
    axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 3.0, 5.0)))
    axis.set_major_formatter(FuncFormatter(lambda v, _: fmt_size(v)))
    axis.set_minor_locator(LogLocator(base=10, subs=(4.0, 6.0, 7.0, 8.0, 9.0)))
    axis.set_minor_formatter(FuncFormatter(lambda v, _: ""))


def _text_box(t, renderer):
    """The window extent of an annotation's text alone (no leader line), at its current offset."""
    t.update_positions(renderer)
    return Text.get_window_extent(t, renderer)


def place_labels(ax, points, labels, fontsize: float = 7, step: float = 1.1, tries: int = 12) -> list:
    """Write each label beside its point (x, y in data coordinates): right of it, else left of it, moved up or down
    in steps of a text height until it overlaps no label already placed and stays inside the axes; a moved label
    gets a thin leader line to its point. Returns the texts."""
    fig = ax.figure
    renderer = fig.canvas.get_renderer()
    frame = ax.get_window_extent(renderer)
    marks = ax.transData.transform(np.asarray(points, float).reshape(-1, 2))  # the points themselves: not covered
    placed, texts = [Bbox.from_extents(px - 3, py - 3, px + 3, py + 3) for px, py in marks], []
    order = sorted(range(len(points)), key=lambda i: (points[i][0], points[i][1]))
    for i in order:
        (x, y), label = points[i], labels[i]
        t = ax.annotate(label, (x, y), xytext=(4, 0), textcoords="offset points", fontsize=fontsize,
                        va="center", ha="left", annotation_clip=False)
        h = _text_box(t, renderer).height * step * 72 / fig.dpi  # points
        best = None
        for k in range(2 * tries + 1):
            dy = (k + 1) // 2 * (1 if k % 2 else -1) * h  # 0, +h, -h, +2h, -2h, ...
            for dx, ha in ((4, "left"), (-4, "right")):
                t.set_ha(ha)
                t.xyann = (dx, dy)
                box = _text_box(t, renderer)
                inside = frame.x0 <= box.x0 and box.x1 <= frame.x1 and frame.y0 <= box.y0 and box.y1 <= frame.y1
                if inside and not any(box.overlaps(b) for b in placed):
                    best = (dx, dy, ha)
                    break
            if best:
                break
        dx, dy, ha = best or (4, 0, "left")
        t.remove()
        arrow = dict(arrowstyle="-", lw=0.4, color="0.5", shrinkA=0, shrinkB=3) if dy else None
        t = ax.annotate(label, (x, y), xytext=(dx, dy), textcoords="offset points", fontsize=fontsize,
                        va="center", ha=ha, arrowprops=arrow, annotation_clip=False)
        placed.append(_text_box(t, renderer))
        texts.append(t)
    return texts


def frontier(points: list[FrontierPoint], task: str, figsize=(13, 9)):
    """Accuracy (top) and perplexity change (bottom) against bytes held: colour per model, marker per context."""
    if not points:
        raise ValueError("frontier: no points to draw")
    models = list(dict.fromkeys(p.model for p in points))
    contexts = sorted({p.context for p in points})
    fig, (top, bottom) = plt.subplots(2, 1, figsize=figsize, sharex=True)
    for n_m, m in enumerate(models):
        for n_c, T in enumerate(contexts):
            pts = sorted((p for p in points if p.model == m and p.context == T), key=lambda p: p.held_bytes)
            if not pts:
                continue
            x = np.array([p.held_bytes for p in pts], float)
            style = dict(fmt=MARKERS[n_c % len(MARKERS)], ms=5, capsize=2, color=COLOURS[n_m % len(COLOURS)],
                         mfc="white" if n_c else None, label=f"{m}, {T:,} tokens")
            acc = np.array([p.accuracy for p in pts])
            top.errorbar(x, acc, yerr=[acc - [p.accuracy_ci[0] for p in pts], [p.accuracy_ci[1] for p in pts] - acc],
                         **style)
            ppl = 100 * np.array([p.ppl_change for p in pts])
            bottom.errorbar(x, ppl, yerr=[ppl - 100 * np.array([p.ppl_ci[0] for p in pts]),
                                          100 * np.array([p.ppl_ci[1] for p in pts]) - ppl], **style)
    for ax in (top, bottom):
        ax.set_xscale("log")
        bytes_axis(ax.xaxis)
        ax.grid(alpha=0.3)
        ax.grid(alpha=0.12, which="minor")
    xs = np.array([p.held_bytes for p in points], float)
    if len(xs):
        top.set_xlim(xs.min() / 1.3, xs.max() * 2.2)  # room for the labels on the right
    bottom.tick_params(axis="x", labelbottom=True)
    top.tick_params(axis="x", labelbottom=True)
    top.set_ylim(-0.05, 1.08)
    top.set_ylabel(f"{task} accuracy (Wilson 95%)")
    bottom.set_ylabel("perplexity change vs BF16, % (paired bootstrap 95%)")
    bottom.set_xlabel("bytes held per sequence (measured)")
    top.set_title(f"{task} accuracy and perplexity against the bytes held, at "
                  + ", ".join(f"{T:,}" for T in contexts)
                  + " tokens" + (f" (filled: {contexts[0]:,}; '@' names another)" if len(contexts) > 1 else ""),
                  fontsize=10)
    top.legend(fontsize=7, loc="lower right", ncol=max(1, len(contexts)))
    bottom.axhline(0, color="k", lw=0.8)
    fig.tight_layout()
    fig.canvas.draw()  # the final layout, limits and text sizes the labels are placed with
    lab = lambda p: p.label if p.context == contexts[0] else f"{p.label} @{p.context:,}"
    place_labels(top, [(p.held_bytes, p.accuracy) for p in points], [lab(p) for p in points])
    place_labels(bottom, [(p.held_bytes, 100 * p.ppl_change) for p in points], [lab(p) for p in points])
    return fig


def needle_heatmap(grids: dict[tuple[str, str], np.ndarray], contexts: list[int], depths: list[float]):
    """One panel per (model, setting): accuracy in [0, 1] as a [depth, context] grid, the value written in each
    cell in black or white, whichever reads better on that cell's colour."""
    panels = list(grids)
    fig, axes = plt.subplots(1, len(panels), figsize=(1.2 + len(panels) * (0.75 * len(contexts) + 0.8),
                                                     0.4 * len(depths) + 1.3), squeeze=False, layout="constrained")
    cmap = plt.get_cmap(HEATMAP_CMAP)
    im = None
    for ax, key in zip(axes[0], panels):
        grid = np.asarray(grids[key], float)  # [depth, context]
        im = ax.imshow(grid, vmin=0, vmax=1, cmap=cmap, aspect="auto", origin="upper")
        ax.set_xticks(range(len(contexts)), [f"{t:,}" for t in contexts], fontsize=8)
        ax.set_yticks(range(len(depths)), [f"{d:.2f}" for d in depths], fontsize=8)
        ax.set_xlabel("context (tokens)", fontsize=8)
        ax.set_title(f"{key[0]}: {key[1]}", fontsize=9)
        for i in range(grid.shape[0]):
            for k in range(grid.shape[1]):
                ax.text(k, i, f"{grid[i, k]:.2f}", ha="center", va="center", fontsize=8,
                        color=text_colour(cmap(grid[i, k])))
    axes[0][0].set_ylabel("needle depth", fontsize=8)
    fig.colorbar(im, ax=axes[0].tolist(), shrink=0.8, label="accuracy")
    return fig


def sessions_bars(values: dict[tuple[str, str, int], int], models: list[str], gpus: list[str], contexts: list[int],
                  marks: dict[tuple[str, str, int], float | None] | None = None, mark_label: str = ""):
    """Sessions per GPU as bars on a log axis, one panel per context: values[(model, gpu, context)]. A count of 0
    (not even one session fits) has no bar: a log axis has no zero, so it is written '0' at the axis' foot.
    `marks` (optional, same keys): a second count drawn as a black tick on the bar (None: none)."""
    fig, axes = plt.subplots(1, len(contexts), figsize=(12, 4), sharey=True, squeeze=False)
    axes = axes[0]
    w = 0.8 / len(models)
    top = max([1] + [v for v in values.values() if v] + [v for v in (marks or {}).values() if v])
    for ax, T in zip(axes, contexts):
        for i, m in enumerate(models):
            xs = np.arange(len(gpus)) + i * w
            vals = [values[m, g, T] for g in gpus]
            shown = [(x, v) for x, v in zip(xs, vals) if v > 0]
            ax.bar([x for x, _ in shown], [v for _, v in shown], w, color=COLOURS[i % len(COLOURS)], label=m)
            for x, v in zip(xs, vals):
                ax.annotate(str(v), (x, v if v > 0 else FOOT), xytext=(0, 1), textcoords="offset points",
                            ha="center", va="bottom", fontsize=8, color="black" if v > 0 else "0.35")
            got = [(x, (marks or {}).get((m, g, T))) for x, g in zip(xs, gpus)]
            got = [(x, v) for x, v in got if v is not None and v == v and v > 0]
            ax.plot([x for x, _ in got], [v for _, v in got], "k_", markersize=14, markeredgewidth=2,
                    label=mark_label if i == 0 and ax is axes[0] and mark_label else None)
        ax.set_xticks(np.arange(len(gpus)) + w * (len(models) - 1) / 2, gpus)
        ax.set_xlim(-w, len(gpus) - 1 + w * len(models))  # every slot, with or without a bar
        ax.set_yscale("log")
        ax.set_ylim(FOOT, top * 2)
        ax.set_title(f"{T:,}-token sessions")
        if any(values[m, g, T] == 0 for m in models for g in gpus):
            ax.set_xlabel("0: not one session fits (no bar: a log axis has no zero)", fontsize=8, color="0.35")
    axes[0].set_ylabel("sessions per GPU (log): held while decoding")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(models) + 1, fontsize=8)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    return fig


def slo_line(ax, value: float | None, name: str, unit: str = "s", vertical: bool = True):
    """Draw an SLO target as a dashed line labelled with its name and value (in the legend and beside the line).
    None or NaN (no such target): nothing is drawn and None is returned."""
    if value is None or value != value:
        return None
    label = f"SLO {name} = {value:g} {unit}"
    if vertical:
        line = ax.axvline(value, color="k", lw=0.8, ls="--", label=label)
        ax.annotate(label, (value, 1), xycoords=("data", "axes fraction"), xytext=(3, -3),
                    textcoords="offset points", ha="left", va="top", fontsize=7, rotation=90)
    else:
        line = ax.axhline(value, color="k", lw=0.8, ls="--", label=label)
        ax.annotate(label, (0, value), xycoords=("axes fraction", "data"), xytext=(3, 3),
                    textcoords="offset points", ha="left", va="bottom", fontsize=7)
    return line
