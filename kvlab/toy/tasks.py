"""Seeded synthetic long-context tasks: generators (seed, length) -> Sample, one scorer for all.

A `Sample` is text in segments, each marked as context or answer, so any tokenizer can render it
(`render`: each segment tokenized on its own; answers become labels, everything else -100). With the
byte tokenizer a sample of `length` is exactly `length` tokens. Accuracy (`score`) is per answer, an
answer being a maximal run of labelled positions: it counts when the model's greedy next-token
prediction (teacher forced) is right at every position of the run.

Tasks (all text, ASCII):
  mqar      multi-query associative recall (Zoology: Arora et al. 2023, arXiv 2312.04927): key-value
            pairs "a7 Q3 ...", then every key queried once in random order ("Q" -> "3").
  needle    needle in a haystack (RULER: Hsieh et al. 2024, arXiv 2404.06654, niah multi-key): filler
            sentences hiding `needles` sentences "the code of <key> is <value>."; one key is asked at the end.
  vartrack  variable tracking (RULER's vt, asked the other way round): Python-like assignment chains
            "x = 4821" ... "y = x" ... "z = y" among filler lines and distractor chains; the question
            "print(z) #" is answered with the chain's value.
  recall    MQAR with multi-byte keys distinct within a sample ("Qx3 ..." -> "3"): answerable by an induction
            head that matches the key's two bytes (a one-byte key is not: see reference facts on small models).
  niah      needle in a haystack laid out for induction: facts "The code <key>=<value>. " in filler, the question
            "Recall <key>=" repeats the key and its "=", so copying what followed it answers; the asked fact at a
            chosen depth (`depth`, for accuracy by depth decile). Keys and values differ from each other at every
            character position, so a match on the previous two bytes names one fact.
Chance is what a guesser uniform over the answer alphabet scores (`chance`).
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Callable

import torch

from ..checks import need_choice, need_int
from ..errors import ParameterError

IGNORE = -100  # label of positions that are not answers (transformers' ignore index)
LOWER = "abcdefghijklmnopqrstuvwxyz"
LETTERS = LOWER + LOWER.upper()
DIGITS = "0123456789"


@dataclass(frozen=True)
class Sample:
    """One task instance: text segments in order, each context (False) or answer (True)."""

    task: str  # task name
    segments: tuple[tuple[str, bool], ...]  # (text, is_answer)

    @property
    def text(self) -> str:
        return "".join(t for t, _ in self.segments)

    @property
    def answers(self) -> list[str]:
        return [t for t, a in self.segments if a]


# --- rendering and scoring ---------------------------------------------------------------------------
def render(sample: Sample, encode: Callable[[str], list[int]] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(input ids [T], labels [T]): labels hold the answer tokens, IGNORE elsewhere (transformers' convention:
    the model shifts them). `encode` maps text to ids (default: bytes)."""
    encode = encode or (lambda s: list(s.encode("utf-8")))
    ids, labels = [], []
    for text, is_answer in sample.segments:
        t = list(encode(text))
        ids += t
        labels += t if is_answer else [IGNORE] * len(t)
    return torch.tensor(ids, dtype=torch.long), torch.tensor(labels, dtype=torch.long)


