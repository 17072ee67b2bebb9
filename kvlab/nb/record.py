"""Named results: notebooks record their key numbers; batch runs collect them from the outputs.

`record(name, value)` displays the value as an output with its own MIME type, so the result
travels inside the executed notebook (papermill output, nbval comparison) and `read_results`
gets it back without re-running anything.

Exact and measured values are kept apart, because only exact ones survive another CPU to the last digit:
- exact: ints, bools, strings, `fractions.Fraction` (kvlab's byte math) and floats with a short exact decimal
  form (3514.25, 0.5, 16.0: byte figures and ratios of counts). A Fraction that is no short decimal (389120/437)
  is shown to 6 significant digits, the same on every machine. nbval compares exact results exactly.
- measured: every other float (numpy / torch float scalars included): the result of float arithmetic that
  rounds differently on other CPUs, kernel sets and thread counts. It is rounded to `digits` significant
  digits (4 by default) and the payload carries the tolerance nbval compares it with (kvlab.nb.tolerance):
  `rtol` (RTOL by default) or `atol`, on top of the rounding itself, so a value that lands on either side of
  a rounding boundary on two machines still matches. Give a larger `rtol`, or an `atol`, where the data
  supports less: a KL through a chaotic decode, an error at float32's noise floor.
"""
from __future__ import annotations

import json
import math
from fractions import Fraction
from pathlib import Path

from ..errors import ParameterError
from .tolerance import MIME, RTOL

DIGITS = 4  # significant digits a measured float is recorded with
INTERRUPTED_TAG = "kvlab-interrupted"  # the banner cell of a notebook whose batch run was cut short
_SESSION: dict[str, object] = {}  # results recorded in this process


def _short(f: float) -> bool:
    """A float with a short exact decimal form (at most 10 significant digits): 3514.25, 0.5, 16.0."""
    return len(repr(f).split("e")[0].replace("-", "").replace(".", "").strip("0")) <= 10


def _exact_float(x: Fraction) -> float | int:
    if x.denominator == 1:
        return int(x)
    f = float(x)
    return f if _short(f) else float(f"{f:.6g}")


def _plain(value, digits: int, measured: list, force: bool = False) -> object:
    """JSON-ready value; appends True to `measured` for every measured float (rounded to `digits` digits)."""
    if hasattr(value, "item") and getattr(value, "ndim", 1) == 0:  # numpy / torch scalars
        value = value.item()
    if isinstance(value, bool) or value is None or isinstance(value, (int, str)):
        return value
    if isinstance(value, Fraction):
        return _exact_float(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        if _short(value) and not force:
            return value
        measured.append(True)
        return float(f"{value:.{digits}g}")
    if isinstance(value, dict):
        return {str(k): _plain(v, digits, measured, force) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v, digits, measured, force) for v in value]
    if hasattr(value, "tolist"):
        return _plain(value.tolist(), digits, measured, force)
    raise TypeError(f"record: cannot store a {type(value).__name__}")


def payload(name: str, value, unit: str = "", digits: int | None = None, rtol: float | None = None,
            atol: float | None = None) -> dict:
    """The MIME payload `record` displays: name, JSON value, unit, and the tolerance of measured values.
    Giving `digits`, `rtol` or `atol` declares every float of the value measured, short decimals included."""
    force = not (digits is None and rtol is None and atol is None)
    digits = DIGITS if digits is None else digits
    rtol = RTOL if rtol is None else rtol
    atol = 0.0 if atol is None else atol
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"record: result names are identifiers, got {name!r}")
    if isinstance(digits, bool) or not isinstance(digits, int) or not 1 <= digits <= 17:
        raise ValueError(f"record: digits must be an integer in [1, 17], got {digits!r}")
    for k, v in (("rtol", rtol), ("atol", atol)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < math.inf:
            raise ValueError(f"record: {k} must be a finite number >= 0, got {v!r}")
    measured: list = []
    out = {"name": name, "value": _plain(value, digits, measured, force), "unit": unit}
    if measured:
        out.update(digits=digits, rtol=float(rtol), atol=float(atol))
    return out


def record(name: str, value, unit: str = "", digits: int | None = None, rtol: float | None = None,
           atol: float | None = None, brief: bool = False):
    """Record a named result (shown in the notebook, collected by `kvlab run`). Returns the stored value.

    Measured floats are kept to `digits` significant digits (DIGITS) and compared across machines within
    `rtol` (RTOL, relative) or `atol` (absolute); exact values (ints, strings, Fractions, short decimals)
    exactly. Giving any of the three declares every float of `value` measured. `brief`: a dict or list that a
    table already shows is written as one line naming how many values were recorded, not as raw Python (the
    payload, which `kvlab run` and nbval read, is the same)."""
    p = payload(name, value, unit, digits, rtol, atol)
    v = p["value"]
    _SESSION[name] = v
    if brief and isinstance(v, (dict, list)):
        text = f"{name}: {len(v):,} values recorded"
    elif isinstance(v, int) and not isinstance(v, bool):
        text = f"{name} = {v:,}"
    else:
        text = f"{name} = {v!r}"
    bundle = {MIME: p, "text/plain": text + (f" {unit}" if unit else "")}
    try:
        from IPython import get_ipython
        from IPython.display import display
        if get_ipython() is not None:
            display(bundle, raw=True)
            return v
    except ImportError:
        pass
    print(bundle["text/plain"])
    return v


def recorded() -> dict[str, object]:
    """Results recorded in this process so far."""
    return dict(_SESSION)


def read_results(notebook: str | Path, partial: bool = False) -> dict[str, object]:
    """The results recorded in an executed notebook's outputs, by name (last one wins). A notebook whose run was
    interrupted (kvlab.nb.runner marks it) holds partial results: refused unless `partial`."""
    nb = json.loads(Path(notebook).read_text())
    status = nb.get("metadata", {}).get("kvlab", {}).get("status")
    if status == "interrupted" and not partial:
        raise ParameterError(f"{notebook}: this notebook's run was interrupted; its results are partial "
                             "(read_results(..., partial=True) reads them anyway)")
    out = {}
    for cell in nb.get("cells", []):
        for o in cell.get("outputs", []) or []:
            data = o.get("data", {})
            if MIME in data:
                r = data[MIME]
                out[r["name"]] = r["value"]
    return out


def read_tolerances(notebook: str | Path) -> dict[str, tuple[float, float]]:
    """(rtol, atol) of each measured result in an executed notebook; exact results are absent."""
    nb = json.loads(Path(notebook).read_text())
    out = {}
    for cell in nb.get("cells", []):
        for o in cell.get("outputs", []) or []:
            r = o.get("data", {}).get(MIME)
            if r and "rtol" in r:
                out[r["name"]] = (r["rtol"], r["atol"])
    return out
