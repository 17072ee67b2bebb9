"""What a cache setting costs on a real model: greedy answers to the same samples under every setting, beside BF16.

Protocol (kvpress's pipeline, kvlab.quality.prompt): each sample's prompt is split into a context and a question.
The context is prefilled once per mechanism at the model's own precision (kvlab.hf.context.prefill), then held by
each setting's cache (`KvlabCache.load_context`: stored in its formats, compressed once by its press); the question
is read through that cache, positions continuing, and the answer generated greedily from it. An answer is right when
the generated text holds every reference (kvlab.quality.scoring, RULER's string_match_all). Generation stops at the
tokenizer's end of sequence, at the sample's max_new_tokens, or (`stop_when_right`) as soon as the text holds the
answer: a text that holds it keeps holding it, so this early stop never changes a verdict, only the time.

A transformers peer cache (QuantizedCache) is filled by a forward of the context through it instead: its first
forward hands attention the unquantized states too, so the protocol is the same.

Bytes: every cache's tensors are measured (storage bytes) after the context is held and after the answer, and a
kvlab cache's prediction from its layout must equal both (`matches`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from ..checks import need_choice, need_int, need_number
from ..errors import ParameterError
from ..stats import accuracy_interval
from ..hf.context import prefill
from ..hf.evaluate import held_bytes
from ..hf.kernelset import math_attention_if_forced
from ..hf.quality import Setting
from .prompt import PROTOCOLS, sample_prompt
from .samples import Sample
from .scoring import is_right


@dataclass
class Answer:
    """One sample answered under one setting."""

    right: bool  # the generated text holds every reference
    text: str  # the generated text (up to the stop)
    tokens: int  # tokens generated
    context_bytes: int  # bytes the cache held once the context was in it (measured)
    held_bytes: int  # bytes the cache held after the answer (measured)
    matches: bool | None  # a kvlab cache's predicted bytes equal the measured ones at both points (None: a peer)


@dataclass
class Scores:
    """One setting over a list of samples (the same samples, in the same order, for every setting)."""

    label: str  # the setting's label
    answers: list = field(default_factory=list)  # Answer per sample

    @property
    def n(self) -> int:
        return len(self.answers)

    @property
    def right(self) -> int:
        return sum(a.right for a in self.answers)

    @property
    def accuracy(self) -> float:
        return self.right / self.n if self.n else math.nan

    @property
    def accuracy_ci(self) -> list:
        """[low, high]: the Wilson 95% interval of the accuracy."""
        from ..stats import wilson
        return list(wilson(self.right, self.n))

    @property
    def context_bytes(self) -> int:
        """Mean bytes held once each sample's context was in the cache."""
        return round(sum(a.context_bytes for a in self.answers) / self.n)

    @property
    def matches(self) -> bool | None:
        m = [a.matches for a in self.answers]
        return None if m and m[0] is None else all(m)

    def change(self, reference: "Scores", seed: int = 0):
        """The accuracy change against `reference` on the same samples, with its paired bootstrap 95% interval."""
        from ..stats import paired_accuracy_change
        if reference.n != self.n:
            raise ParameterError(f"{self.label!r} answered {self.n} samples, {reference.label!r} {reference.n}: a "
                                 "paired change needs the same samples")
        return paired_accuracy_change([a.right for a in reference.answers], [a.right for a in self.answers],
                                      [1] * self.n, seed=seed)


def _end_ids(tokenizer, model) -> set[int]:
    ids = set()
    for src in (getattr(tokenizer, "eos_token_id", None), getattr(model.generation_config, "eos_token_id", None)):
        ids.update([src] if isinstance(src, int) else (src or []))
    return ids


