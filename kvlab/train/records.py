"""What a checkpoint trained here says about its training (train_record.json), and whether it is today's recipe.

Notebook 08 shows it beside each model's quality (kvlab.hf.quality measures the quality; this reads the record).
"""
from __future__ import annotations

import json
from pathlib import Path

from .loop import TrainConfig


def training_record(path: str) -> dict:
    """What a kvlab.train checkpoint says about its training (train_record.json), or {} for other models."""
    f = Path(path) / "train_record.json"
    if not f.is_file():
        return {}
    r = json.loads(f.read_text())
    final = r.get("final") or {}
    cfg = r.get("config") or {}
    return dict(current_recipe=current_recipe(cfg), steps=r.get("steps_run"), tokens=r.get("tokens"),
                parameters=r.get("parameters"), heldout_loss=final.get("heldout_loss"), tasks=final.get("tasks") or {},
                bf16=final.get(cfg.get("save_dtype", "bfloat16")) or {}, eval_samples=cfg.get("eval_samples"),
                eval_length=cfg.get("eval_length"), wall_s=(r.get("volatile") or {}).get("wall_s"))


def current_recipe(config: dict) -> bool | None:
    """Whether a training record's config is today's recipe (kvlab.train.TrainConfig's defaults for its architecture
    and size; the evaluation schedule aside), None for a record without one."""
    if not config.get("arch"):
        return None
    skip = ("eval_every", "device", "seed")
    today = TrainConfig(arch=config["arch"], size=config.get("size", "tiny")).to_dict()
    return all(config.get(k) == v for k, v in today.items() if k not in skip)
