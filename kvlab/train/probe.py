"""Does a model copy from its context? The repeated-random-text probe of induction heads.

A random string shown twice (Olsson et al. 2022, "In-context Learning and Induction Heads", arXiv 2209.11895,
uses repeated random tokens the same way): a model that has learned to look back for the current token and copy what
followed it predicts the second copy far better than the first, which no model can know. That look-back-and-copy
mechanism is what retrieval (MQAR, needle, vartrack) builds on; a gain of about zero says the model does not copy
arbitrary text from its context. It is a probe, not a task score: a model may recall MQAR's digits a little before it
copies random letters.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..checks import need_int
from .tasks import LOWER


@dataclass(frozen=True)
class CopyProbe:
    """Next-token loss on a random string and on its repetition (nats per byte), and greedy copy accuracy."""

    first: float  # mean loss over the first copy (positions 1 .. L-1): what the model knows without looking back
    second: float  # mean loss over the second copy (its positions 1 .. L-1: each follows a token seen before)
    accuracy: float  # share of the second copy's positions 1 .. L-1 predicted exactly (greedy)
    length: int  # characters in the string (the sequence is twice as long)
    strings: int  # strings measured

    @property
    def gain(self) -> float:
        """Nats per byte the repetition saves (first - second): about 0 without an induction mechanism."""
        return self.first - self.second


def copy_strings(seed: int = 0, n: int = 8, length: int = 64, alphabet: str = LOWER) -> torch.Tensor:
    """n seeded random strings over `alphabet` (bytes), each written twice: ids [n, 2 * length]."""
    need_int("n", n, 1)
    need_int("length", length, 2)
    codes = torch.tensor(list(alphabet.encode("ascii")), dtype=torch.long)
    x = codes[torch.randint(0, len(codes), (n, length), generator=torch.Generator().manual_seed(seed))]  # [n, L]
    return torch.cat([x, x], 1)  # [n, 2L]


@torch.no_grad()
def copy_probe(model, seed: int = 0, n: int = 8, length: int = 64, device: str | torch.device = "cpu") -> CopyProbe:
    """Run the probe on a causal LM (anything returning `.logits` [B, T, V] for `input_ids`)."""
    ids = copy_strings(seed, n, length).to(device)  # [n, 2L]
    was = getattr(model, "training", False)
    model.eval()
    logits = model(input_ids=ids, use_cache=False).logits.float()  # [n, 2L, V]
    model.train(was)
    nll = F.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten(), reduction="none").view(n, -1)
    hit = (logits[:, :-1].argmax(-1) == ids[:, 1:]).float()  # [n, 2L - 1]: column t predicts token t + 1
    first, second = slice(0, length - 1), slice(length, 2 * length - 1)  # predictions of tokens 1..L-1, L+1..2L-1
    return CopyProbe(first=nll[:, first].mean().item(), second=nll[:, second].mean().item(),
                     accuracy=hit[:, second].mean().item(), length=length, strings=n)
