"""The step-time sources, registered once by name: the one list every consumer reads. `kvlab serve-sim` / `kvlab
plan --step-time` offer all of them (choices and help read from here), `kvlab step-time --source`, the serving
study and kvlab.serving.steptime.step_time the catalog ones; `build` returns a kvlab.serving.stepmodel.StepModel.

Registering a source names it, says in one clause what it prices, whether it takes the affine coefficients, whether
it prices one tensor-parallel size (so `kvlab plan` searches TP sizes with it), and whether it prices a catalog
model on a catalog GPU (`catalog`: the deployment's engine, TP and GPU are checked first, as step_time always did).
A catalog source that is one kvlab.serving.steptime.StepTimeSource class names it as "module:Class" (`cls`); the
class builds itself from the deployment (`for_deployment`). Builders and classes are imported only when used, so
the CLI's help does not load the roofline's or aiconfigurator's modules.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, replace
from typing import Callable

from ..checks import need_choice, need_int
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
    weights: int | None = None  # roofline: whole-model weight bytes (None: data/weights.json and the config's dtype)


@dataclass(frozen=True)
class StepSource:
    """One registered step-time source."""

    name: str  # the --step-time value
    summary: str  # one clause for --step-time's help
    builder: Callable | None = None  # Deployment -> StepModel (None: the class `cls` names builds it)
    coefficients: bool = False  # takes the affine coefficients (--overhead-ms ...)
    per_tp: bool = True  # prices one tensor-parallel size (False: one model for every TP)
    catalog: bool = False  # prices a catalog model on a catalog GPU (kvlab step-time's --source choices)
    cls: str | None = None  # "module:Class" of its kvlab.serving.steptime.StepTimeSource (None: not one class)

    def source_class(self) -> type | None:
        """The StepTimeSource class this source is (imported now), or None where it is not one class."""
        if self.cls is None:
            return None
        module, _, name = self.cls.partition(":")
        return getattr(importlib.import_module(module), name)

    def build(self, d: Deployment):
        """The StepModel this source prices `d` with (a catalog source checks d's engine, TP and GPU first)."""
        if self.catalog:
            d = _checked(d)
        if self.builder is not None:
            return self.builder(d)
        return self.source_class().for_deployment(d)


SOURCES: dict[str, StepSource] = {}  # name -> source, in registration order (the CLI's order)


def register(name: str, summary: str, *, coefficients: bool = False, per_tp: bool = True, catalog: bool = False,
             cls: str | None = None):
    """Decorator: register `build(Deployment) -> StepModel` under `name` (once: a second registration is refused).
    With `cls`, the class builds the model and the decorator may be called on None."""
    def wrap(build):
        if name in SOURCES:
            raise ParameterError(f"step-time source {name!r} is registered twice")
        if build is None and cls is None:
            raise ParameterError(f"step-time source {name!r}: give a builder or a class")
        SOURCES[name] = StepSource(name, summary, build, coefficients, per_tp, catalog, cls)
        return build
    return wrap


def names() -> tuple[str, ...]:
    """The registered names: the --step-time choices."""
    return tuple(SOURCES)


def catalog_names() -> tuple[str, ...]:
    """The catalog sources' names: `kvlab step-time --source`'s and kvlab.serving.steptime.step_time's choices."""
    return tuple(n for n, s in SOURCES.items() if s.catalog)


def get(name: str, choices: tuple[str, ...] | None = None) -> StepSource:
    """The source registered as `name`, one of `choices` (default all; a ParameterError naming them otherwise)."""
    return SOURCES[need_choice("step-time source", name, names() if choices is None else choices)]


def build(name: str, deployment: Deployment):
    """The StepModel source `name` builds for `deployment`."""
    return get(name).build(deployment)


def help_text(catalog: bool = False) -> str:
    """--step-time's help (with `catalog`, --source's): every source and its clause, the default first."""
    return "; ".join(f"{s.name}: {s.summary}" for s in SOURCES.values() if s.catalog or not catalog) \
        + " (default auto)"


def _checked(d: Deployment) -> Deployment:
    """d with its engine and TP checked and its GPU looked up (an unknown one refused; a Gpu with overridden fields
    is kept as given)."""
    from ..engines import ENGINES
    from ..hardware import get_gpu
    engine = need_choice("engine", d.engine, ENGINES)
    tp = need_int("tp", d.tp, 1)
    return replace(d, engine=engine, tp=tp, gpu=get_gpu(d.gpu))


@register("auto", "aiconfigurator's data where it covers the deployment, else kvlab's roofline", catalog=True)
def _auto(d: Deployment):
    from .steptime.auto import auto
    return auto(d)


register("aiconfigurator", "NVIDIA aiconfigurator's measured-data engine model only (refused where it lacks the "
                           "deployment)", catalog=True,
         cls="kvlab.serving.steptime.aiconfigurator:Aiconfigurator")(None)
register("roofline", "kvlab's roofline estimate only", catalog=True,
         cls="kvlab.serving.steptime.roofline:Roofline")(None)


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
