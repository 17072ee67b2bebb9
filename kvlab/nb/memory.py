"""Notebook 05's parameters (GPU memory). Checked on construction, so a bad value stops the notebook in its second
cell.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..cache.memory import resolve_device
from ..formats import get_format
from ..layout import build_layout
from .params import NotebookParams


@dataclass
class MemoryParams(NotebookParams):
    """Notebook 05's parameters, checked on construction; `layouts`, `dev` and `budget` are derived."""

    device: str  # auto | cpu | cuda (auto: cuda when torch sees one)
    models: list  # catalog names or config.json paths
    kv_formats: list  # "default": the formats of each layout; else one uniform format
    context_lengths: list  # tokens per session
    budget_gib: float  # skip (model, format, length) whose predicted bytes exceed this
    paged_model: str  # model measured with vLLM-style paging
    paged_lengths: list  # lengths for the paged check
    crosscheck_tokens: int  # tokens through the tiny transformers models
    seed: int  # content seed (bytes do not depend on it)
    layouts: dict = field(init=False, repr=False)  # each model's storage layout
    dev: torch.device = field(init=False)  # the device resolved
    budget: int = field(init=False)  # budget_gib in bytes

    def __post_init__(self):
        self.need_choice("device", ["auto", "cpu", "cuda"], self.need_text("device").split(":")[0])
        for f in self.need_names("kv_formats"):
            if f != "default":
                self.need_lookup("kv_formats", get_format, f)
        self.need_ints("context_lengths")
        self.need_number("budget_gib", 0.001)
        self.need_ints("paged_lengths")
        self.need_int("crosscheck_tokens", 2)
        self.need_int("seed", 0)
        self.layouts = {m: self.need_lookup("models", build_layout, m) for m in self.need_names("models")}
        self.layouts[self.need_text("paged_model")] = self.need_lookup("paged_model", build_layout)
        self.dev = self.need_lookup("device", resolve_device)
        self.budget = int(self.budget_gib * 2**30)
