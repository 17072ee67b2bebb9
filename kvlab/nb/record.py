"""Named results: notebooks record their key numbers; batch runs collect them from the outputs.

`record(name, value)` displays the value as an output with its own MIME type, so the result
travels inside the executed notebook (papermill output, nbval comparison) and `read_results`
gets it back without re-running anything.
"""
from __future__ import annotations

import json
import math
from fractions import Fraction
from pathlib import Path

from ..errors import ParameterError

MIME = "application/vnd.kvlab.result+json"
INTERRUPTED_TAG = "kvlab-interrupted"  # the banner cell of a notebook whose batch run was cut short
_SESSION: dict[str, object] = {}  # results recorded in this process


def _plain(value, digits: int):
    """JSON-ready value. Floats with a short exact decimal form (3514.25, 5031.4375) are kept; other floats are
    rounded to `digits` significant digits, so reruns on another CPU (float32 noise) compare equal."""
    if isinstance(value, Fraction):
        value = int(value) if value.denominator == 1 else float(value)
    if hasattr(value, "item") and getattr(value, "ndim", 1) == 0:  # numpy / torch scalars
        value = value.item()
    if isinstance(value, bool) or value is None or isinstance(value, (int, str)):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        mantissa = repr(value).split("e")[0].replace("-", "").replace(".", "").lstrip("0")
        return value if len(mantissa) <= 10 else float(f"{value:.{digits}g}")
    if isinstance(value, dict):
        return {str(k): _plain(v, digits) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v, digits) for v in value]
    if hasattr(value, "tolist"):
        return _plain(value.tolist(), digits)
    raise TypeError(f"record: cannot store a {type(value).__name__}")


def record(name: str, value, unit: str = "", digits: int = 6):
    """Record a named result (shown in the notebook, collected by `kvlab run`). Returns the stored value."""
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"record: result names are identifiers, got {name!r}")
    v = _plain(value, digits)
    _SESSION[name] = v
    text = f"{name} = {v:,}" if isinstance(v, int) and not isinstance(v, bool) else f"{name} = {v!r}"
    bundle = {MIME: {"name": name, "value": v, "unit": unit}, "text/plain": text + (f" {unit}" if unit else "")}
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
