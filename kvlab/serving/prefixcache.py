"""A replica's prefix cache over HBM / DRAM / SSD: kvlab's one tier stack (kvlab.sim.tierstack.TierStack), the
same rules `kvlab simulate` follows - any registered eviction policy per tier, demotion on eviction, promotion on
a hit, one admission rule, a TTL on host DRAM with expiry to SSD. Blocks are the trace's hashed blocks (Mooncake:
512 tokens), whose ids name a block and everything before it, so a request's hit is its leading run of cached
blocks (vLLM's find_longest_cache_hit, vllm/v1/core/kv_cache_manager.py get_computed_blocks)."""
from __future__ import annotations

from ..sim.tierstack import TierStack

TierCache = TierStack  # the older name (serve-sim's replicas reach it through kvlab.serving.hosttiers)
