"""The source articles' numeric claims, checked against what kvlab computes.

data/claims.json holds each claim (paraphrased, with its article and claimed value) and the
name of the check that computes it. A check returns the computed value; the status is
  reproduced              computed value within the claim's tolerance
  holds under assumption  within tolerance only under the stated assumption
  does not hold           computed, and outside tolerance
  not yet checkable       no check yet: `pending` names the issue or measurement that would check it
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

from ..models import DATA_DIR

CLAIMS_FILE = DATA_DIR / "claims.json"


def _bpt(model, scheme="storage", fmt=None) -> Fraction:
    from ..layout import build_layout
    return build_layout(model, scheme, fmt).bytes_per_token


def _alloc_bpt(model, scheme) -> Fraction:
    from ..engines import allocate
    return allocate(model, scheme).bytes_per_token


def _spec(model):
    from ..models import load_model
    return load_model(model)


# Each check computes one number from configs and formats, never from the articles.
CHECKS = {
    "qwen3_bf16_bytes": lambda: _bpt("qwen3-8b"),
    "qwen3_bf16_kilobytes": lambda: _bpt("qwen3-8b") / 1000,
    "v41_bytes": lambda: _bpt("deepseek-v4.1-flash"),
    "v41_vs_v4_storage": lambda: _bpt("deepseek-v4.1-flash") / _bpt("deepseek-v4-flash"),
    "v41_vs_v4_bf16": lambda: _bpt("deepseek-v4.1-flash", "bf16") / _bpt("deepseek-v4-flash", "bf16"),
    "v41_vs_v4_vllm_padded": lambda: _bpt("deepseek-v4.1-flash") / _alloc_bpt("deepseek-v4-flash", "vllm"),
    "v1_67b_over_v41": lambda: _bpt("deepseek-llm-67b") / _bpt("deepseek-v4.1-flash"),
    "v1_7b_over_v41": lambda: _bpt("deepseek-llm-7b") / _bpt("deepseek-v4.1-flash"),
    "v41_session_1m": lambda: _layout("deepseek-v4.1-flash").session(1_000_000).growing,
    "v41_ssd_eighth": lambda: _bpt("deepseek-v4.1-flash") / (2 * _bpt("deepseek-v4-flash")),
    "v41_candidate_cap": lambda: _spec("deepseek-v4.1-flash").candidate_blocks * _spec("deepseek-v4.1-flash").candidate_block_size,
    "v41_layers": lambda: _spec("deepseek-v4.1-flash").num_layers,
    "v41_encoder_layers": lambda: sum(1 for r in _spec("deepseek-v4.1-flash").compress_ratios if r != 1),
    "v41_decoder_layers": lambda: sum(1 for r in _spec("deepseek-v4.1-flash").compress_ratios if r == 1),
    "v41_main_entry": lambda: _layout("deepseek-v4.1-flash").layers[2].components[1].entry.nbytes,
    "v41_window": lambda: _spec("deepseek-v4.1-flash").sliding_window,
    "v41_ttl_recompute": lambda: _ttl_recompute(),
    "v41_decode_flops_growth": lambda: _decode_growth("deepseek-v4.1-flash", "positions"),
}


def _ttl_recompute():
    from ..sim.tiering import v41_ttl_recompute
    return v41_ttl_recompute(60.0)


def _decode_growth(model, cap):
    """Per-decode-token FLOPs at 2^20 tokens over those at 4,096 (kvlab.attention.flops)."""
    from ..attention.flops import growth
    return growth(model, 4096, 1 << 20, cap=cap)


def _layout(model):
    from ..layout import build_layout
    return build_layout(model)


@dataclass(frozen=True)
class ClaimCheck:
    """One claim with kvlab's verdict."""

    id: str  # stable identifier
    source: str  # title of the article the claim comes from
    claim: str  # the claim, paraphrased
    claimed: float | None  # the number the article gives
    computed: float | None  # what kvlab computes (None: not yet checkable)
    status: str  # reproduced / holds under assumption / does not hold / not yet checkable
    note: str  # the assumption, the pending issue, or how it was computed
    unit: str = ""  # unit of both numbers


def load_claims(path: Path = CLAIMS_FILE) -> list[dict]:
    return json.loads(Path(path).read_text())["claims"]


def check_claim(c: dict) -> ClaimCheck:
    check = c.get("check")
    if not check or check not in CHECKS:
        return ClaimCheck(c["id"], c["source"], c["claim"], c.get("value"), None, "not yet checkable",
                          c.get("pending", "no check yet"), c.get("unit", ""))
    v = CHECKS[check]()
    v = float(v) if isinstance(v, Fraction) and v.denominator != 1 else (int(v) if isinstance(v, Fraction) else v)
    claimed, tol = c.get("value"), c.get("tolerance", 0)
    ok = claimed is None or abs(float(v) - float(claimed)) <= tol
    if not ok:
        status = "does not hold"
    elif c.get("assumption"):
        status = "holds under assumption"
    else:
        status = "reproduced"
    note = c.get("assumption") or c.get("note", "")
    if not ok and c.get("fails_because"):
        note = c["fails_because"]
    return ClaimCheck(c["id"], c["source"], c["claim"], claimed, v, status, note, c.get("unit", ""))


def audit(path: Path = CLAIMS_FILE) -> list[ClaimCheck]:
    """Every claim in data/claims.json, checked."""
    return [check_claim(c) for c in load_claims(path)]
