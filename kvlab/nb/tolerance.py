"""Notebook outputs compared as their numbers deserve: exact figures exactly, measured floats within a tolerance.

A float that comes out of BLAS or SIMD code differs in its last bits between CPUs (AVX2 / AVX-512), MKL code
paths (MKL_CBWR) and thread counts; even seeded `torch.randn` draws other last bits under another kernel set.
A stored output and a rerun elsewhere then differ from the 4th to the 7th significant digit. Two outputs
compare as equal here when they are the same text apart from number literals, where
- an integer literal (890, 147,456, -65) must be the same string: bytes, counts and bit patterns stay exact,
  so a stored 890 changed to 891 still fails, in every notebook;
- a float literal (0.09268, 4.1e-07) may differ by `rtol` relative or `atol` absolute, plus half a unit in the
  last digit each side shows (0.1235 on one CPU and 0.1234 on another are roundings of nearly equal numbers).
  Digits glued to a word (v4.1, fp8_e4m3, 16B) are text, compared exactly. Whitespace runs compare as one
  space, so a table column that widened by a digit still matches.
Where the tolerance comes from:
- a recorded result (kvlab.nb.record) carries its own: measured floats have `rtol` / `atol` / `digits` in the
  payload, exact results have none and compare exactly (JSON value and text alike);
- any other output uses its notebook's: metadata {"kvlab": {"float_rtol": r, "float_atol": a}} declares that
  the notebook shows floats computed by torch or BLAS, and how far apart two CPUs may put them; a notebook
  without it is compared exactly (its floats come from exact byte math or IEEE-deterministic Python); a cell's
  own metadata of the same form overrides its notebook's for that cell's outputs.
"""
from __future__ import annotations

import copy
import math
import re
from dataclasses import dataclass

RTOL = 5e-3  # default tolerance of a recorded measured float: 4x the largest spread seen in notebook 03 (1.2e-3)
MIME = "application/vnd.kvlab.result+json"  # kvlab.nb.record's payload

# A number not glued to a word: optional sign, digits (thousands commas allowed), fraction, exponent.
_NUMBER = re.compile(r"(?<![\w.])([-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?|[-+]?\.\d+(?:[eE][-+]?\d+)?)"
                     r"(?!\d|\.\d)")
_SPACE = re.compile(r"\s+")


@dataclass(frozen=True)
class Tolerance:
    """How far two floats may be apart and still match (integers never get any)."""

    rtol: float = 0.0  # relative to the larger magnitude
    atol: float = 0.0  # absolute
    rounding: bool = False  # also allow half a unit in the last shown digit (or `digits` place) each side
    digits: int | None = None  # significant digits JSON floats were rounded to (recorded results)

    @property
    def exact(self) -> bool:
        return not (self.rtol or self.atol or self.rounding)


EXACT = Tolerance()


def notebook_tolerance(metadata) -> Tolerance:
    """The tolerance a notebook declares for its plain outputs (metadata kvlab.float_rtol / float_atol)."""
    kv = (metadata or {}).get("kvlab") or {}
    rtol, atol = float(kv.get("float_rtol", 0.0)), float(kv.get("float_atol", 0.0))
    return Tolerance(rtol, atol, rounding=True) if (rtol or atol) else EXACT


def is_float_literal(token: str) -> bool:
    """A number literal with a fraction or an exponent (the only kind compared with a tolerance)."""
    return "." in token or "e" in token.lower()


def _shown_unit(token: str) -> float:
    """One unit in the last digit a float literal shows: 0.0927 -> 1e-4, 4.1e-07 -> 1e-8, 3,514.25 -> 0.01."""
    mantissa, _, exponent = token.lower().partition("e")
    return 10.0 ** (int(exponent or 0) - len(mantissa.partition(".")[2]))


def _digit_unit(x: float, digits: int) -> float:
    """One unit in the `digits`-th significant digit of x."""
    return 10.0 ** (math.floor(math.log10(abs(x))) - digits + 1) if x else 0.0


def close_floats(a: float, b: float, tol: Tolerance, slack: float = 0.0) -> bool:
    """|a - b| within tol.rtol (relative to the larger), tol.atol and `slack` (the rounding both carry)."""
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    if math.isinf(a) or math.isinf(b):
        return a == b
    return abs(a - b) <= tol.rtol * max(abs(a), abs(b)) + tol.atol + slack


