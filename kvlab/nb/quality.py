"""Notebook 08's parameters (quality on trained models). Checked on construction, so a bad value stops the notebook in
its second cell.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..errors import ParameterError
from ..hf.evaluate import PEERS
from ..hf.quality import (COMPUTE_DTYPES, FULL, Setting, format_settings, mechanism_label, mechanism_settings,
                          press_settings, resolve_model, same_label)
from .params import NotebookParams


@dataclass
class QualityParams(NotebookParams):
    """Notebook 08's parameters, checked on construction: a bad one stops the notebook with one message."""

    models: list  # trained dense / MLA checkpoints: names under data/checkpoints, directories or Hub ids
    v41_model: str  # the V4.1-like checkpoint ("" leaves it out)
    formats: list  # kvlab formats (integer ones KIVI-style)
    residual: int  # recent tokens the integer formats keep unquantized
    mechanisms: list  # kvlab.hf.mechanisms strings; budgets as fractions of the context ('window=1/4')
    presses: list  # kvlab.hf.presses as 'name keep budget [format]' (budget: a fraction of the context, or tokens)
    others: list  # labels of the settings also measured on every model after the first ('*': all)
    longer: list  # labels of the settings also measured at the contexts after the first ('*': all)
    peers: list  # transformers QuantizedCache backends
    contexts: list  # tokens per held-out window and task sample
    task: str  # kvlab.toy.tasks name
    samples: int  # task samples per (model, setting, context): the least, with halfwidth
    halfwidth: float  # more samples, in rounds of `batch`, until each Wilson 95% interval is this narrow (0: off)
    windows: int  # held-out windows per context
    heatmap: list  # settings of the needle heatmap (labels as above)
    heatmap_contexts: list  # context lengths of the heatmap
    depth_samples: int  # niah samples per heatmap cell (context x depth decile)
    chunk: int  # tokens per forward
    batch: int  # samples (or windows) per forward
    compute_dtype: str  # the models' compute dtype
    decode_steps: int  # decode steps timed per peer pair
    decode_rounds: int  # interleaved timing rounds
    seed: int  # seed of windows and samples
    threads: int  # torch CPU threads (0: leave torch's default)
    full: bool  # the complete grid (FULL): every format, budget, press, model and context, +-0.05 intervals
    paths: list = field(init=False)  # models (and the V4.1-like one) resolved to directories (or Hub ids)
    max_samples: int = field(init=False)  # the cap with halfwidth: the count that bounds any accuracy's interval
    dtype: torch.dtype = field(init=False)  # compute_dtype as a torch dtype

    def __post_init__(self):
        from ..formats import get_format
        from ..hf.evaluate import quiet
        if self.need_flag("full"):
            for k, v in FULL.items():
                setattr(self, k, list(v) if isinstance(v, (list, tuple)) else v)
        names = self.need_names("models")
        if self.need_text("v41_model"):
            names = names + [self.v41_model]
        self.paths = [resolve_model(m) for m in names]
        for f in self.need_names("formats"):
            self.need_lookup("formats", get_format, f)
        for m in self.need_names("mechanisms", empty=True):
            self.need_lookup("mechanisms", mechanism_label, m)
        press_settings(self.need_names("presses", empty=True))
        self.need_names("others", empty=True)
        self.need_names("longer", empty=True)
        self.need_names("heatmap", empty=True)
        self.need_names("peers", PEERS[1:], empty=True)
        self.need_ints("contexts", 16)
        self.need_ints("heatmap_contexts", 64)
        with quiet():  # kvlab.train registers its model with transformers: imports that log timestamps
            from ..toy.tasks import TASKS
        self.need_choice("task", TASKS)
        self.need_int("residual", 0)
        self.need_int("depth_samples", 0)
        for k in ("samples", "windows", "chunk", "batch", "decode_steps", "decode_rounds"):
            self.need_int(k, 1)
        self.need_int("threads", 0)
        self.need_number("halfwidth", 0, 0.49)
        from ..stats import samples_for_halfwidth
        self.max_samples = max(self.samples, samples_for_halfwidth(self.halfwidth)) if self.halfwidth else self.samples
        self.need_int("seed", 0)
        self.need_choice("compute_dtype", COMPUTE_DTYPES)
        self.dtype = getattr(torch, self.compute_dtype)
        known = [s.label for s in self.settings()]
        for k in ("others", "longer", "heatmap"):
            bad = [x for x in getattr(self, k) if x != "*" and not any(same_label(x, y) for y in known)]
            if bad:
                raise ParameterError(f"parameter {k}: {', '.join(map(repr, bad))} is not one of this run's settings "
                                     f"({', '.join(sorted(known))})")

    def settings(self, dtype: torch.dtype | None = torch.bfloat16) -> list[Setting]:
        """Every setting of the run: formats, then mechanisms and presses with K/V in BF16 (`dtype`: what a KIVI
        residual, a window and a press hold unquantized, BF16 as served)."""
        return (format_settings(self.formats, self.residual, dtype) + mechanism_settings(self.mechanisms, dtype=dtype)
                + press_settings(self.presses, dtype=dtype, residual=self.residual))

    def pick(self, labels: list, dtype: torch.dtype | None = torch.bfloat16) -> list[Setting]:
        """The settings named in `labels` ('*': all), in the run's order."""
        return [s for s in self.settings(dtype) if "*" in labels or any(same_label(s.label, x) for x in labels)]
