"""kvlab inside transformers: a cache that keeps K/V packed in kvlab formats, and quality measured with it."""
from .cache import KvlabCache, KvlabLayer, make_cache

__all__ = ["KvlabCache", "KvlabLayer", "make_cache"]
