"""RULER's synthetic tasks, generated offline for a real tokenizer (kvlab's own code).

RULER: Hsieh et al. 2024, "RULER: What's the Real Context Size of Your Long-Context Language Models?",
arXiv 2404.06654; NVIDIA/RULER (Apache-2.0): the task configurations in scripts/synthetic.yaml, the generators in
scripts/data/synthetic/niah.py, variable_tracking.py and common_words_extraction.py, the prompts and generation
lengths in scripts/data/synthetic/constants.py. Each task here keeps RULER's name, needles, prompt wording, value
kinds (7-digit numbers, UUIDs, adjective-noun keys from `wonderwords`' lists, MIT) and scoring (all references must
appear: kvlab.quality.scoring), and splits the prompt into kvpress's columns as kvpress splits RULER's (NVIDIA/kvpress,
evaluation/benchmarks/ruler/create_huggingface_dataset.py: the context up to the question, the question, the answer
prefix). Where kvlab differs, and why:
  * the essay haystack (Paul Graham's essays, downloaded by RULER) is CPython's documentation prose
    (kvlab.quality.haystack), starting at a seeded sentence per sample rather than always at the first;
  * the asked needle's depth is the sample's point on an even spread (kvlab.quality.tasks.depths), the other needles'
    uniform at random (RULER draws all from 40 evenly spaced depths); all keys and values within a sample differ, so a
    distractor never carries the asked key;
  * keys use the word lists' single words (lowercase letters and hyphens: no spaces, capitals or accents);
  * the question ends at its '?' and the answer prefix starts with its first word (RULER's prefix starts with a space
    that kvpress leaves at the question's end); variable tracking's prefix ends at "they are:" without RULER's space;
  * variable tracking's one-shot example has 5 noise lines (RULER sizes it to 500 tokens, half of a 1K context);
  * the sizes are fitted to the context's tokens as kvpress's pipeline prefills them (not RULER's whole input plus
    tokens to generate).
"""
from __future__ import annotations

import functools
import random
import re
import string
import uuid
from dataclasses import dataclass
from importlib import resources

from .haystack import Needle, noise_lines, place, prose, prose_sentences
from .tasks import Rendered, Task, register


@functools.cache
def word_list(kind: str) -> tuple[str, ...]:
    """A wonderwords list ('noun', 'adjective', 'verb'), single lowercase words only, sorted and unique."""
    from wonderwords import Defaults

    member = {"noun": Defaults.NOUNS, "adjective": Defaults.ADJECTIVES, "verb": Defaults.VERBS}[kind]
    text = resources.files("wonderwords.assets").joinpath(member.value).read_text(encoding="utf-8")
    return tuple(sorted({w.strip() for w in text.splitlines() if re.fullmatch(r"[a-z]+(-[a-z]+)*", w.strip())}))


def draw_value(rng: random.Random, kind: str) -> str:
    """A random key or value as RULER draws it: 'numbers' 7 digits, 'uuids' a version-4 UUID from 128 random bits,
    'words' an adjective-noun pair."""
    if kind == "numbers":
        return str(rng.randint(10**6, 10**7 - 1))
    if kind == "uuids":
        return str(uuid.UUID(int=rng.getrandbits(128), version=4))
    return f"{rng.choice(word_list('adjective'))}-{rng.choice(word_list('noun'))}"


def _distinct(rng: random.Random, kind: str, n: int, taken: set) -> list[str]:
    out = []
    while len(out) < n:
        v = draw_value(rng, kind)
        if v not in taken:
            taken.add(v)
            out.append(v)
    return out


def _needle(kind: str, key: str, value: str) -> str:
    return f"One of the special magic {kind} for {key} is: {value}."


@dataclass
class _NiahDraft:
    keys: list[str]  # every key (the asked ones and the distractors)
    values: list[list[str]]  # each key's values
    asked: list[int]  # the asked keys' indices
    needles: list[Needle]  # the first is the asked key's first value, at the sample's depth
    start: int  # prose: the first sentence; needles: the seed of the filler needles
    fillers: list[str]  # needles haystack: filler needles drawn so far (extended on demand)
    taken: set  # every key and value in use


