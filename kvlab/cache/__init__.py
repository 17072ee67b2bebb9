"""Packed KV-cache storage in torch: the one KV store (growing, window and tail stores over one interface),
a layout's KVCache built from them, memory measurement and the transformers cross-check."""
from .kvcache import KVCache, Slot
from .store import GrowingStore, KVStore, RowBuffer, TailStore, WindowStore, store_for, vector_store

__all__ = ["KVCache", "Slot", "KVStore", "GrowingStore", "WindowStore", "TailStore", "RowBuffer", "store_for",
           "vector_store"]
