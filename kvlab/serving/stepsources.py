"""The step-time sources, registered once by name: what `kvlab serve-sim` / `kvlab plan --step-time` offer (their
choices and help are read from here) and what `build` returns, a kvlab.serving.stepmodel.StepModel.

Registering a source names it, says in one clause what it prices, whether it takes the affine coefficients and
whether it prices one tensor-parallel size (so `kvlab plan` searches TP sizes with it); its builder is imported only
when it is used, so the CLI's help does not load the roofline's or aiconfigurator's modules.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..checks import need_choice
from ..errors import ParameterError


@dataclass(frozen=True)
class Deployment:
    """What a source is asked to price: one replica of a model on a GPU (catalog names), and the affine coefficients
    when they were given."""

    model: object = None  # catalog model name or ModelSpec
    gpu: object = None  # catalog GPU name or Gpu
    engine: str = "vllm"  # allocation and scheduling rule
    tp: int = 1  # tensor-parallel size of the replica
    kv_format: str | None = None  # KV format name (None: the model's dtype)
    coefficients: tuple | None = None  # affine: (overhead_s, prefill_token_s, decode_request_s, context_token_s)


@dataclass(frozen=True)
class StepSource:
    """One registered step-time source."""

    name: str  # the --step-time value
    summary: str  # one clause for --step-time's help
    build: Callable  # Deployment -> StepModel
    coefficients: bool = False  # takes the affine coefficients (--overhead-ms ...)
    per_tp: bool = True  # prices one tensor-parallel size (False: one model for every TP)


SOURCES: dict[str, StepSource] = {}  # name -> source, in registration order (the CLI's order)


def register(name: str, summary: str, *, coefficients: bool = False, per_tp: bool = True):
    """Decorator: register `build(Deployment) -> StepModel` under `name` (once: a second registration is refused)."""
    def wrap(build):
        if name in SOURCES:
            raise ParameterError(f"step-time source {name!r} is registered twice")
        SOURCES[name] = StepSource(name, summary, build, coefficients, per_tp)
        return build
    return wrap


def names() -> tuple[str, ...]:
    """The registered names: the --step-time choices."""
    return tuple(SOURCES)


def get(name: str) -> StepSource:
    """The source registered as `name` (a ParameterError naming the choices otherwise)."""
    return SOURCES[need_choice("step-time source", name, names())]


def build(name: str, deployment: Deployment):
    """The StepModel source `name` builds for `deployment`."""
    return get(name).build(deployment)


def help_text() -> str:
    """--step-time's help: every source and its clause, the default first."""
    return "; ".join(f"{s.name}: {s.summary}" for s in SOURCES.values()) + " (default auto)"


def _catalog(source: str):
    def b(d: Deployment):
        from .steptime import step_time
        return step_time(d.model, d.gpu, d.engine, d.tp, d.kv_format, source=source)
    return b


register("auto", "aiconfigurator's data where it covers the deployment, else kvlab's roofline")(_catalog("auto"))
register("aiconfigurator", "NVIDIA aiconfigurator's measured-data engine model only (refused where it lacks the "
                           "deployment)")(_catalog("aiconfigurator"))
register("roofline", "kvlab's roofline estimate only")(_catalog("roofline"))


@register("affine", "the four coefficients below, or without them the fit to aiconfigurator's Qwen3-8B / H200 "
                    "figures (refused for any other deployment)", coefficients=True, per_tp=False)
def _affine(d: Deployment):
    from .stepmodel import AffineStepModel
    if d.coefficients is None:
        return AffineStepModel.fitted()
    return AffineStepModel(*d.coefficients, basis="coefficients given on the command line")


@register("unit", "every step exactly one second, so a trace whose timestamps count steps gives times in steps",
          per_tp=False)
def _unit(d: Deployment):
    from .stepmodel import AffineStepModel
    return AffineStepModel(1.0, 0.0, 0.0, 0.0, basis="one second per step (--step-time unit)")
