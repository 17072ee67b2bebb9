"""What one engine step costs: the one step-time protocol the serving simulator consumes (`StepModel`), an affine
model of it, the one-second unit model, and the deployment a step model prices.

A step is what a vLLM-V1-like scheduler runs in one forward pass (vllm/v1/core/sched/scheduler.py schedule):
prefill chunks, each (new_tokens, context) with `context` the tokens already in the KV cache before the chunk
(prefix hits and earlier chunks), and decode requests, each given by its context length. Every step-time source
(the affine fit, the unit model, kvlab's roofline, aiconfigurator's measured data) is a `StepModel`: `step_s`
prices one step, `decode_run_s` a run of identical decode-only steps (the fast-forward's path; the base class
prices it step by step), `describe()` says where its figures come from (every serving output prints it), and a
model that prices one deployment (`target`) is refused for another. The sources are registered once, by name, in
kvlab.serving.stepsources (the CLI's `--step-time` choices); `as_step_model` adapts any other object with a
`step_s` to the protocol, once, before the simulator's loop starts.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ..checks import need_int, need_number
from ..errors import ParameterError

# The affine fit's constants: NVIDIA aiconfigurator-core 0.12.0's Qwen3-8B / H200 / vLLM 0.24 / TP1 / BF16 figures
# (shared/reference/serving.md): prefill 1 x 4,096 = 91.19 ms, decode step of 32 at 4,096 = 9.757 ms (8.585 ms with
# FP8 KV, so about 2.3 ms of it reads context), mixed 2,048 prefill + 32 decodes = 49.7 ms.
DEFAULT_OVERHEAD_S = 4.0e-3  # fixed cost of a step (launches, sampling, scheduling)
DEFAULT_PREFILL_TOKEN_S = 21.3e-6  # (91.19 - 4) ms / 4,096 tokens
DEFAULT_DECODE_REQUEST_S = 0.107e-3  # (9.757 - 4 - 2.34) ms / 32 requests
DEFAULT_CONTEXT_TOKEN_S = 17.9e-9  # 2.34 ms / (32 x 4,096) context tokens read
FIT_BASIS = "an affine fit to NVIDIA aiconfigurator-core 0.12.0's Qwen3-8B / H200 / vLLM / TP 1 / BF16 KV figures"


@dataclass(frozen=True)
class Target:
    """The deployment a step model prices (and a deployment_config sizes): model, GPU, engine, parallelism and KV
    format, by their catalog names. Build it with `Target.of`, which resolves names."""

    model: str  # catalog model name (kvlab.models ModelSpec.name)
    gpu: str  # catalog GPU name (upper case)
    engine: str | None = "vllm"  # allocation and scheduling rule (None: exact storage)
    tp: int = 1  # tensor-parallel size per replica
    pp: int = 1  # pipeline stages per replica
    kv_format: str = "bf16"  # canonical KV format name (the model's dtype when none is chosen)

    @classmethod
    def of(cls, model, gpu, engine: str | None = "vllm", tp: int = 1, pp: int = 1, kv_format=None) -> "Target":
        from ..formats import dtype_format, get_format
        from ..hardware import get_gpu
        from ..models import load_model
        spec = load_model(model)
        fmt = get_format(kv_format).name if kv_format is not None else dtype_format(spec.torch_dtype).name
        return cls(spec.name, get_gpu(gpu).name.upper(), engine, need_int("tp", tp, 1), need_int("pp", pp, 1), fmt)

    def label(self) -> str:
        return (f"{self.model} on {self.gpu}, {self.engine or 'exact storage'}, TP {self.tp}"
                + (f" PP {self.pp}" if self.pp > 1 else "") + f", KV {self.kv_format}")


FIT_TARGET = Target("qwen3-8b", "H200", "vllm", 1, 1, "bf16")  # the deployment the affine fit's figures describe


class StepModel:
    """Seconds one engine step takes: the one contract of the serving simulator's loop. Subclasses implement
    `step_s`; `decode_run_s` and `describe` have defaults."""

    target: Target | None = None  # the one deployment it prices (None: whatever the caller runs it on)

    def step_s(self, prefill: Sequence[tuple[int, int]], decode: Sequence[int]) -> float:
        """Seconds of one step, a Python float. prefill: (new_tokens, context) per chunk; decode: context length
        per decoding request."""
        raise NotImplementedError

    def decode_run_s(self, contexts: Sequence[int], steps: int) -> np.ndarray:
        """[steps] seconds of consecutive decode-only steps of one batch, step j at `contexts` + j: each must equal
        `step_s([], contexts + j)` to the last bit (the fast-forward sums them in the step loop's order). This
        default prices step by step; a source with a vectorized form overrides it."""
        return np.array([self.step_s((), [c + j for c in contexts]) for j in range(steps)], float)

    def describe(self) -> dict:
        """source, basis (what its figures were measured or fitted on, or how they are estimated) and estimate."""
        return dict(source=type(self).__name__, basis="a step model the caller supplied", estimate=None)


class _Adapted(StepModel):
    """Another object with a `step_s` (a third party's source) as a StepModel: its figures as floats, its run of
    decode steps priced step by step, its own description and target where it has them."""

    def __init__(self, inner):
        self.inner = inner  # the adapted object
        self.target = getattr(inner, "target", None)

    def step_s(self, prefill, decode) -> float:
        return float(self.inner.step_s(prefill, decode))

    def describe(self) -> dict:
        d = getattr(self.inner, "describe", None)
        if callable(d):
            return d()
        return dict(source=type(self.inner).__name__, basis="a step model the caller supplied", estimate=None)


def as_step_model(model) -> StepModel:
    """`model` as a StepModel: itself when it is one, an adapter for another object with a `step_s(prefill,
    decode)`; anything else is refused (a ParameterError naming its type)."""
    if isinstance(model, StepModel):
        return model
    if not callable(getattr(model, "step_s", None)):
        raise ParameterError(f"step_model must provide step_s(prefill, decode), got {type(model).__name__}")
    return _Adapted(model)


@dataclass(frozen=True)
class AffineStepModel(StepModel):
    """step_s = overhead + per prefill token x new tokens + per decode request x requests + per context token x
    (context read by every decode + context attended by every prefill chunk).

    Coefficients given here price any deployment the caller says they describe; `AffineStepModel.fitted()` is the
    fit to aiconfigurator's Qwen3-8B / H200 figures, which prices only that deployment (`target`)."""

    overhead_s: float  # fixed seconds per step
    prefill_token_s: float  # seconds per new (uncached) prefill token
    decode_request_s: float  # seconds per decoding request in the batch
    context_token_s: float  # seconds per cached context token a request attends to
    basis: str = "coefficients given by the caller"  # where the coefficients come from
    target: Target | None = None  # the one deployment they describe (None: whatever the caller runs them on)

    def __post_init__(self):
        for k in ("overhead_s", "prefill_token_s", "decode_request_s", "context_token_s"):
            need_number(k, getattr(self, k), 0.0, 1e6)
        if self.overhead_s + self.prefill_token_s + self.decode_request_s <= 0:
            raise ParameterError("an affine step model needs some positive cost")

    @classmethod
    def fitted(cls) -> "AffineStepModel":
        """The affine fit to NVIDIA aiconfigurator-core 0.12.0's Qwen3-8B / H200 / vLLM / TP 1 / BF16 figures."""
        return cls(DEFAULT_OVERHEAD_S, DEFAULT_PREFILL_TOKEN_S, DEFAULT_DECODE_REQUEST_S, DEFAULT_CONTEXT_TOKEN_S,
                   FIT_BASIS, FIT_TARGET)

    def describe(self) -> dict:
        c = (f"{self.overhead_s * 1e3:g} ms + {self.prefill_token_s * 1e6:g} us per prefill token + "
             f"{self.decode_request_s * 1e6:g} us per decode + {self.context_token_s * 1e9:g} ns per context token")
        return dict(source="affine", basis=f"{self.basis}: {c}", estimate=True)

    def step_s(self, prefill: Sequence[tuple[int, int]], decode: Sequence[int]) -> float:
        new = sum(n for n, _ in prefill)
        ctx = sum(c for _, c in prefill) + sum(decode)
        return self.totals_s(new, len(decode), ctx)

    def totals_s(self, prefill_tokens: int, decode_requests: int, context_tokens: int) -> float:
        """The same cost from a step's totals (what the simulator's loop keeps)."""
        return (self.overhead_s + self.prefill_token_s * prefill_tokens + self.decode_request_s * decode_requests
                + self.context_token_s * context_tokens)

    def decode_run_s(self, contexts, steps: int):
        """[steps] seconds of consecutive pure-decode steps of one batch, step j at `contexts` + j: each equals
        `step_s([], contexts + j)` exactly (integer context sums, the same float operations)."""
        ctx = np.asarray(contexts, np.int64)  # [B]
        total = int(ctx.sum()) + ctx.size * np.arange(steps, dtype=np.int64)  # [steps] context tokens read
        return (self.overhead_s + self.prefill_token_s * 0 + self.decode_request_s * ctx.size
                + self.context_token_s * total)

    def decode_throughput(self, batch: int, context: int = 0) -> float:
        """Tokens/s of a steady decode batch of `batch` requests at `context` tokens each."""
        return batch / self.totals_s(0, batch, batch * context)


def describe(model) -> dict:
    """Where a step model's figures come from: source, basis (what they were measured or fitted on, or how they
    are estimated) and whether they are an estimate; every serving output carries it."""
    d = getattr(model, "describe", None)
    if callable(d):
        return d()
    return dict(source=type(model).__name__, basis="a step model the caller supplied", estimate=None)


def describe_line(d: dict) -> str:
    """The description as one line: 'roofline (an estimate: ...)', 'aiconfigurator (measured: ...)'."""
    kind = {True: "an estimate", False: "measured"}.get(d.get("estimate"), "not said")
    out = f"{d['source']} ({kind}: {d['basis']})"
    if d.get("why_not_aiconfigurator"):
        out += f"; not aiconfigurator: {d['why_not_aiconfigurator']}"
    return out


def check_target(model, target: Target | None) -> None:
    """Refuse a step model that prices one deployment (its `target`) for another one (a ParameterError naming
    both): the affine fit's Qwen3-8B / H200 coefficients say nothing of a Llama-3.1-70B at TP 4 on H100."""
    own = getattr(model, "target", None)
    if own is None or target is None or own == target:
        return
    if isinstance(model, AffineStepModel):
        raise ParameterError(
            f"the affine step model's coefficients are {model.basis} ({own.label()}); {target.label()} is another "
            "deployment: give its four coefficients (AffineStepModel(overhead_s, prefill_token_s, decode_request_s, "
            "context_token_s); --overhead-ms, --prefill-token-us, --decode-request-us, --context-token-ns) or use "
            "the step-time sources (kvlab.serving.steptime.step_time; --step-time auto)")
    from dataclasses import replace
    if replace(own, pp=target.pp) == target:
        raise ParameterError(f"kvlab's step-time sources price one pipeline stage (PP 1); {target.label()} has "
                             f"{target.pp} stages: give its affine coefficients (--step-time affine --overhead-ms ...)")
    raise ParameterError(f"step times priced for {own.label()} cannot time {target.label()}")
