"""One engine iteration (a step) and the contract every step-time source implements.

A step is what a continuous-batching engine runs in one forward pass: prefill chunks (new tokens on top of a
context already cached) and decode requests (one token each, attending their context). A `StepTimeSource`
prices it in milliseconds for one (model, GPU, engine, parallelism, KV format).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from ...checks import need_int
from ...errors import ParameterError


@dataclass(frozen=True)
class Chunk:
    """One prefill chunk of a request."""

    tokens: int  # new tokens this step computes
    cached: int = 0  # tokens of the same request already in the KV cache (earlier chunks, prefix hits)

    def __post_init__(self):
        need_int("prefill chunk tokens", self.tokens, 1)
        need_int("prefill chunk cached tokens", self.cached, 0)


@dataclass(frozen=True)
class Step:
    """One engine iteration: prefill chunks and decode requests (their context lengths)."""

    prefill: tuple[Chunk, ...] = ()  # prefill chunks batched in this step
    decode: tuple[int, ...] = ()  # per decode request: tokens already cached (it computes one more)

    def __post_init__(self):
        object.__setattr__(self, "prefill", tuple(self.prefill))
        object.__setattr__(self, "decode", tuple(need_int("decode context", c, 1) for c in self.decode))
        for c in self.prefill:
            if not isinstance(c, Chunk):
                raise ParameterError(f"a step's prefill holds Chunk(tokens, cached) items, got {c!r}")
        if not self.prefill and not self.decode:
            raise ParameterError("an empty step: give prefill chunks, decode requests or both")

    @classmethod
    def prefill_of(cls, tokens: int, batch: int = 1, cached: int = 0) -> "Step":
        """`batch` equal chunks of `tokens` new tokens over `cached` cached ones."""
        return cls(prefill=(Chunk(tokens, cached),) * need_int("prefill batch", batch, 1))

    @classmethod
    def decode_of(cls, batch: int, context: int) -> "Step":
        """`batch` decode requests, each with `context` tokens cached."""
        return cls(decode=(need_int("decode context", context, 1),) * need_int("decode batch", batch, 1))

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


class StepTimeSource:
    """Prices steps for one (model, GPU, engine, parallelism, KV format). Subclasses set `name` and implement
    `time`; `step_ms` is its `ms`."""

    name = ""  # registry key
    estimate = True  # whether its figures are estimates

    def time(self, step: Step) -> StepTime:
        raise NotImplementedError

    def step_ms(self, step: Step) -> float:
        return self.time(step).ms

    def step_s(self, prefill, decode) -> float:
        """kvlab.serving.stepmodel's StepModel protocol, so the serving simulator can run on any source: prefill
        (new_tokens, cached) pairs and decode contexts -> seconds (a decode at context 0 counts as context 1)."""
        return self.step_ms(Step(tuple(Chunk(n, c) for n, c in prefill), tuple(max(1, c) for c in decode))) / 1e3


# --- CLI / string forms --------------------------------------------------------------------------------------------
_PREFILL = re.compile(r"^(\d+)(?:x(\d+))?(?:@(\d+))?$")
_DECODE = re.compile(r"^(\d+)x(\d+)$")


def parse_prefill(text: str) -> tuple[Chunk, ...]:
    """'TOKENS[xBATCH][@CACHED]' (e.g. 4096, 1024x8, 2048@2048) -> chunks."""
    m = _PREFILL.match(str(text).strip().lower())
    if not m:
        raise ParameterError(f"--prefill {text!r}: expected TOKENS[xBATCH][@CACHED], e.g. 4096, 1024x8 or 2048@2048")
    tokens, batch, cached = int(m[1]), int(m[2] or 1), int(m[3] or 0)
    if tokens < 1 or batch < 1:
        raise ParameterError(f"--prefill {text!r}: tokens and batch must be at least 1")
    return (Chunk(tokens, cached),) * batch


def parse_decode(text: str) -> tuple[int, ...]:
    """'BATCHxCONTEXT' (e.g. 32x4096) -> decode contexts."""
    m = _DECODE.match(str(text).strip().lower())
    if not m or int(m[1]) < 1 or int(m[2]) < 1:
        raise ParameterError(f"--decode {text!r}: expected BATCHxCONTEXT with both at least 1, e.g. 32x4096")
    return (int(m[2]),) * int(m[1])
