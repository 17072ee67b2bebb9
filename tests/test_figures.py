"""`make figures`: the README's pictures come from a run's executed notebooks, captions from its recorded results."""
import base64
import json

import nbformat
import pandas as pd
import pytest

from kvlab.nb import figures
from kvlab.nb.runner import list_notebooks

PNG = base64.b64decode("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9aw"
                       "AAAABJRU5ErkJggg==")  # a 1 x 1 PNG


def _executed(path, markers, png=PNG):
    """An executed notebook with one plotting cell per marker (a notebook may draw several README figures)."""
    nb = nbformat.v4.new_notebook()
    other = nbformat.v4.new_code_cell("# another figure")
    other.outputs = [nbformat.v4.new_output("display_data", data={"image/png": base64.b64encode(b"x").decode()})]
    nb.cells = [other]
    for marker in markers:
        plot = nbformat.v4.new_code_cell(f"# {marker}\nplt.show()")
        plot.outputs = [nbformat.v4.new_output("display_data", data={"image/png": base64.b64encode(png).decode()})]
        nb.cells.append(plot)
    nbformat.write(nb, str(path))


@pytest.fixture
def run(tmp_path):
    """A fake finished run holding every figure notebook that exists, with the results the captions read."""
    stems = {p.stem[:2]: p.stem for p in list_notebooks()}
    d = tmp_path / "runs" / "20260101-000000"
    d.mkdir(parents=True)
    results = {"01": {"bytes_per_token": 147456, "catalog_bytes_per_token": {"deepseek-v4.1-flash": 890}}}
    summary = {"notebooks": {}}
    markers = {}
    for f in figures.FIGURES:
        markers.setdefault(f.notebook, []).append(f.marker)
    for nb, ms in markers.items():
        if nb in stems:
            _executed(d / f"{stems[nb]}.ipynb", ms)
            summary["notebooks"][stems[nb]] = {"status": "ok", "results": results.get(nb, {})}
    (d / "results.json").write_text(json.dumps(summary))
    return d


def test_figures_and_readme_block(run, tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(f"# top\n{figures.FIGURES_START}\nold\n{figures.FIGURES_END}\nrest\n")
    written = figures.write(run, tmp_path / "docs" / "figures", readme, run.parent, log=lambda m: None)
    assert written and all(p.read_bytes() == PNG for p in written)  # the marked cell's figure, byte for byte
    text = readme.read_text()
    assert text.startswith("# top\n") and text.endswith(f"{figures.FIGURES_END}\nrest\n") and "\nold\n" not in text
    assert "![catalog](docs/figures/catalog.png)" in text
    assert "Qwen3-8B stores 147,456 B per token, DeepSeek V4.1-Flash 890 (notebook 01)." in text
    assert "(notebook 02)." in text  # no recorded numbers: the line alone
    have_08 = any(p.stem.startswith("08") for p in list_notebooks())
    assert ("frontier.png" in text) == have_08 and ("needle-heatmap.png" in text) == have_08


def test_sweep_table(tmp_path):
    pd.DataFrame([{"model": "qwen3-8b", "kv_format": "", "status": "ok", "error": "", "bytes_per_token": 147456,
                   "catalog": json.dumps({"a": 1, "b": 2, "c": 3, "d": 4, "e": 5, "f": 6}), "folder": "x"}]
                 ).to_csv(tmp_path / "results.csv", index=False)
    assert figures.sweep_table(tmp_path).splitlines() == [
        "| model | kv_format | status | bytes_per_token |", "| --- | --- | --- | --- |",
        '| qwen3-8b | "" | ok | 147,456 |']


def test_frontier_caption_names_the_fewest_bytes():
    """The frontier's line gives the methods reaching the target on the model measured with every setting, fewest
    bytes first, as shares of its BF16 bytes; methods that never reach it are left out."""
    frontier = next(f for f in figures.FIGURES if f.file == "frontier")
    r = {"accuracy": {"m|bf16|1024": 0.99}, "costs_nothing_measurable": [], "held_equals_predicted": True,
         "held_bytes": {"m|bf16|1024": 1000, "m|keydiff keep 1/2|1024": 500, "m|keydiff keep 1/2 int4|1024": 180},
         "fewest_bytes_for_target": {"a|bf16": 10, "m|bf16": 1000, "m|keydiff": 180, "m|window": None}}
    cap = frontier.caption(r)
    assert ("fewest bytes reaching accuracy 0.9 at the first context on m: keydiff keep 1/2 int4 0.18 of BF16, bf16 "
            "1.00 of BF16;") in cap and "window" not in cap.split("fewest")[1]
    assert "fewest" not in frontier.caption({**r, "fewest_bytes_for_target": {}})
