"""Notebook 07's parameters (tiering on traces). Checked on construction, so a bad value stops the notebook in its
second cell.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..errors import ParameterError
from ..hardware import gpu_names
from ..models import catalog_names
from ..sim.policies import ADMISSIONS
from ..sim.tiering import MAX_GB, POLICIES, TIERS
from ..sim.traces import have_trace
from .params import NotebookParams


@dataclass
class TieringParams(NotebookParams):
    """Notebook 07's parameters (tiering on traces), checked on construction; `ttl` is ttl_s with 0 as inf."""

    trace: str  # 'synthetic', a Mooncake JSONL path, or conversation / mooncake_synthetic
    synthetic_sessions: int  # sessions in the synthetic agent workload
    seed: int  # seed of the synthetic workload
    models: list  # models whose bytes per token size the tiers
    model: str  # model of the detailed runs
    gpu: str  # GPU whose host-link and SSD bandwidths price the transfers
    hbm_gb: float  # KV budget in HBM, GB
    dram_gb: float  # host DRAM tier, GB
    ssd_gb: float  # SSD tier, GB
    policy: str  # eviction policy of the detailed run (POLICIES)
    ttl_s: float  # host-DRAM TTL of the detailed run, seconds (0: none)
    ttls_s: list  # TTLs for the sweep, seconds
    prefill_tokens_per_s: float  # prefill rate for recomputed tokens
    capacity_points: int  # points on each hit-rate curve
    validate_mooncake: bool  # set the Mooncake traces' reuse beside the paper's Table 2 when they are present
    policies: list  # policies compared on hit-rate curves and in the tiers (Belady's bound is always drawn)
    table_gb: list  # capacities (GB of the detailed model's KV) of the policy table
    mooncake_table_gb: list  # the same on Mooncake's conversation trace, when present
    target_shares: list  # target token hit rates, as shares of the trace's ceiling (every block cached)
    tier_policy: list  # one eviction policy per tier (HBM, DRAM, SSD) for the per-tier run
    tier_admission: list  # one admission rule per tier: "all" (every block) or "second" (from its second access)
    ttl: float = field(init=False)  # ttl_s, with "none" as math.inf

    def __post_init__(self):
        models = catalog_names()
        self.need_names("models", models)
        self.need_choice("model", models, self.need_text("model"))
        self.need_choice("gpu", gpu_names(), self.need_text("gpu").upper())
        self.need_int("synthetic_sessions")
        self.need_int("seed", 0)
        self.need_number("hbm_gb", 0.0, lo_open=True)
        self.need_number("dram_gb", 0.0)
        self.need_number("ssd_gb", 0.0)
        self.need_choice("policy", POLICIES)
        self.need_number("ttl_s", 0.0)
        self.need_numbers("ttls_s", 0.0, lo_open=True)
        self.need_number("prefill_tokens_per_s", 0.0, lo_open=True)
        self.need_int("capacity_points", 2)
        self.need_flag("validate_mooncake")
        self.need_names("policies", POLICIES)
        self.need_numbers("table_gb", 0.0, MAX_GB, lo_open=True)
        self.need_numbers("mooncake_table_gb", 0.0, MAX_GB, lo_open=True)
        self.need_numbers("target_shares", 0.0, 1.0, lo_open=True)
        for k, choices in (("tier_policy", POLICIES), ("tier_admission", tuple(ADMISSIONS))):
            if len(self.need_names(k, choices)) != len(TIERS):
                raise ParameterError(f"parameter {k} needs one entry per tier ({', '.join(TIERS)}), "
                                     f"got {len(getattr(self, k))}")
        if self.need_text("trace") != "synthetic" and not have_trace(self.trace):
            raise ParameterError(f"parameter trace: {self.trace!r} not found (use 'synthetic', a Mooncake JSONL path, "
                                 f"or conversation / mooncake_synthetic where the traces are present)")
        self.ttl = self.ttl_s if self.ttl_s > 0 else math.inf
