"""Perplexity change on real text: every setting on the same windows of prose, beside the model-precision cache.

The text is kvlab.quality.haystack's prose (the Python documentation shipped with CPython: PSF licence), windows of
`tokens` tokens at seeded sentence offsets. Each window is fed through a fresh cache of each setting in chunks
(kvlab.hf.evaluate.run_pass); a press prefills the window's first half in one forward, compresses it, and the second
half is scored against what it kept (kvpress's protocol). The change against the reference is paired over windows
(kvlab.stats.paired_bootstrap).
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field

import torch

from ..checks import need_int
from ..errors import ParameterError
from ..hf.evaluate import run_pass
from ..hf.quality import Setting
from .haystack import prose, prose_sentences


def prose_windows(tokenizer, tokens: int, n: int, seed: int = 0) -> torch.Tensor:
    """`n` windows of `tokens` token ids of the documentation prose, each from a seeded sentence: [n, tokens]."""
    need_int("tokens", tokens, 2)
    need_int("n", n, 1)
    rng = random.Random(f"kvlab.quality.perplexity:{seed}")
    count = len(prose_sentences())
    out = []
    for _ in range(n):
        text = " ".join(prose(rng.randrange(count), tokens))  # a word is at least one token
        ids = tokenizer.encode(text, add_special_tokens=False)[:tokens]
        if len(ids) < tokens:
            raise ParameterError(f"the prose gave {len(ids):,} tokens where a window needs {tokens:,}")
        out.append(torch.tensor(ids))
    return torch.stack(out)  # [n, T]


@dataclass
class TextScores:
    """One setting's summed next-token NLL per window (nats) and the tokens scored in each."""

    label: str  # the setting's label
    nll: list = field(default_factory=list)  # per window
    scored: list = field(default_factory=list)  # per window

    @property
    def perplexity(self) -> float:
        import math
        return math.exp(sum(self.nll) / sum(self.scored))

    def change(self, reference: "TextScores", seed: int = 0):
        """perplexity / reference - 1 with its paired bootstrap 95% interval over the windows."""
        from ..stats import paired_bootstrap
        if reference.scored != self.scored:
            raise ParameterError(f"{self.label!r} and {reference.label!r} were scored on different windows")
        return paired_bootstrap(reference.nll, self.nll, self.scored, seed=seed)


def text_scores(model, windows: torch.Tensor, settings: list[Setting], chunk: int = 64) -> dict[str, TextScores]:
    """Every setting over every window [n, T]: {label: TextScores}."""
    need_int("chunk", chunk, 1)
    t = windows.shape[1]
    out = {s.label: TextScores(s.label) for s in settings}
    for w in windows:
        for s in settings:
            p = run_pass(model, w[None], s.make(model, t), chunk, max(1, t // 2) if s.press else None)
            out[s.label].nll.append(p.nll)
            out[s.label].scored.append(p.scored)
    return out
