"""The README's figures stay readable (issue 33 item 7): checked on the matplotlib objects kvlab.nb.plots returns.

The frontier's points are shaped like notebook 08's default run (many settings within a few per cent of one another's
bytes at 1,024 tokens, two at 2,048), the crowding that made its labels overlap.
"""
from __future__ import annotations

import itertools

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from matplotlib.text import Text  # noqa: E402

from kvlab.nb import plots  # noqa: E402
from kvlab.nb.plots import FrontierPoint  # noqa: E402

# (model, context, setting, bytes held, accuracy, perplexity change): the crowded layout of notebook 08's figure
CROWD = [
    ("qwen3-tiny", 1024, "keydiff keep 1/2 int4", 192_416, 0.99, 0.021),
    ("qwen3-tiny", 1024, "hca=8,window=1/16", 195_000, 0.05, 0.107),
    ("qwen3-tiny", 1024, "window=1/4", 262_144, 0.21, 0.025),
    ("qwen3-tiny", 1024, "streaming_llm keep 1/4", 276_000, 0.22, 0.010),
    ("qwen3-tiny", 1024, "snapkv keep 1/4", 276_000, 0.18, 0.012),
    ("qwen3-tiny", 1024, "nvfp4", 297_000, 0.89, 0.060),
    ("qwen3-tiny", 1024, "int4", 350_000, 0.96, 0.014),
    ("qwen3-tiny", 1024, "fp8_e4m3", 524_288, 0.99, 0.005),
    ("qwen3-tiny", 1024, "keydiff keep 1/2", 534_000, 1.00, 0.007),
    ("qwen3-tiny", 1024, "bf16", 1_048_576, 0.99, 0.0),
    ("deepseek-v3-tiny", 1024, "bf16", 520_000, 1.00, 0.0),
    ("kvlab-v41-tiny", 1024, "bf16", 340_000, 0.99, 0.0),
    ("qwen3-tiny", 2048, "window=1/4", 330_000, 0.26, -0.052),
    ("qwen3-tiny", 2048, "bf16", 2_097_152, 0.44, 0.0),
]


def crowd() -> list[FrontierPoint]:
    return [FrontierPoint(m, T, s, b, a, (max(0.0, a - 0.04), min(1.0, a + 0.03)), p, (p - 0.005, p + 0.006))
            for m, T, s, b, a, p in CROWD]


def _texts_overlap(texts, renderer) -> list[tuple[str, str]]:
    boxes = [(t.get_text(), Text.get_window_extent(t, renderer)) for t in texts]
    return [(a, b) for (a, ba), (b, bb) in itertools.combinations(boxes, 2) if ba.overlaps(bb)]


def _point_labels(ax) -> list[Text]:
    return [t for t in ax.texts if t.get_text()]


def test_frontier_labels_do_not_overlap_and_axes_have_ticks():
    fig = plots.frontier(crowd(), "niah")
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    axes = fig.axes
    assert len(axes) == 2  # one panel per metric, every context in it: no near-empty panel
    for ax in axes:
        labels = _point_labels(ax)
        assert len(labels) == len(CROWD)
        assert _texts_overlap(labels, renderer) == []
        lo, hi = ax.get_xlim()
        ticks = [v for v in ax.xaxis.get_majorticklocs() if lo <= v <= hi]
        shown = [t.get_text() for t in ax.get_xticklabels() if t.get_text()]
        assert len(ticks) >= 4 and len(shown) >= 4, (ticks, shown)  # the old figure showed one (10^6)
        assert all(("B" in s) for s in shown)  # bytes with their unit
        ylo, yhi = ax.get_ylim()
        assert len([v for v in ax.get_yticks() if ylo <= v <= yhi]) >= 4
    plt.close(fig)


def test_frontier_panels_are_not_near_empty():
    fig = plots.frontier(crowd(), "niah")
    for ax in fig.axes:
        drawn = sum(len(line.get_xdata()) for line in ax.lines if line.get_marker() not in (None, "None", ""))
        assert drawn >= len(CROWD)
    plt.close(fig)


def test_place_labels_separates_labels_at_one_point():
    fig, ax = plt.subplots()
    ax.set_xlim(0, 10)
    ax.set_ylim(0, 10)
    fig.canvas.draw()
    texts = plots.place_labels(ax, [(5, 5)] * 6, [f"setting {i}" for i in range(6)])
    assert _texts_overlap(texts, fig.canvas.get_renderer()) == []
    plt.close(fig)


