"""examples/gemma_fp4_split.py's settings hold what their labels say, layer by layer and K / V apart (docs/quality.md's
NVFP4-on-Gemma table reads them)."""
import sys
from pathlib import Path

import pytest

from test_cache_layers import gemma

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from gemma_fp4_split import settings  # noqa: E402


def formats(cache) -> list[tuple[str, str]]:
    """(K format, V format) per layer, read from the cache's layout."""
    out = []
    for layer in cache.layout.layers:
        f = {c.role: c.entry.parts[0].fmt.name for c in layer.components}
        out.append((f["k"], f["v"]))
    return out


@pytest.mark.parametrize("label, expect", [
    ("bf16", [("bf16", "bf16")] * 6),
    ("nvfp4", [("nvfp4", "nvfp4")] * 6),
    ("mxfp4", [("mxfp4", "mxfp4")] * 6),
    ("nvfp4 K only", [("nvfp4", "bf16")] * 6),
    ("nvfp4 V only", [("bf16", "nvfp4")] * 6),
    ("nvfp4 on the full layers only", [("bf16", "bf16")] * 5 + [("nvfp4", "nvfp4")]),
    ("nvfp4 on the sliding layers only", [("nvfp4", "nvfp4")] * 5 + [("bf16", "bf16")]),
    ("mxfp4 K only", [("mxfp4", "bf16")] * 6),
    ("mxfp4 V only", [("bf16", "mxfp4")] * 6),
])
def test_each_setting_holds_its_formats(label, expect):
    cfg = gemma()  # 5 sliding layers, then 1 full
    s = {x.label: x for x in settings(cfg.layer_types)}[label]
    assert formats(s.make(cfg)) == expect


def test_the_split_covers_every_layer_once():
    cfg = gemma()
    cfg.num_hidden_layers, cfg.layer_types = 12, cfg.layer_types * 2  # two groups of 5 sliding + 1 full
    by = {x.label: x for x in settings(cfg.layer_types)}
    full = formats(by["nvfp4 on the full layers only"].make(cfg))
    sliding = formats(by["nvfp4 on the sliding layers only"].make(cfg))
    assert all((a == ("nvfp4", "nvfp4")) != (b == ("nvfp4", "nvfp4")) for a, b in zip(full, sliding))
    assert [i for i, f in enumerate(full) if f[0] == "nvfp4"] == [5, 11]
