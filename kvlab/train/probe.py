"""Does a model copy from its context? A random string planted twice inside real text: the probe of induction heads.

A random string shown twice (Olsson et al. 2022, "In-context Learning and Induction Heads", arXiv 2209.11895, use
repeated random tokens the same way): a model that has learned to look back for the current bytes and copy what
followed them predicts the second copy far better than the first, which no model can know. That look-back-and-copy
mechanism is what retrieval (MQAR, needle, vartrack) builds on; a gain of about zero says the model does not copy
arbitrary text from its context.

The string sits inside a held-out text window at a seeded random offset, with a seeded random length and a seeded
random gap between its two copies (`plan_copy`), so that no fixed distance or position answers it: a model that only
learned "attend exactly L back" from strings written back to back at the start passes the old form of this probe and
fails this one. The same planting makes the training mix's copy rows (kvlab.train.mix), from the train split.

Measured on each copy's bytes `skip` .. s - 1 (`skip` = 2 by default): the prediction of byte k has seen k bytes of
its copy, and the second copy's first bytes cannot be told from text that merely shares a byte with the string.
  gain      mean loss on the first copy minus mean loss on the second (nats per byte)
  accuracy  share of the second copy's measured bytes predicted exactly (greedy, teacher forced)
"""
from __future__ import annotations

import random
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..checks import need_int
from ..errors import ParameterError

PRINTABLE = bytes(range(33, 127)).decode("ascii")  # the 94 visible ASCII characters: ln 94 = 4.54 nats a byte


@dataclass(frozen=True)
class CopyPlan:
    """Where a string of `length` bytes is written twice in a row of `total` bytes."""

    offset: int  # first byte of the first copy
    length: int  # bytes in the string
    gap: int  # bytes of text between the end of the first copy and the start of the second

    @property
    def second(self) -> int:
        """First byte of the second copy."""
        return self.offset + self.length + self.gap


def copy_lengths(total: int) -> tuple[int, int]:
    """(shortest, longest) string planted in a row of `total` bytes: total / 32 (at least 4) .. total / 4."""
    return max(4, total // 32), max(4, total // 4)


def plan_copy(rng: random.Random, total: int, min_len: int | None = None, max_len: int | None = None) -> CopyPlan:
    """A seeded plan: length uniform in [min_len, max_len], gap uniform in what is left, then the offset uniform
    in what is left after that (the first copy starts at byte 1 or later)."""
    lo, hi = copy_lengths(total)
    lo, hi = min_len or lo, max_len or hi
    if 2 * hi + 1 > total or lo > hi:
        raise ParameterError(f"copies of {lo}..{hi} bytes do not fit twice in a row of {total}")
    s = rng.randint(lo, hi)
    gap = rng.randint(0, total - 2 * s - 1)
    offset = rng.randint(1, total - 2 * s - gap)
    return CopyPlan(offset, s, gap)


def plant(row: torch.Tensor, plan: CopyPlan, string: torch.Tensor) -> torch.Tensor:
    """`row` [T] with `string` [plan.length] written over it at both copies (a new tensor)."""
    out = row.clone()
    out[plan.offset:plan.offset + plan.length] = string
    out[plan.second:plan.second + plan.length] = string
    return out


def random_string(rng: random.Random, n: int, alphabet: str = PRINTABLE) -> torch.Tensor:
    """n seeded bytes drawn uniformly from `alphabet`: ids [n]."""
    return torch.tensor([ord(rng.choice(alphabet)) for _ in range(n)], dtype=torch.long)


def copy_rows(corpus, split: str, seed: int, n: int, length: int, alphabet: str = PRINTABLE,
              span: tuple[int, int] | None = None) -> tuple[torch.Tensor, list[CopyPlan]]:
    """`n` text windows of `length` bytes from a corpus split, each with a random string planted twice by a seeded
    plan (string lengths in `span`, default `copy_lengths(length)`): (ids [n, length], plans)."""
    need_int("n", n, 1)
    need_int("length", length, 16)
    rows = corpus.windows(split, n, length, seed)
    rng = random.Random(f"copy:{seed}")
    plans, out = [], []
    for r in rows:
        p = plan_copy(rng, length, *(span or (None, None)))
        plans.append(p)
        out.append(plant(r, p, random_string(rng, p.length, alphabet)))
    return torch.stack(out), plans


@dataclass(frozen=True)
class CopyProbe:
    """Next-byte loss on a planted random string and on its repetition (nats per byte), and greedy copy accuracy."""

    first: float  # mean loss over the first copy's bytes skip .. s-1: what the model knows without looking back
    second: float  # mean loss over the second copy's bytes skip .. s-1 (each follows bytes seen before)
    accuracy: float  # share of the second copy's bytes skip .. s-1 predicted exactly (greedy)
    length: int  # bytes per row (text window with the two copies inside)
    strings: int  # strings measured
    skip: int  # leading bytes of each copy not measured
    measured: int = 0  # second-copy bytes measured over all strings (the accuracy's n)

    @property
    def gain(self) -> float:
        """Nats per byte the repetition saves (first - second): about 0 without an induction mechanism."""
        return self.first - self.second


@torch.no_grad()
def copy_probe(model, seed: int = 0, n: int = 8, length: int = 256, corpus=None, skip: int = 2,
               device: str | torch.device = "cpu", batch: int = 8) -> CopyProbe:
    """Run the probe on a causal LM (anything returning `.logits` [B, T, V] for `input_ids`), on held-out text of
    `corpus` (default: kvlab.toy.data.load_corpus())."""
    need_int("length", length, 16)
    need_int("skip", skip, 1)
    if corpus is None:
        from ..toy.data import load_corpus
        corpus = load_corpus()
    ids, plans = copy_rows(corpus, "heldout", seed, n, length)
    if skip >= min(p.length for p in plans):
        raise ParameterError(f"skip = {skip} leaves nothing of a {min(p.length for p in plans)}-byte string")
    was = getattr(model, "training", False)
    model.eval()
    nll, hit = [], []
    for i in range(0, n, batch):
        x = ids[i:i + batch].to(device)
        lg = model(input_ids=x, use_cache=False).logits.float()[:, :-1]  # column t predicts byte t + 1
        nll.append(F.cross_entropy(lg.flatten(0, 1), x[:, 1:].flatten(), reduction="none").view(len(x), -1).cpu())
        hit.append((lg.argmax(-1) == x[:, 1:]).float().cpu())
    model.train(was)
    nll, hit = torch.cat(nll), torch.cat(hit)
    first, second, acc = [], [], []
    for r, p in enumerate(plans):
        a, b = slice(p.offset + skip - 1, p.offset + p.length - 1), slice(p.second + skip - 1, p.second + p.length - 1)
        first.append(nll[r, a])
        second.append(nll[r, b])
        acc.append(hit[r, b])
    return CopyProbe(first=torch.cat(first).mean().item(), second=torch.cat(second).mean().item(),
                     accuracy=torch.cat(acc).mean().item(), length=length, strings=n, skip=skip,
                     measured=int(sum(a.numel() for a in acc)))
