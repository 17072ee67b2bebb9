"""What one engine step costs: the interface the serving simulator consumes, and an affine model of it.

A step is what a vLLM-V1-like scheduler runs in one forward pass (vllm/v1/core/sched/scheduler.py schedule):
prefill chunks, each (new_tokens, context) with `context` the tokens already in the KV cache before the chunk
(prefix hits and earlier chunks), and decode requests, each given by its context length. Any step-time source
(aiconfigurator tables, a roofline) plugs in by providing `step_s`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence, runtime_checkable

from ..checks import need_number
from ..errors import ParameterError

# Default constants: an affine fit to NVIDIA aiconfigurator-core 0.12.0's Qwen3-8B / H200 / vLLM 0.24 / TP1 / BF16
# figures (shared/reference/serving.md): prefill 1 x 4,096 = 91.19 ms, decode step of 32 at 4,096 = 9.757 ms
# (8.585 ms with FP8 KV, so about 2.3 ms of it reads context), mixed 2,048 prefill + 32 decodes = 49.7 ms.
DEFAULT_OVERHEAD_S = 4.0e-3  # fixed cost of a step (launches, sampling, scheduling)
DEFAULT_PREFILL_TOKEN_S = 21.3e-6  # (91.19 - 4) ms / 4,096 tokens
DEFAULT_DECODE_REQUEST_S = 0.107e-3  # (9.757 - 4 - 2.34) ms / 32 requests
DEFAULT_CONTEXT_TOKEN_S = 17.9e-9  # 2.34 ms / (32 x 4,096) context tokens read


@runtime_checkable
class StepModel(Protocol):
    """Seconds one engine step takes."""

    def step_s(self, prefill: Sequence[tuple[int, int]], decode: Sequence[int]) -> float:
        """prefill: (new_tokens, context) per chunk; decode: context length per decoding request."""
        ...


@dataclass(frozen=True)
class AffineStepModel:
    """step_s = overhead + per prefill token x new tokens + per decode request x requests + per context token x
    (context read by every decode + context attended by every prefill chunk)."""

    overhead_s: float = DEFAULT_OVERHEAD_S  # fixed seconds per step
    prefill_token_s: float = DEFAULT_PREFILL_TOKEN_S  # seconds per new (uncached) prefill token
    decode_request_s: float = DEFAULT_DECODE_REQUEST_S  # seconds per decoding request in the batch
    context_token_s: float = DEFAULT_CONTEXT_TOKEN_S  # seconds per cached context token a request attends to

    def __post_init__(self):
        for k in ("overhead_s", "prefill_token_s", "decode_request_s", "context_token_s"):
            need_number(k, getattr(self, k), 0.0)
        if self.overhead_s + self.prefill_token_s + self.decode_request_s <= 0:
            raise ParameterError("an affine step model needs some positive cost")

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
        import numpy as np
        ctx = np.asarray(contexts, np.int64)  # [B]
        total = int(ctx.sum()) + ctx.size * np.arange(steps, dtype=np.int64)  # [steps] context tokens read
        return (self.overhead_s + self.prefill_token_s * 0 + self.decode_request_s * ctx.size
                + self.context_token_s * total)

    def decode_throughput(self, batch: int, context: int = 0) -> float:
        """Tokens/s of a steady decode batch of `batch` requests at `context` tokens each."""
        return batch / self.totals_s(0, batch, batch * context)