def greedy_ids(model, tokenizer, cache, question_ids: list[int], max_new_tokens: int, stop=None) -> list[int]:
    """Read the question through `cache` (holding the context) and generate greedily: the new token ids, up to
    the tokenizer's end of sequence (not included), `max_new_tokens`, or `stop(ids)` true after a token."""
    ends = _end_ids(tokenizer, model)
    ids = torch.tensor([question_ids], device=model.device)  # [1, Q]
    out: list[int] = []
    with torch.no_grad(), math_attention_if_forced():
        for _ in range(max_new_tokens):
            logits = model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=1).logits  # [1, 1, V]
            nxt = int(logits[0, -1].argmax())
            if nxt in ends:
                break
            out.append(nxt)
            if stop is not None and stop(out):
                break
            ids = torch.tensor([[nxt]], device=model.device)
    return out


def generate_answer(model, tokenizer, cache, question_ids: list[int], answer, max_new_tokens: int,
                    stop_when_right: bool = True) -> tuple[str, int]:
    """Read the question through `cache` (holding the context) and generate greedily: (text, tokens generated)."""
    text = lambda ids: tokenizer.decode(ids, skip_special_tokens=True)  # noqa: E731
    out = greedy_ids(model, tokenizer, cache, question_ids, max_new_tokens,
                     (lambda ids: is_right(text(ids), answer)) if stop_when_right else None)
    return text(out), len(out)


def _bytes_match(cache) -> bool | None:
    if not hasattr(cache, "predicted_bytes"):
        return None
    return held_bytes(cache) == cache.predicted_bytes()


def position_limit(model) -> int | None:
    """The most positions the model reads (config.max_position_embeddings; None: not stated)."""
    return getattr(model.config, "max_position_embeddings", None)


def check_task_tokens(model, tokens: int) -> None:
    """A task's context of `tokens` must fit the model's positions (checked before any sample is drawn: a long
    context takes a while to generate, and nothing should run only to fail at the first answer)."""
    limit = position_limit(model)
    if limit and tokens >= limit:
        raise ParameterError(f"task contexts of {tokens:,} tokens do not fit the model's max_position_embeddings "
                             f"{limit:,} with a question and an answer after them")


def _prompt_within(model, tokenizer, sample: Sample, protocol: str, place: int | None = None):
    prompt = sample_prompt(tokenizer, sample, protocol)
    limit = position_limit(model)
    total = len(prompt.context_ids) + len(prompt.question_ids) + sample.max_new_tokens
    if limit and total > limit:
        name = (f"sample {sample.id!r}" if sample.id is not None else "a sample" if place is None
                else f"sample #{place + 1}")
        raise ParameterError(f"{name}: {total:,} tokens with its answer, beyond the model's "
                             f"max_position_embeddings {limit:,}")
    return prompt


def check_samples(model, tokenizer, samples: list[Sample], protocol: str = "question_agnostic") -> list[int]:
    """Every sample's prompt with its answer fits the model's positions (before any is answered): the samples'
    context tokens, in order."""
    need_choice("protocol", protocol, PROTOCOLS)
    return [len(_prompt_within(model, tokenizer, smp, protocol, k).context_ids) for k, smp in enumerate(samples)]


def answer_sample(model, tokenizer, sample: Sample, settings: list[Setting], protocol: str = "question_agnostic",
                  max_new_tokens: int | None = None, stop_when_right: bool = True) -> list[Answer]:
    """One sample under every setting: the context prefilled once per mechanism, held by each setting's cache."""
    need_choice("protocol", protocol, PROTOCOLS)
    prompt = _prompt_within(model, tokenizer, sample, protocol)
    new = sample.max_new_tokens if max_new_tokens is None else min(sample.max_new_tokens, max_new_tokens)
    ids = torch.tensor([prompt.context_ids])  # [1, T]
    t = ids.shape[1]
    contexts: dict = {}  # mechanism label -> Context
    out = []
    for s in settings:
        if s.kind == "peer":
            cache = s.make(model, t)
            with torch.no_grad(), math_attention_if_forced():
                model(input_ids=ids.to(model.device), cache=cache, use_cache=True, logits_to_keep=1)
        else:
            cache = s.make(model, t)
            key = cache.mech.label()
            if key not in contexts:
                contexts[key] = prefill(model, ids, mechanism=cache.mech if not cache.mech.dense else None,
                                        queries=cache.mech.dense)
            cache.load_context(contexts[key])
        held_ctx, ok_ctx = held_bytes(cache), _bytes_match(cache)
        text, n = generate_answer(model, tokenizer, cache, prompt.question_ids, sample.answer, new, stop_when_right)
        ok_end = _bytes_match(cache)
        out.append(Answer(is_right(text, sample.answer), text, n, held_ctx, held_bytes(cache),
                          None if ok_ctx is None else bool(ok_ctx and ok_end)))
    return out


