"""The accuracy grid of a notebook-10 sweep (kvlab.nb.real_quality.grid_markdown) and the committed Gemma-3-270M grid
(data/sweeps/gemma-3-270m-grid: `kvlab sweep 10 --grid examples/sweep-10-gemma.yaml`), which docs/quality.md prints."""
import json
from pathlib import Path

import pytest

from kvlab.errors import ParameterError
from kvlab.nb.real_quality import grid_markdown
from kvlab.stats import wilson

ROOT = Path(__file__).resolve().parents[1]
GEMMA = ROOT / "data" / "sweeps" / "gemma-3-270m-grid"


def write(folder, points):
    """A results.csv as `kvlab sweep` writes it: one row per point, the notebook's records as JSON cells."""
    import pandas as pd
    rows = [dict(status=status, accuracy=json.dumps(acc), context_bytes=json.dumps(held),
                 samples_answered=json.dumps(n)) for status, acc, held, n in points]
    pd.DataFrame(rows).to_csv(folder / "results.csv", index=False)


def test_grid_rows_intervals_and_byte_shares(tmp_path):
    write(tmp_path, [
        ("ok", {"m|bf16|1024": 1.0, "m|int4|1024": 0.5, "m|snapkv keep 1/4|1024": 0.25},
         {"m|bf16|1024": 1000, "m|int4|1024": 300, "m|snapkv keep 1/4|1024": 250}, {"m|1024": 8}),
        ("ok", {"m|bf16|2048": 0.75, "m|int4|2048": 0.5},
         {"m|bf16|2048": 2000, "m|int4|2048": 500}, {"m|2048": 4}),
        ("failed", {}, {}, {}),
    ])
    lines = grid_markdown(tmp_path).splitlines()
    assert lines[0].startswith("| model | setting | bytes/BF16 (1K / 2K) |")
    assert [line.split(" | ")[1] for line in lines[2:]] == ["bf16", "int4", "snapkv keep 1/4"]  # BF16, then by bytes
    lo, hi = wilson(4, 8)
    assert f"| m | int4 | 0.300 / 0.250 | 0.50 [{lo:.2f}, {hi:.2f}] (n=8) |" in lines[3]
    assert lines[4].endswith("| - |") and "0.250 / nan" in lines[4]  # not run at 2K


def test_grid_of_a_sweep_with_nothing_finished(tmp_path):
    write(tmp_path, [("failed", {}, {}, {})])
    with pytest.raises(ParameterError, match="no point of the sweep finished"):
        grid_markdown(tmp_path)


def test_committed_gemma_grid_is_in_the_docs():
    """docs/quality.md's Gemma-3-270M grid is the committed sweep's, printed by kvlab (no figure typed in); every
    point held the bytes kvlab predicted."""
    import pandas as pd
    df = pd.read_csv(GEMMA / "results.csv", keep_default_na=False, dtype=str)
    assert set(df.status) == {"ok"} and set(df.held_equals_predicted) == {"True"}
    assert sorted(json.loads(c)[0] for c in df.contexts) == [1024, 2048, 4096]
    assert grid_markdown(GEMMA) in (ROOT / "docs" / "quality.md").read_text(encoding="utf-8")
