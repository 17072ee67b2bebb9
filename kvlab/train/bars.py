"""What a committed checkpoint must be able to do (issue 20's bars), and a fast check of it.

A model "retrieves" when, computing in BF16 through a BF16 kvlab cache (the V4.1-like model: its Stack with BF16
stores) at `length` tokens: its copy probe (kvlab.train.probe: strings at random offsets and lengths inside text)
gains at least 4 nats/byte with at least 0.9 of the copied bytes right; needle-in-a-haystack (niah) reaches 0.9, at
every depth decile too, and so does at least one more retrieval task (two-letter-key recall, MQAR or variable tracking:
issue 20 asks for two tasks, one of them niah); and its held-out text loss stays at or under 2.0 nats/byte.

`check` measures these on a few dozen seeded samples, each accuracy with its Wilson 95% interval; `Check.meets`
says which bars the measurement is consistent with: an accuracy meets its bar when its interval reaches it (so a
model measured at 0.97 on 2,000 samples does not fail a 48-sample check by chance, while one at 0.5 does).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..checks import need_int

COPY_GAIN = 4.0  # nats/byte the second copy of a string must be easier than the first
COPY_ACCURACY = 0.9  # share of the second copy's bytes predicted exactly
TASK_ACCURACY = 0.9  # niah, niah at every depth decile, and at least one of SECOND
NEEDLE = "niah"  # the retrieval task every checkpoint must answer, at every depth
SECOND = ("recall", "mqar", "vartrack")  # at least one of these must reach TASK_ACCURACY too; all are reported
TASKS = (NEEDLE,) + SECOND  # every task a check measures
HELDOUT_LOSS = 2.0  # nats/byte: no worse than the checkpoints before retraining (1.94-2.00)
LENGTH = 1024  # tokens: the default evaluation length


@dataclass
class Check:
    """One checkpoint's figures against the bars."""

    model: str  # checkpoint name
    length: int  # tokens per sample
    copy_gain: float  # nats/byte
    copy_accuracy: float  # share of measured second-copy bytes right
    copy_bytes: int  # second-copy bytes measured (the copy accuracy's n)
    heldout_loss: float  # nats/byte over the text windows (BF16 cache)
    tasks: dict = field(default_factory=dict)  # task -> (right, answers)
    depths: list = field(default_factory=list)  # niah per depth decile: (right, answers)

    @staticmethod
    def interval(right: int, n: int) -> tuple[float, float]:
        from ..stats import wilson
        return wilson(right, n)

    def meets(self) -> dict:
        """bar -> whether this measurement is consistent with it (an accuracy: its Wilson interval reaches the bar)."""
        hi = lambda rn: self.interval(*rn)[1] >= TASK_ACCURACY  # noqa: E731
        copy_right = round(self.copy_accuracy * self.copy_bytes)
        out = {"copy_gain": self.copy_gain >= COPY_GAIN,
               "copy_accuracy": self.interval(copy_right, self.copy_bytes)[1] >= COPY_ACCURACY,
               "heldout_loss": self.heldout_loss <= HELDOUT_LOSS}
        if NEEDLE in self.tasks:
            out[NEEDLE] = hi(self.tasks[NEEDLE])
        second = [t for t in SECOND if t in self.tasks]
        if second:
            out["second_task"] = any(hi(self.tasks[t]) for t in second)
        if self.depths:
            out["niah_every_decile"] = all(hi(d) for d in self.depths)
        return out

    def table(self) -> dict:
        """Figures with intervals, for a report."""
        out = dict(model=self.model, length=self.length, copy_gain=round(self.copy_gain, 3),
                   copy_accuracy=round(self.copy_accuracy, 4), heldout_loss=round(self.heldout_loss, 4))
        for t, (r, n) in self.tasks.items():
            lo, hi = self.interval(r, n)
            out[t] = f"{r / n:.3f} [{lo:.3f}, {hi:.3f}] n={n}"
        return out


def check(path: str, samples: int = 48, depth_samples: int = 8, copy_strings: int = 16, windows: int = 8,
          length: int = LENGTH, seed: int = 20_20, tasks=TASKS, chunk: int = 256) -> Check:
    """The bars' figures for the checkpoint at `path` (BF16 weights, BF16 kvlab cache), on seeded samples apart
    from training's and from notebook 08's."""
    from ..hf.quality import decile_depths, depth_grid, format_settings, load_models, measure
    from ..hf.evaluate import text_windows
    from .probe import copy_probe
    for k, v in (("samples", samples), ("copy_strings", copy_strings), ("windows", windows), ("length", length)):
        need_int(k, v, 1)
    need_int("depth_samples", depth_samples, 0)
    loaded = load_models([path], torch.bfloat16)
    (name, (model, encode)), = loaded.items()
    bf16 = format_settings(["bf16"], 0, torch.bfloat16)[0]
    text = text_windows(encode, length, windows, seed)
    text_only = measure(model, bf16, text, None, seed, encode, chunk)
    loss = sum(text_only.window_nll) / sum(text_only.window_tokens)
    out = {}
    for t in tasks:  # the text windows once above; here one window a task (measure always scores some text)
        m = measure(model, bf16, text[:1], t, seed, encode, chunk, samples)
        out[t] = (m.right, m.answers)
    depths = []
    if depth_samples:
        cells = depth_grid(loaded, [bf16], "niah", [length], decile_depths(), depth_samples, chunk, seed)
        depths = [(c.right, c.answers) for c in cells]
    probe = copy_probe(model, seed, n=copy_strings, length=length)
    return Check(name, length, probe.gain, probe.accuracy, probe.measured, loss, out, depths)
