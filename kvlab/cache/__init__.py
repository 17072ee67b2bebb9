"""Packed KV-cache storage in torch: a layout's components held in their real formats."""
from .kvcache import KVCache, Slot
from .store import ComponentStore, RowBuffer

__all__ = ["KVCache", "Slot", "ComponentStore", "RowBuffer"]