def batch(samples: list[Sample], encode=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Render samples of equal token length: (ids [B, T], labels [B, T])."""
    rows = [render(s, encode) for s in samples]
    if len({len(r[0]) for r in rows}) != 1:
        raise ParameterError("batch: samples render to different lengths; batch them separately")
    return torch.stack([r[0] for r in rows]), torch.stack([r[1] for r in rows])


def answer_runs(labels: torch.Tensor) -> torch.Tensor:
    """Run id of each labelled position (0, 1, ... across the batch, in order), -1 elsewhere: [B, T]."""
    lab = labels != IGNORE  # [B, T]
    start = lab & ~torch.nn.functional.pad(lab, (1, 0))[:, :-1]  # a labelled position after an unlabelled one
    run = start.flatten().cumsum(0).view_as(lab) - 1
    return torch.where(lab, run, torch.full_like(run, -1))


def score_predictions(pred: torch.Tensor, labels: torch.Tensor) -> tuple[int, int]:
    """(answers right, answers) for next-token predictions pred [B, T] (pred[:, t] predicts token t + 1)."""
    runs = answer_runs(labels)[:, 1:].flatten()  # an answer at t is predicted at t - 1
    ok = (pred[:, :-1] == labels[:, 1:]).flatten()
    keep = runs >= 0
    n = int(runs.max()) + 1 if keep.any() else 0
    if labels[:, 0].ne(IGNORE).any():
        raise ParameterError("score: a label at position 0 cannot be predicted (nothing comes before it)")
    wrong = torch.zeros(n, dtype=torch.long).index_add_(0, runs[keep], (~ok[keep]).long())
    return int((wrong == 0).sum()), n


def score(logits: torch.Tensor, labels: torch.Tensor) -> float:
    """Accuracy over answers of greedy, teacher-forced predictions: logits [B, T, V], labels [B, T]."""
    right, n = score_predictions(logits.argmax(-1), labels)
    return right / n if n else float("nan")


# --- generators -------------------------------------------------------------------------------------
def _word(rng: random.Random, n: int, alphabet: str = LOWER) -> str:
    return "".join(rng.choice(alphabet) for _ in range(n))


def _distinct(rng: random.Random, count: int, n: int, alphabet: str) -> list[str]:
    if count > len(alphabet) ** n:
        raise ParameterError(f"{count} distinct keys do not exist with {n} characters of {alphabet!r}")
    out: dict[str, None] = {}
    while len(out) < count:
        out[_word(rng, n, alphabet)] = None
    return list(out)


def _pieces(rng: random.Random, n: int, pieces: tuple[str, ...], pad: Callable[[int], str]) -> list[str]:
    """Filler of exactly n characters: random whole `pieces`, then `pad(r)` for the r < max piece left."""
    out, left, longest = [], n, max(map(len, pieces))
    while left > longest:
        out.append(rng.choice(pieces))
        left -= len(out[-1])
    if left:
        out.append(pad(left))
    return out


def _scatter(rng: random.Random, filler: list[str], items: list[str]) -> str:
    """`items` in order, each placed at a seeded boundary between filler pieces."""
    slots = sorted(rng.randint(0, len(filler)) for _ in items)
    out, prev = [], 0
    for s, item in zip(slots, items):
        out += filler[prev:s] + [item]
        prev = s
    return "".join(out + filler[prev:])


def mqar(seed: int, length: int, pairs: int | None = None, key_len: int = 1, value_len: int = 1) -> Sample:
    """Multi-query associative recall in `length` characters, Zoology's layout in text: `pairs` key-value pairs
    written "<key><value>" and separated by spaces (keys: letters, values: digits), a newline, then every key
    queried once in random order, each followed by its value (the answer). Default pairs: as many as fill half
    the length, at most the distinct keys there are; leading spaces pad to the length."""
    need_int("seed", seed)
    need_int("length", length, 1)
    need_int("key_len", key_len, 1)
    need_int("value_len", value_len, 1)
    per = key_len + value_len + 1  # "a7 "
    pairs = need_int("pairs", pairs, 1) if pairs is not None else _mqar_pairs(length, key_len, value_len)
    need = 2 * pairs * per
    if need > length:
        raise ParameterError(f"mqar: {pairs} pairs need {need} characters, more than length = {length}")
    rng = random.Random(f"mqar:{seed}")
    keys = _distinct(rng, pairs, key_len, LETTERS)
    values = [_word(rng, value_len, DIGITS) for _ in keys]
    segs: list[tuple[str, bool]] = [(" " * (length - need), False)]
    segs.append((" ".join(k + v for k, v in zip(keys, values)) + "\n", False))
    for j, i in enumerate(rng.sample(range(pairs), pairs)):
        segs += [(("" if j == 0 else " ") + keys[i], False), (values[i], True)]
    segs.append(("\n", False))
    return Sample("mqar", _merge(segs))


NEEDLE_FILLER = (  # kvlab's own filler sentences (RULER's idea: repeated, meaningless text around the needle)
    "The river runs past the old mill. ", "A grey cat sleeps on the warm wall. ",
    "Rain is expected later in the week. ", "The market opens at nine every day. ",
    "Two birds sit on the fence and wait. ", "Nobody remembers who built the bridge. ",
    "The lamp in the hall is still on. ", "Bread is cheaper on the other street. ",
)


def needle(seed: int, length: int, needles: int | None = None, key_len: int = 4, value_len: int = 4) -> Sample:
    """`needles` sentences "the code of <key> is <value>." at seeded depths of filler text (default: one per 128
    characters, at most 4); the question at the end asks one of the keys: "What is the code of <key>? It is "
    -> "<value>"."""
    need_int("seed", seed)
    need_int("length", length, 1)
    needles = need_int("needles", needles, 1) if needles is not None else max(1, min(4, length // 128))
    need_int("key_len", key_len, 1)
    need_int("value_len", value_len, 1)
    rng = random.Random(f"needle:{seed}")
    keys = _distinct(rng, needles, key_len, LOWER)
    values = [_word(rng, value_len, DIGITS) for _ in keys]
    facts = [f"The code of {k} is {v}. " for k, v in zip(keys, values)]
    ask = rng.randrange(needles)
    question = f"\nWhat is the code of {keys[ask]}? It is "
    tail = ".\n"
    room = length - len(question) - value_len - len(tail) - sum(map(len, facts))
    if room < 0:
        raise ParameterError(f"needle: {needles} needles and the question need {length - room} characters, "
                             f"more than length = {length}")
    text = _scatter(rng, _pieces(rng, room, NEEDLE_FILLER, lambda r: " " * r), facts)
    return Sample("needle", _merge([(text + question, False), (values[ask], True), (tail, False)]))


def recall(seed: int, length: int, pairs: int | None = None, key_len: int = 2, value_len: int = 1) -> Sample:
    """MQAR (`mqar`'s layout) with `key_len`-letter keys, distinct within the sample."""
    s = mqar(seed, length, pairs, key_len, value_len)
    return Sample("recall", s.segments)


def _distinct_columns(rng: random.Random, count: int, n: int, alphabet: str) -> list[str]:
    """`count` words of `n` characters that differ from each other at every position."""
    if count > len(alphabet):
        raise ParameterError(f"{count} words cannot differ at every position with {len(alphabet)} characters")
    cols = [rng.sample(alphabet, count) for _ in range(n)]
    return ["".join(c[i] for c in cols) for i in range(count)]


def niah(seed: int, length: int, needles: int | None = None, key_len: int = 4, value_len: int = 4,
         depth: float | None = None) -> Sample:
    """`needles` facts "The code <key>=<value>. " in filler text (default: one per 128 characters, at most 4); the
    asked one at `depth` (0 = first, 1 = last piece of filler before it; None: seeded random), the others at seeded
    places; then "\nRecall <key>=" -> "<value>"."""
    need_int("seed", seed)
    need_int("length", length, 1)
    needles = need_int("needles", needles, 1) if needles is not None else max(1, min(4, length // 128))
    if depth is not None and not 0.0 <= depth <= 1.0:
        raise ParameterError(f"niah: depth = {depth} is not in [0, 1]")
    rng = random.Random(f"niah:{seed}")
    keys = _distinct_columns(rng, needles, key_len, LOWER)
    values = _distinct_columns(rng, needles, value_len, DIGITS)
    facts = [f"The code {k}={v}. " for k, v in zip(keys, values)]
    ask = rng.randrange(needles)
    question, tail = f"\nRecall {keys[ask]}=", ".\n"
    room = length - len(question) - value_len - len(tail) - sum(map(len, facts))
    if room < 0:
        raise ParameterError(f"niah: {needles} needles and the question need {length - room} characters, "
                             f"more than length = {length}")
    filler = _pieces(rng, room, NEEDLE_FILLER, lambda r: " " * r)
    at = rng.randint(0, len(filler)) if depth is None else round(depth * len(filler))
    slots = sorted([(rng.randint(0, len(filler)), i) for i in range(needles) if i != ask] + [(at, ask)])
    out, prev = [], 0
    for slot, i in slots:
        out += filler[prev:slot] + [facts[i]]
        prev = slot
    text = "".join(out + filler[prev:])
    return Sample("niah", _merge([(text + question, False), (values[ask], True), (tail, False)]))


VT_FILLER = ("pass\n", "i += 1\n", "data.append(i)\n", "if flag:\n", "total = total + 1\n", "print(total)\n",
             "result = None\n", "# nothing happens here\n")  # kvlab's own filler lines


def vartrack(seed: int, length: int, hops: int = 2, chains: int = 2, name_len: int = 3, value_len: int = 4) -> Sample:
    """`chains` assignment chains "a = 4821", "b = a", ... (`hops` copies each) interleaved in order at seeded
    places among filler lines; "print(<last name of one chain>) # " asks its value."""
    need_int("seed", seed)
    need_int("length", length, 1)
    need_int("hops", hops, 0)
    need_int("chains", chains, 1)
    need_int("name_len", name_len, 1)
    need_int("value_len", value_len, 1)
    rng = random.Random(f"vartrack:{seed}")
    names = _distinct(rng, chains * (hops + 1), name_len, LOWER)
    values = _distinct(rng, chains, value_len, DIGITS)
    lines = []  # per chain, its lines in order
    for c in range(chains):
        ns = names[c * (hops + 1):(c + 1) * (hops + 1)]
        lines.append([f"{ns[0]} = {values[c]}\n"] + [f"{ns[i]} = {ns[i - 1]}\n" for i in range(1, hops + 1)])
    ask = rng.randrange(chains)
    question = f"print({names[ask * (hops + 1) + hops]})  # "
    tail = "\n"
    room = length - len(question) - value_len - len(tail) - sum(len(x) for ls in lines for x in ls)
    if room < 0:
        raise ParameterError(f"vartrack: {chains} chains of {hops} hops need {length - room} characters, "
                             f"more than length = {length}")
    # interleave the chains' lines keeping each chain in order, then spread filler between lines
    order = [c for c in range(chains) for _ in lines[c]]
    rng.shuffle(order)
    seq, nxt = [], [0] * chains
    for c in order:
        seq.append(lines[c][nxt[c]])
        nxt[c] += 1
    text = _scatter(rng, _pieces(rng, room, VT_FILLER, lambda r: "#" + " " * (r - 2) + "\n" if r > 1 else "\n"), seq)
    return Sample("vartrack", _merge([(text + question, False), (values[ask], True), (tail, False)]))


def _merge(segs: list[tuple[str, bool]]) -> tuple[tuple[str, bool], ...]:
    """Join neighbouring context segments (answers stay separate); drop empty ones."""
    out: list[tuple[str, bool]] = []
    for t, a in segs:
        if not t:
            continue
        if out and not a and not out[-1][1]:
            out[-1] = (out[-1][0] + t, False)
        else:
            out.append((t, a))
    return tuple(out)


@dataclass(frozen=True)
class Task:
    """A task: its generator and the alphabet its answers draw from (for chance)."""

    name: str  # registry key
    generate: Callable[..., Sample]  # (seed, length, **options) -> Sample
    answer_alphabet: str  # characters an answer is made of
    answer_len: Callable[[dict], int]  # answer length in characters, from the generator's options
    summary: str  # one line
    curriculum: Callable[[random.Random, int], dict]  # (rng, length) -> options of a training sample, easy to hard

    def chance(self, **options) -> float:
        """Accuracy of a guesser uniform over the answer alphabet."""
        return len(self.answer_alphabet) ** -self.answer_len(options)

    def training_sample(self, seed: int, length: int, **options) -> Sample:
        """A training sample whose difficulty (pairs, needles, hops) is drawn from the seed: easy samples teach the
        lookup that the hard ones (the generator's defaults, used for evaluation) need; `options` override."""
        drawn = self.curriculum(random.Random(f"{self.name}-curriculum:{seed}"), length)
        return self.generate(seed, length, **{**drawn, **options})

    def samples(self, seed: int, n: int, length: int, start: int = 0, **options) -> list[Sample]:
        """`n` samples with seeds seed * 1_000_003 + i for i from `start` (one stream per seed)."""
        need_int("n", n, 1)
        need_int("start", start, 0)
        return [self.generate(seed * 1_000_003 + i, length, **options) for i in range(start, start + n)]


def _mqar_pairs(length: int, key_len: int = 1, value_len: int = 1) -> int:
    return max(1, min(len(LETTERS) ** key_len, length // (2 * (key_len + value_len + 1))))


TASKS: dict[str, Task] = {t.name: t for t in (
    Task("mqar", mqar, DIGITS, lambda o: o.get("value_len", 1), "multi-query associative recall (Zoology)",
         lambda rng, n: {"pairs": rng.randint(1, _mqar_pairs(n))}),
    Task("needle", needle, DIGITS, lambda o: o.get("value_len", 4), "needle retrieval, multi-key (RULER niah)",
         lambda rng, n: {"needles": rng.randint(1, max(1, min(4, n // 128)))}),
    Task("vartrack", vartrack, DIGITS, lambda o: o.get("value_len", 4), "variable tracking (RULER vt)",
         lambda rng, n: {"hops": rng.randint(0, 2), "chains": rng.randint(1, 2)}),
    Task("recall", recall, DIGITS, lambda o: o.get("value_len", 1), "MQAR with two-letter keys (induction-reachable)",
         lambda rng, n: {"pairs": rng.randint(1, _mqar_pairs(n, 2))}),
    Task("niah", niah, DIGITS, lambda o: o.get("value_len", 4), "needle in a haystack by depth (induction-reachable)",
         lambda rng, n: {"needles": rng.randint(1, max(1, min(4, n // 128)))}),
)}


def get_task(name: str) -> Task:
    return TASKS[need_choice("task", name, TASKS)]
