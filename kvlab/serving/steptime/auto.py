"""The `auto` step-time rule: aiconfigurator's measured data where it covers the deployment, kvlab's roofline
otherwise, the roofline then saying why (`why_not_aiconfigurator`). Without aiconfigurator installed (a plain `pip
install kvlab`, no `serving` extra) it says so once per process, in one line on stderr.
"""
from __future__ import annotations

import sys

from ...errors import ParameterError
from . import aiconfigurator
from .aiconfigurator import Aiconfigurator
from .roofline import Roofline

NOT_INSTALLED = ("kvlab: aiconfigurator-core is not installed (pip install 'kvlab[serving]'): step times fall back to "
                 "kvlab's roofline, an estimate")
_told: set = set()  # notices already printed in this process


def tell_once(line: str) -> None:
    """Print one line on stderr, once per process."""
    if line not in _told:
        _told.add(line)
        print(line, file=sys.stderr)


def auto(d):
    """The source for deployment `d` (a kvlab.serving.stepsources.Deployment, its GPU looked up): aiconfigurator
    where it covers it and it compiles, else the roofline with the reason."""
    if not aiconfigurator.available():
        tell_once(NOT_INSTALLED)
    why = aiconfigurator.why_not(d.model, d.gpu.name.upper(), d.engine, d.tp, d.kv_format)
    if why is None:
        try:
            return Aiconfigurator.for_deployment(d)
        except ParameterError as e:  # covered by the matrix, but this parallelism does not compile
            why = str(e)
    r = Roofline.for_deployment(d)
    r.why_not_aiconfigurator = why
    return r