def heat():
    rng = np.random.default_rng(0)
    depths = [round(0.05 + 0.1 * i, 2) for i in range(10)]
    grids = {("qwen3-tiny", s): rng.choice([0, 0.25, 0.5, 0.75, 1.0], size=(len(depths), 3))
             for s in ("bf16", "window=1/4", "snapkv keep 1/4", "keydiff keep 1/2")}
    grids["qwen3-tiny", "bf16"][0, 0] = 0.0
    grids["qwen3-tiny", "bf16"][0, 1] = 1.0
    return grids, [512, 1024, 2048], depths


def test_heatmap_is_colour_blind_safe_and_every_digit_reads():
    grids, contexts, depths = heat()
    fig = plots.needle_heatmap(grids, contexts, depths)
    fig.canvas.draw()
    panels = [ax for ax in fig.axes if ax.images]
    assert len(panels) == len(grids)
    for ax in panels:
        im = ax.images[0]
        assert im.get_cmap().name in {"cividis", "viridis"}  # not red/green (RdYlGn)
        grid = np.asarray(im.get_array())
        texts = _point_labels(ax)
        assert len(texts) == grid.size
        for t in texts:
            k, i = (int(round(v)) for v in t.get_position())
            background = im.get_cmap()(im.norm(grid[i, k]))
            assert float(t.get_text()) == pytest.approx(grid[i, k], abs=0.005)
            assert plots.contrast(t.get_color(), background) >= 4.5, (t.get_text(), t.get_color())  # WCAG AA
            assert t.get_fontsize() >= 7
    plt.close(fig)


def test_sessions_bars_put_no_zero_on_the_log_axis():
    models, gpus, contexts = ["a", "b"], ["H100", "H200"], [131_072, 1_000_000]
    values = {("a", "H100", 131_072): 2, ("a", "H200", 131_072): 5, ("a", "H100", 1_000_000): 0,
              ("a", "H200", 1_000_000): 0, ("b", "H100", 131_072): 70, ("b", "H200", 131_072): 206,
              ("b", "H100", 1_000_000): 9, ("b", "H200", 1_000_000): 27}
    marks = {k: (3.0 if k == ("a", "H100", 131_072) else None) for k in values}
    fig = plots.sessions_bars(values, models, gpus, contexts, marks, "vLLM: reserved at admission")
    heights = []
    for ax in fig.axes:
        assert ax.get_yscale() == "log"
        bars = [p.get_height() for c in ax.containers for p in c]
        heights += bars
        assert all(h >= 1 for h in bars)  # no 0 (nor a stand-in 0.5) drawn as a bar
        for line in ax.lines:
            assert all(np.asarray(line.get_ydata(), float) > 0)
        assert ax.get_ylim()[0] > 0
    assert sorted(heights) == sorted(v for v in values.values() if v)  # each count drawn as itself
    zeros = [t for ax in fig.axes for t in ax.texts if t.get_text() == "0"]
    assert len(zeros) == sum(v == 0 for v in values.values())  # ... and each 0 written
    for t in zeros:  # ... inside its panel, where a reader sees it
        lo, hi = t.axes.get_xlim()
        assert lo < t.xy[0] < hi
    plt.close(fig)


def test_slo_line_is_labelled():
    fig, ax = plt.subplots()
    ax.set_xscale("log")
    line = plots.slo_line(ax, 2.0, "ttft_p99")
    assert line.get_label() == "SLO ttft_p99 = 2 s"
    assert any(t.get_text() == line.get_label() for t in ax.texts)
    assert plots.slo_line(ax, float("nan"), "tpot_p99") is None
    assert plots.slo_line(ax, None, "tpot_p99") is None
    plt.close(fig)


def test_record_brief_prints_no_raw_dict(capsys):
    from kvlab.nb.record import record

    v = record("sessions_per_gpu_test", {"qwen3-8b|H100|131072": 2, "qwen3-8b|H200|131072": 5}, brief=True)
    assert v == {"qwen3-8b|H100|131072": 2, "qwen3-8b|H200|131072": 5}  # the stored value is whole
    out = capsys.readouterr().out
    assert out.strip() == "sessions_per_gpu_test: 2 values recorded" and "{" not in out
    record("one_count_test", 214, brief=True)
    assert capsys.readouterr().out.strip() == "one_count_test = 214"  # a scalar reads as itself