@dataclass(frozen=True)
class Niah(Task):
    """Needle in a haystack (RULER's `niah`): 'One of the special magic {values} for {key} is: {value}.' hidden in a
    haystack; asked: the value(s) of one or more keys."""
    name: str
    ruler: str
    summary: str
    haystack: str  # 'noise' (RULER's sentences), 'prose' (RULER's essay: real text) or 'needles' (filler needles)
    key_kind: str = "words"  # RULER's type_needle_k
    value_kind: str = "numbers"  # RULER's type_needle_v
    keys: int = 1  # RULER's num_needle_k: keys hidden (the asked ones and distractors)
    values: int = 1  # RULER's num_needle_v: values per key
    queries: int = 1  # RULER's num_needle_q: keys asked
    max_new_tokens: int = 128
    tolerance: int = 16

    def draw(self, rng, depth, tokens):
        taken: set = set()
        keys = _distinct(rng, self.key_kind, max(self.keys, self.queries), taken)
        values = [_distinct(rng, self.value_kind, self.values, taken) for _ in keys]
        asked = rng.sample(range(len(keys)), self.queries)
        first = (asked[0], 0)
        pairs = [first] + [(k, j) for k in range(len(keys)) for j in range(self.values) if (k, j) != first]
        needles = [Needle(depth if (k, j) == first else rng.random(), _needle(self.value_kind, keys[k], values[k][j]))
                   for k, j in pairs]
        start = rng.randrange(len(prose_sentences())) if self.haystack == "prose" else rng.getrandbits(64)
        return _NiahDraft(keys, values, asked, needles, start, [], taken)

    def _units(self, d: _NiahDraft, units: int) -> tuple[list[str], str]:
        if self.haystack == "noise":
            return noise_lines(units), "\n"
        if self.haystack == "prose":
            return prose(d.start, units), " "
        while len(d.fillers) < units:  # filler i from a stream of its own: the same at any haystack size
            rng = random.Random(f"{d.start}:{len(d.fillers)}")
            key, value = draw_value(rng, self.key_kind), draw_value(rng, self.value_kind)
            while key in d.taken or value in d.taken:
                key, value = draw_value(rng, self.key_kind), draw_value(rng, self.value_kind)
            d.fillers.append(_needle(self.value_kind, key, value))
        return d.fillers[:units], "\n"

    def render(self, d, units):
        hay, joiner = self._units(d, units)
        text, offsets = place(hay, d.needles, joiner)
        kind = self.value_kind if self.queries * self.values > 1 else self.value_kind[:-1]  # 'numbers' -> 'number'
        query = [d.keys[k] for k in d.asked]
        query = query[0] if len(query) == 1 else ", ".join(query[:-1]) + ", and " + query[-1]
        if self.queries * self.values > 1:
            intro = f"Some special magic {kind} are hidden within the following text."
            question = f"What are all the special magic {kind} for {query} mentioned in the provided text?"
            prefix = f"The special magic {kind} for {query} mentioned in the provided text are"
        else:
            intro = f"A special magic {kind} is hidden within the following text."
            question = f"What is the special magic {kind} for {query} mentioned in the provided text?"
            prefix = f"The special magic {kind} for {query} mentioned in the provided text is"
        head = f"{intro} Make sure to memorize it. I will quiz you about the {kind} afterwards.\n"
        answer = tuple(v for k in d.asked for v in d.values[k])
        return Rendered(head + text + "\n", question, prefix, answer[0] if len(answer) == 1 else answer,
                        len(head) + offsets[0])


@dataclass
class _VtDraft:
    chain: list[str]  # 'VAR X = value', then 'VAR Y = VAR X', ...
    names: tuple[str, ...]  # the chain's variables (the answer)
    value: str  # the chain's value
    spots: list[float]  # sorted depths of the chain's lines
    example: str  # the one-shot example, answered


@dataclass(frozen=True)
class VariableTracking(Task):
    """Variable tracking (RULER's `variable_tracking`): a chain 'VAR A = 12345', 'VAR B = VAR A', ... hidden line
    by line in the noise haystack; asked: every variable that holds the value."""
    name: str = "vt"
    ruler: str = "vt"
    summary: str = "a chain of 4 assignments of a 5-digit value in noise; asked: all 5 variables"
    hops: int = 4  # RULER's num_hops (one chain: num_chains 1)
    example_lines: int = 5  # noise lines in the one-shot example
    max_new_tokens: int = 30
    tolerance: int = 16

    INTRO = "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n"

    @staticmethod
    def _chain(rng, letters: int, hops: int) -> tuple[list[str], tuple[str, ...], str]:
        names: list[str] = []
        while len(names) < hops + 1:
            v = "".join(rng.choices(string.ascii_uppercase, k=letters))
            if v not in names:
                names.append(v)
        value = str(rng.randint(10000, 99998))  # RULER: np.random.randint(10000, 99999)
        lines = [f"VAR {names[0]} = {value}"] + [f"VAR {b} = VAR {a}" for a, b in zip(names, names[1:])]
        return lines, tuple(names), value

    def _question(self, value: str) -> tuple[str, str]:
        return (f"Question: Find all variables that are assigned the value {value} in the text above.",
                f"Answer: According to the chain(s) of variable assignment in the text above, {self.hops + 1} "
                f"variables are assigned the value {value}, they are:")

    def draw(self, rng, depth, tokens):
        lines, names, value = self._chain(rng, 3, self.hops)  # the example's: 3 letters, as RULER's
        spots = sorted(rng.random() for _ in lines)
        text, _ = place(noise_lines(5 * self.example_lines), [Needle(s, x) for s, x in zip(spots, lines)], "\n")
        q, a = self._question(value)
        example = f"{self.INTRO}{text}\n{q} {a} {' '.join(names)}\n"
        chain, names, value = self._chain(rng, 5, self.hops)
        return _VtDraft(chain, names, value, sorted(rng.random() for _ in chain), example)

    def render(self, d, units):
        text, offsets = place(noise_lines(units), [Needle(s, x) for s, x in zip(d.spots, d.chain)], "\n")
        head = d.example + "\n" + self.INTRO
        q, a = self._question(d.value)
        return Rendered(head + text + "\n", q, a, d.names, len(head) + offsets[0])