def close_text(ref: str, test: str, tol: Tolerance) -> bool:
    """Same text apart from float literals within `tol` (integers exact; whitespace runs equal)."""
    if ref == test:
        return True
    if tol.exact:
        return False
    r, t = _NUMBER.split(ref), _NUMBER.split(test)
    if len(r) != len(t):
        return False
    for i, (a, b) in enumerate(zip(r, t)):
        if i % 2 == 0:  # the text between numbers
            if _SPACE.sub(" ", a) != _SPACE.sub(" ", b):
                return False
        elif a != b:
            if not (is_float_literal(a) and is_float_literal(b)):
                return False  # an integer changed: exact figures never get a tolerance
            slack = (_shown_unit(a) + _shown_unit(b)) / 2 if tol.rounding else 0.0
            if not close_floats(float(a.replace(",", "")), float(b.replace(",", "")), tol, slack):
                return False
    return True


def close_value(ref, test, tol: Tolerance) -> bool:
    """JSON values (recorded results): ints, bools and strings' integers exact, floats within `tol`."""
    if isinstance(ref, bool) or isinstance(test, bool) or ref is None or test is None:
        return type(ref) is type(test) and ref == test
    if isinstance(ref, int) and isinstance(test, int):
        return ref == test
    if isinstance(ref, (int, float)) and isinstance(test, (int, float)):
        if isinstance(ref, int) or isinstance(test, int) or tol.exact:
            return ref == test
        slack = 0.0
        if tol.rounding and tol.digits:
            slack = (_digit_unit(ref, tol.digits) + _digit_unit(test, tol.digits)) / 2
        return close_floats(ref, test, tol, slack)
    if isinstance(ref, str) and isinstance(test, str):
        return close_text(ref, test, tol)
    if isinstance(ref, dict) and isinstance(test, dict):
        return ref.keys() == test.keys() and all(close_value(ref[k], test[k], tol) for k in ref)
    if isinstance(ref, list) and isinstance(test, list):
        return len(ref) == len(test) and all(close_value(a, b, tol) for a, b in zip(ref, test))
    return ref == test


def result_tolerance(payload: dict) -> Tolerance:
    """A recorded result's own tolerance: measured values carry rtol / atol / digits, exact ones nothing."""
    if "rtol" not in payload and "atol" not in payload:
        return EXACT
    return Tolerance(float(payload.get("rtol", 0.0)), float(payload.get("atol", 0.0)), rounding=True,
                     digits=payload.get("digits"))


def close_result(ref: dict, test: dict) -> bool:
    """Two recorded-result payloads: same name and unit, values within the stored (ref) result's tolerance."""
    if not (isinstance(ref, dict) and isinstance(test, dict)):
        return ref == test
    return (ref.get("name") == test.get("name") and ref.get("unit") == test.get("unit")
            and close_value(ref.get("value"), test.get("value"), result_tolerance(ref)))


def _values(outputs, default: Tolerance):
    """(key, holder, field, tolerance) for every compared value of a cell's outputs, in output order."""
    for out in outputs:
        if out.get("output_type") == "stream":
            yield "stream:" + out.get("name", ""), out, "text", default
            continue
        data = out.get("data") or {}
        payload = data.get(MIME)
        tol = result_tolerance(payload) if isinstance(payload, dict) else default
        for key in data:
            yield key, data, key, tol


def tolerate(test: list, ref: list, default: Tolerance = EXACT, sanitize=lambda s: s) -> list:
    """A copy of a cell's `test` outputs in which every value that matches its counterpart in `ref` within
    tolerance is replaced by that counterpart, so an exact comparison afterwards (nbval's) fails only on real
    differences. Values pair up per key (MIME type or stream name) in order, as nbval pairs them; `default`
    is the tolerance of outputs that are not recorded results."""
    test = copy.deepcopy(list(test))
    refs: dict[str, list] = {}
    for key, holder, field, tol in _values(ref, default):
        refs.setdefault(key, []).append((holder[field], tol))
    seen: dict[str, int] = {}
    for key, holder, field, _ in _values(test, default):
        i = seen[key] = seen.get(key, -1) + 1
        if i >= len(refs.get(key, ())):
            continue
        want, tol = refs[key][i]
        got = holder[field]
        if key == MIME:
            ok = close_result(want, got)
        else:
            a = "".join(want) if isinstance(want, list) else want
            b = "".join(got) if isinstance(got, list) else got
            ok = close_text(sanitize(a), sanitize(b), tol) if isinstance(a, str) and isinstance(b, str) \
                else close_value(a, b, tol)
        if ok:
            holder[field] = want
    return test
