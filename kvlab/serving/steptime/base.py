"""One engine iteration (a step) and the contract every step-time source implements.

A step is what a continuous-batching engine runs in one forward pass: prefill chunks (new tokens on top of a
context already cached) and decode requests (one token each, attending their context). A `StepTimeSource`
prices it in milliseconds for one (model, GPU, engine, parallelism, KV format).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from ...checks import _short, need_int
from ...errors import ParameterError
from ...sim.traces import MAX_TOKENS
from ..stepmodel import StepModel

MAX_CONTEXT = MAX_TOKENS  # most tokens one request may hold (kvlab.sim.traces' bound on a request's length)
MAX_BATCH = 2**20  # most prefill chunks or decode requests in one step: no engine batches a million


@dataclass(frozen=True)
class Chunk:
    """One prefill chunk of a request."""

    tokens: int  # new tokens this step computes
    cached: int = 0  # tokens of the same request already in the KV cache (earlier chunks, prefix hits)

    def __post_init__(self):
        need_int("prefill chunk tokens", self.tokens, 1, MAX_CONTEXT)
        need_int("prefill chunk cached tokens", self.cached, 0, MAX_CONTEXT - self.tokens)


@dataclass(frozen=True)
class Step:
    """One engine iteration: prefill chunks and decode requests (their context lengths)."""

    prefill: tuple[Chunk, ...] = ()  # prefill chunks batched in this step
    decode: tuple[int, ...] = ()  # per decode request: tokens already cached (it computes one more)

    def __post_init__(self):
        object.__setattr__(self, "prefill", tuple(self.prefill))
        object.__setattr__(self, "decode", tuple(need_int("decode context", c, 1, MAX_CONTEXT) for c in self.decode))
        if len(self.prefill) > MAX_BATCH or len(self.decode) > MAX_BATCH:
            raise ParameterError(f"a step batches at most {MAX_BATCH:,} prefill chunks and {MAX_BATCH:,} decodes, got "
                                 f"{len(self.prefill):,} and {len(self.decode):,}")
        for c in self.prefill:
            if not isinstance(c, Chunk):
                raise ParameterError(f"a step's prefill holds Chunk(tokens, cached) items, got {c!r}")
        if not self.prefill and not self.decode:
            raise ParameterError("an empty step: give prefill chunks, decode requests or both")

    @classmethod
    def prefill_of(cls, tokens: int, batch: int = 1, cached: int = 0) -> "Step":
        """`batch` equal chunks of `tokens` new tokens over `cached` cached ones."""
        return cls(prefill=(Chunk(tokens, cached),) * need_int("prefill batch", batch, 1, MAX_BATCH))

    @classmethod
    def decode_of(cls, batch: int, context: int) -> "Step":
        """`batch` decode requests, each with `context` tokens cached."""
        return cls(decode=(need_int("decode context", context, 1, MAX_CONTEXT),)
                   * need_int("decode batch", batch, 1, MAX_BATCH))

    @property
    def tokens(self) -> int:
        """Tokens computed this step (the matmuls' M)."""
        return sum(c.tokens for c in self.prefill) + len(self.decode)

    def label(self) -> str:
        parts = []
        if self.prefill:
            parts.append(f"{len(self.prefill)} prefill chunk(s), {sum(c.tokens for c in self.prefill):,} tokens")
        if self.decode:
            parts.append(f"{len(self.decode)} decode(s) at mean context {sum(self.decode) / len(self.decode):,.0f}")
        return " + ".join(parts)


@dataclass(frozen=True)
class StepTime:
    """A priced step."""

    ms: float  # latency of the step, milliseconds
    source: str  # which source priced it ("aiconfigurator" or "roofline")
    estimate: bool  # True for the roofline's estimate, False for aiconfigurator's measured-data model
    note: str = ""  # how the step was mapped onto the source, and what it assumes
    parts: dict = field(default_factory=dict)  # the source's breakdown (roofline: bytes, FLOPs, terms in ms)

    def as_dict(self) -> dict:
        return dict(ms=self.ms, source=self.source, estimate=self.estimate, note=self.note, parts=self.parts)


class StepTimeSource(StepModel):
    """Prices steps for one (model, GPU, engine, parallelism, KV format): its `target`. Subclasses set `name`,
    implement `time` and `basis`; `step_ms` is its `ms`. A StepModel (kvlab.serving.stepmodel), so the serving
    simulator runs on any source."""

    name = ""  # registry key
    estimate = True  # whether its figures are estimates
    target = None  # the deployment it prices (kvlab.serving.stepmodel.Target), set by the subclass
    why_not_aiconfigurator = None  # set by step_time(source="auto") on a fallback: why aiconfigurator was not used

    @classmethod
    def for_deployment(cls, d) -> "StepTimeSource":
        """The source for a kvlab.serving.stepsources.Deployment whose engine and TP are checked and whose GPU is
        looked up (a Gpu): how the registry builds a source it names by class."""
        raise NotImplementedError

    def basis(self) -> str:
        """What its figures were measured or fitted on, or how they are estimated, in one clause."""
        raise NotImplementedError

    def describe(self) -> dict:
        """source, basis, estimate (and why not aiconfigurator, on auto's fallback): what every output prints."""
        d = dict(source=self.name, basis=self.basis(), estimate=self.estimate)
        if self.why_not_aiconfigurator:
            d["why_not_aiconfigurator"] = self.why_not_aiconfigurator
        return d

    def time(self, step: Step) -> StepTime:
        raise NotImplementedError

    def step_ms(self, step: Step) -> float:
        return self.time(step).ms

    def step_s(self, prefill, decode) -> float:
        """The StepModel protocol: prefill (new_tokens, cached) pairs and decode contexts -> seconds (a decode at
        context 0 counts as context 1)."""
        return float(self.step_ms(Step(tuple(Chunk(n, c) for n, c in prefill), tuple(max(1, c) for c in decode)))) / 1e3


# --- CLI / string forms --------------------------------------------------------------------------------------------
_N = r"(\d{1,19})"  # a count of at most 19 digits (bounds apply after; longer text is not a count)
_PREFILL = re.compile(rf"^{_N}(?:x{_N})?(?:@{_N})?$")
_DECODE = re.compile(rf"^{_N}x{_N}$")


def parse_prefill(text: str) -> tuple[Chunk, ...]:
    """'TOKENS[xBATCH][@CACHED]' (e.g. 4096, 1024x8, 2048@2048) -> chunks."""
    m = _PREFILL.match(str(text).strip().lower())
    if not m:
        raise ParameterError(f"--prefill {_short(text)}: expected TOKENS[xBATCH][@CACHED], e.g. 4096, 1024x8 or "
                             "2048@2048")
    tokens, batch, cached = int(m[1]), int(m[2] or 1), int(m[3] or 0)
    if not (1 <= tokens and 1 <= batch <= MAX_BATCH and tokens + cached <= MAX_CONTEXT):
        raise ParameterError(f"--prefill {_short(text)}: tokens and batch must be at least 1, batch at most "
                             f"{MAX_BATCH:,} and tokens + cached at most {MAX_CONTEXT:,}")
    return (Chunk(tokens, cached),) * batch


def parse_decode(text: str) -> tuple[int, ...]:
    """'BATCHxCONTEXT' (e.g. 32x4096) -> decode contexts."""
    m = _DECODE.match(str(text).strip().lower())
    if not m or not (1 <= int(m[1]) <= MAX_BATCH and 1 <= int(m[2]) <= MAX_CONTEXT):
        raise ParameterError(f"--decode {_short(text)}: expected BATCHxCONTEXT, BATCH in [1, {MAX_BATCH:,}] and "
                             f"CONTEXT in [1, {MAX_CONTEXT:,}], e.g. 32x4096")
    return (int(m[2]),) * int(m[1])
