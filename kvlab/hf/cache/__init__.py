"""kvlab's transformers cache: K/V packed in kvlab formats, one layer class per kind of decoder layer.

  family.py   which configs it holds (model types, layer types) and kvlab's spec of them
  streams.py  one role's tokens of a layer: packed rows and a residual, or the model's own values
  layers.py   the layer classes (full, sliding, MLA) and `LAYERS`, the mapping that picks them
  cache.py    `KvlabCache` and `make_cache`
"""
from .cache import KvlabCache, make_cache
from .family import DENSE_TYPES, LAYER_TYPES, MLA_TYPES, SUPPORTED, check_family, hf_spec, layer_kinds
from .layers import LAYERS, FullLayer, KvlabLayer, MlaLayer, SlidingLayer
from .streams import RawStream, Stream

__all__ = ["DENSE_TYPES", "LAYERS", "LAYER_TYPES", "MLA_TYPES", "SUPPORTED", "FullLayer", "KvlabCache", "KvlabLayer",
           "MlaLayer", "RawStream", "SlidingLayer", "Stream", "check_family", "hf_spec", "layer_kinds", "make_cache"]
