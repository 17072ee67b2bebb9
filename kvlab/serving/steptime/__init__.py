"""Step times: the latency of one engine iteration (prefill chunks + decode tokens) for a model, GPU, engine,
tensor parallelism and KV format.

Two sources behind one contract (`StepTimeSource.step_ms(step)`; as kvlab.serving.stepmodel.StepModel subclasses
they also price the serving simulator's steps), keyed in SOURCES (the CLI's `--step-time` names, with affine and
unit, are registered in kvlab.serving.stepsources):
  aiconfigurator  NVIDIA aiconfigurator's measured-data engine model (optional extra; .aiconfigurator)
  roofline        kvlab's own counts against the hardware table, an estimate (.roofline)
`step_time(model, gpu, engine, tp, kv_format)` picks aiconfigurator where it covers the combination and the
roofline otherwise; the returned source's `name` (and every StepTime's `source`) says which, and `describe()` what
its figures rest on. Without aiconfigurator installed (a plain `pip install kvlab`, no `serving` extra) auto says
so once per process, in one line on stderr.
"""
from __future__ import annotations

import sys

from ...checks import need_choice, need_int
from ...engines import ENGINES
from ...errors import ParameterError
from ...hardware import get_gpu
from . import aiconfigurator
from .aiconfigurator import Aiconfigurator
from .base import Chunk, Step, StepTime, StepTimeSource, parse_decode, parse_prefill
from .roofline import Roofline

SOURCES = {"aiconfigurator": Aiconfigurator, "roofline": Roofline}  # name -> StepTimeSource class (the choices)
CHOICES = ("auto",) + tuple(SOURCES)

NOT_INSTALLED = ("kvlab: aiconfigurator-core is not installed (pip install 'kvlab[serving]'): step times fall back to "
                 "kvlab's roofline, an estimate")
_told: set = set()  # notices already printed in this process


def tell_once(line: str) -> None:
    """Print one line on stderr, once per process."""
    if line not in _told:
        _told.add(line)
        print(line, file=sys.stderr)


__all__ = ["Chunk", "Step", "StepTime", "StepTimeSource", "SOURCES", "step_time", "parse_prefill", "parse_decode"]


def step_time(model, gpu: str, engine: str, tp: int = 1, kv_format: str | None = None,
              source: str = "auto", weights: int | None = None) -> StepTimeSource:
    """The step-time source for a combination: aiconfigurator where it covers it (source="auto"), else the
    roofline; source="aiconfigurator" refuses what it lacks with a ParameterError naming why."""
    source = need_choice("step-time source", source, CHOICES)
    engine = need_choice("engine", engine, ENGINES)
    tp = need_int("tp", tp, 1)
    g = get_gpu(gpu)  # refuses an unknown GPU; a Gpu with overridden fields is priced by the roofline as given
    name = g.name.upper()
    why = None
    if source == "auto":
        if not aiconfigurator.available():
            tell_once(NOT_INSTALLED)
        why = aiconfigurator.why_not(model, name, engine, tp, kv_format)
        if why is None:
            try:
                return Aiconfigurator(model, name, engine, tp, kv_format)
            except ParameterError as e:  # covered by the matrix, but this parallelism does not compile
                why = str(e)
        source = "roofline"
    if source == "roofline":
        r = Roofline(model, g, engine, tp, kv_format, weights=weights)
        r.why_not_aiconfigurator = why
        return r
    return Aiconfigurator(model, name, engine, tp, kv_format)
