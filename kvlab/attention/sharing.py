"""Layer modes from a model's cache layout: which layers store entries and whose entries the others read.

DeepSeek V4.1 ("CSA2", models.md): Full layers (kv_source_layer_ids) compute and store entries;
Reindex layers score the source's index keys with their own indexer and store nothing; Reuse layers
take the source's entries and selection. Layers 20-39 all read layer 20, whose input is the output
of layers 0-19: the decoder half attends to KV projected once from the encoder half (YOCO-like).
V4 layers are SWA, CSA (own indexer) or HCA (all entries). The modes come from kvlab.layout.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..checks import need_int
from ..layout import build_layout
from ..models import ModelSpec, load_model
from .checks import SelectionError

MODES = ("swa", "csa", "hca", "full", "reindex", "reuse")


@dataclass(frozen=True)
class LayerPlan:
    """What one layer of the stack does."""

    index: int  # layer number
    mode: str  # one of MODES
    ratio: int  # compression ratio of the entries it reads (0: SWA only)
    source: int  # layer whose stored entries it reads (itself when it stores them)
    indexed: bool  # it runs its own indexer (csa, full, reindex)

    @property
    def stores(self) -> bool:
        return self.mode in ("csa", "hca", "full")


def model_plan(model: str | ModelSpec) -> list[LayerPlan]:
    """One LayerPlan per decoder layer of a catalog V4 / V4.1 model."""
    spec = load_model(model)
    if spec.family not in ("dsv4", "dsv41"):
        raise SelectionError(f"{spec.name} is a {spec.family} model: layer modes need a DeepSeek V4 / V4.1 config")
    out = []
    for layer, m in zip(build_layout(spec).layers, spec.compress_ratios):
        src = layer.index if layer.source is None else layer.source
        out.append(LayerPlan(layer.index, layer.mode, m, src, layer.mode in ("csa", "full", "reindex")))
    return out


def scaled_plan(model: str | ModelSpec, layers: int) -> list[LayerPlan]:
    """The plan of a `layers`-deep stack that samples the real one evenly (layer j plays real layer
    floor(j * L / layers)); a sampled reader whose source was not sampled reads the nearest earlier
    sampled Full layer of the same ratio, or becomes Full itself."""
    full = model_plan(model)
    layers = need_int("layers", layers, 1, error=SelectionError)
    if layers > len(full):
        raise SelectionError(f"layers = {layers} is more than the model's {len(full)}")
    out: list[LayerPlan] = []
    for j in range(layers):
        p = full[j * len(full) // layers]
        if p.mode in ("reindex", "reuse"):
            src = next((q.index for q in reversed(out) if q.mode == "full" and q.ratio == p.ratio), None)
            if src is None:
                out.append(LayerPlan(j, "full", p.ratio, j, True))
                continue
            out.append(LayerPlan(j, p.mode, p.ratio, src, p.indexed))
        else:
            out.append(LayerPlan(j, p.mode, p.ratio, j, p.indexed))
    return out