@dataclass
class _CweDraft:
    words: list[str]  # the words in a seeded order: the first 10 are the common ones
    example: str  # the one-shot example, answered
    repeats: tuple[int, int]  # (common, uncommon) repetitions
    seed: int  # the list's shuffle


@dataclass(frozen=True)
class CommonWords(Task):
    """Common words extraction (RULER's `common_words_extraction`): a numbered list where 10 words repeat often
    and the rest rarely; asked: the 10 common ones."""
    name: str = "cwe"
    ruler: str = "cwe"
    summary: str = "a numbered word list, 10 words frequent (30x, 6x under 4K) among rare ones; asked: those 10"
    common: int = 10  # RULER's num_cw
    max_new_tokens: int = 120
    tolerance: int = 32

    INTRO = ("Below is a numbered list of words. In these words, some appear more often than others. Memorize the "
             "ones that appear most often.\n")
    QUESTION = "Question: What are the 10 most common words in the above list?"
    PREFIX = "Answer: The top 10 words that appear most often in the list are:"

    @staticmethod
    def _listing(words: list[str]) -> str:
        return " ".join(f"{i + 1}. {w}" for i, w in enumerate(words))

    def _words(self, words, repeats, rng) -> list[str]:
        out = words[:self.common] * repeats[0] + words[self.common:] * repeats[1]
        rng.shuffle(out)
        return out

    def draw(self, rng, depth, tokens):
        pool = sorted(set(word_list("noun") + word_list("adjective") + word_list("verb")))
        words = rng.sample(pool, len(pool))
        # RULER: under 4,096 tokens the list repeats 6x / 1x and the example holds 20 words 3x / 1x; else 30x / 3x
        # and 40 words 10x / 3x. The example's words come from the end of the order, apart from the sample's.
        short = tokens < 4096
        ex_words, ex_repeats = words[-(20 if short else 40):], ((3, 1) if short else (10, 3))
        example = (f"{self.INTRO}{self._listing(self._words(ex_words, ex_repeats, rng))}\n{self.QUESTION} "
                   f"{self.PREFIX} {self._listing(ex_words[:self.common])}\n")
        return _CweDraft(words[:-len(ex_words)], example, (6, 1) if short else (30, 3), rng.getrandbits(64))

    def render(self, d, units):
        if self.common + units > len(d.words):
            return None
        words = self._words(d.words[:self.common + units], d.repeats, random.Random(f"{d.seed}:{units}"))
        context = f"{d.example}\n{self.INTRO}{self._listing(words)}\n"
        return Rendered(context, self.QUESTION, self.PREFIX, tuple(d.words[:self.common]), None)


# The registry: RULER's names (scripts/synthetic.yaml) and configurations. RULER's 'essay' haystack is 'prose' here.
for _t in (
    Niah("niah_single_1", "niah_single_1", "a number in RULER's noise; asked: the number", "noise"),
    Niah("niah_single_2", "niah_single_2", "a number in real prose; asked: the number", "prose"),
    Niah("niah_single_3", "niah_single_3", "a UUID in real prose; asked: the UUID", "prose", value_kind="uuids"),
    Niah("niah_multikey_1", "niah_multikey_1", "4 keys' numbers in prose (3 distractors); asked: one key's",
         "prose", keys=4),
    Niah("niah_multikey_2", "niah_multikey_2", "a number among filler needles of other keys; asked: the number",
         "needles", tolerance=32),
    Niah("niah_multikey_3", "niah_multikey_3", "a UUID keyed by a UUID among UUID needles; asked: the UUID",
         "needles", key_kind="uuids", value_kind="uuids", tolerance=96),
    Niah("niah_multivalue", "niah_multivalue", "4 numbers under one key in prose; asked: all 4", "prose", values=4),
    Niah("niah_multiquery", "niah_multiquery", "4 keys' numbers in prose; asked: all 4 keys' numbers", "prose",
         keys=4, queries=4),
    VariableTracking(),
    CommonWords(),
):
    register(_t)
