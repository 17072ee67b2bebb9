"""Step times: the latency of one engine iteration (prefill chunks + decode tokens) for a model, GPU, engine,
tensor parallelism and KV format.

Two sources behind one contract (`StepTimeSource.step_ms(step)`; as kvlab.serving.stepmodel.StepModel subclasses
they also price the serving simulator's steps), registered with every other step-time source in
kvlab.serving.stepsources (the one list: names, help, and the class each catalog source is):
  aiconfigurator  NVIDIA aiconfigurator's measured-data engine model (optional extra; .aiconfigurator)
  roofline        kvlab's own counts against the hardware table, an estimate (.roofline)
`step_time(model, gpu, engine, tp, kv_format)` picks aiconfigurator where it covers the combination and the
roofline otherwise (.auto); the returned source's `name` (and every StepTime's `source`) says which, and
`describe()` what its figures rest on. Without aiconfigurator installed (a plain `pip install kvlab`, no `serving`
extra) auto says so once per process, in one line on stderr.
"""
from __future__ import annotations

from .. import stepsources
from . import aiconfigurator  # noqa: F401
from .aiconfigurator import Aiconfigurator  # noqa: F401
from .auto import NOT_INSTALLED, tell_once  # noqa: F401
from .base import Chunk, Step, StepTime, StepTimeSource, parse_decode, parse_prefill
from .roofline import Roofline  # noqa: F401

CHOICES = stepsources.catalog_names()  # step_time's sources: auto and the classes below, from the registry
SOURCES = {s.name: s.source_class() for s in stepsources.SOURCES.values() if s.cls}  # name -> StepTimeSource class

__all__ = ["Chunk", "Step", "StepTime", "StepTimeSource", "SOURCES", "step_time", "parse_prefill", "parse_decode"]


def step_time(model, gpu: str, engine: str, tp: int = 1, kv_format: str | None = None,
              source: str = "auto", weights: int | None = None) -> StepTimeSource:
    """The step-time source for a combination: aiconfigurator where it covers it (source="auto"), else the
    roofline; source="aiconfigurator" refuses what it lacks with a ParameterError naming why. An unknown GPU is
    refused; a Gpu with overridden fields is priced by the roofline as given."""
    return stepsources.get(source, CHOICES).build(stepsources.Deployment(model, gpu, engine, tp, kv_format,
                                                                        weights=weights))
