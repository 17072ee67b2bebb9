"""kvlab inside transformers: a cache that keeps K/V packed in kvlab formats, and quality measured with it."""
from .cache import KvlabCache, KvlabLayer, make_cache
from .pretrained import resolve_model

__all__ = ["KvlabCache", "KvlabLayer", "make_cache", "resolve_model"]