def evaluate(model, tokenizer, samples: list[Sample], settings: list[Setting], protocol: str = "question_agnostic",
             max_new_tokens: int | None = None, stop_when_right: bool = True, progress: bool = False,
             scores: dict | None = None) -> dict[str, Scores]:
    """Every setting on every sample: {label: Scores}, answers in the samples' order (appended to `scores`)."""
    labels = [s.label for s in settings]
    if len(set(labels)) != len(labels):
        raise ParameterError(f"settings share a label: {labels}")
    if not samples:
        raise ParameterError("no samples to evaluate")
    check_samples(model, tokenizer, samples, protocol)
    scores = scores if scores is not None else {}
    for label in labels:
        scores.setdefault(label, Scores(label))
    it = samples
    if progress:
        from tqdm.auto import tqdm
        it = tqdm(samples, desc="samples", unit="sample", leave=False)
    for smp in it:
        for s, a in zip(settings, answer_sample(model, tokenizer, smp, settings, protocol, max_new_tokens,
                                                stop_when_right)):
            scores[s.label].answers.append(a)
    return scores


@dataclass
class TaskRun:
    """A task's samples drawn in seeded rounds and every setting's scores on them."""

    task: str  # the task's name (kvlab.quality.tasks)
    tokens: int  # context tokens per sample
    protocol: str  # PROTOCOLS
    seed: int  # the first round's seed (round r draws with seed * 1_000_003 + r)
    samples: list = field(default_factory=list)  # the samples, in order
    scores: dict = field(default_factory=dict)  # label -> Scores


def evaluate_task(model, tokenizer, task: str, tokens: int, settings: list[Setting], *, seed: int = 0,
                  samples: int = 16, halfwidth: float | None = 0.1, max_samples: int = 96, round_size: int = 16,
                  protocol: str = "question_agnostic", max_new_tokens: int | None = None, progress: bool = False
                  ) -> TaskRun:
    """A task's samples (kvlab.quality.tasks.generate) in seeded rounds of `round_size`: at least `samples`, then
    more until every setting's Wilson 95% interval is at most +-`halfwidth` on each side (None: exactly `samples`)
    or `max_samples` are answered."""
    from .tasks import generate
    need_int("samples", samples, 1)
    need_int("round_size", round_size, 1)
    need_int("max_samples", max_samples, samples)
    if halfwidth is not None:
        need_number("halfwidth", halfwidth, 1e-3, 0.5)
    check_task_tokens(model, tokens)
    run = TaskRun(task, tokens, protocol, seed)
    cap = max_samples if halfwidth is not None else samples
    r = 0
    while len(run.samples) < cap:
        k = min(round_size, cap - len(run.samples))
        new = generate(task, tokenizer, tokens, k, seed * 1_000_003 + r, max_new_tokens)
        r += 1
        evaluate(model, tokenizer, new, settings, protocol, max_new_tokens, progress=progress, scores=run.scores)
        run.samples += new
        if len(run.samples) >= samples and (halfwidth is None or all(
                accuracy_interval(s.right, s.n).halfwidth <= halfwidth for s in run.scores.values())):
            break
    return run
