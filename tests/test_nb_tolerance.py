"""Notebook outputs compared across CPUs: integers exact, floats within tolerance, and nbval wired to it.

The end-to-end tests run nbval with the repository's own configuration (pyproject addopts: sanitizers and
kvlab.nb.nbval_plugin) on edited copies of notebooks, as `make test` would.
"""
import json
import re
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from kvlab.nb.record import payload
from kvlab.nb.tolerance import EXACT, MIME, RTOL, Tolerance, close_result, close_text, notebook_tolerance, tolerate

ROOT = Path(__file__).resolve().parent.parent
LOOSE = Tolerance(rtol=5e-3, atol=1e-6, rounding=True)  # notebook 04's declared tolerance


@pytest.mark.parametrize("ref,test", [
    ("890 B per token", "891 B per token"),
    ("147,456 B", "147,457 B"),
    ("entries: [4, 8, 12]", "entries: [4, 8, 13]"),
    ("-65 B", "-66 B"),
    ("deepseek-v4.1-flash", "deepseek-v4.2-flash"),  # digits glued to words are text
    ("ratio 437.2x", "ratio 437.2y"),
])
def test_integers_and_text_never_get_a_tolerance(ref, test):
    assert not close_text(ref, test, LOOSE)
    assert not close_text(ref, test, Tolerance(rtol=1.0, atol=1e9, rounding=True))


@pytest.mark.parametrize("ref,test,ok", [
    ("err 0.00166687", "err 0.0016669", True),  # the 6th digit, as issue 9 saw it
    ("55.6323 dB", "55.6322 dB", True),
    ("0.1235", "0.1234", True),  # a rounding boundary: one unit in the last shown digit
    ("0.421", "0.420", True),
    ("0.1235", "0.1250", False),  # 1.2%: a real difference
    ("kl 7.061228e-07", "kl 7.566753e-07", True),  # float32's noise floor: atol
    ("NaN 0.5", "NaN 0.5", True),
    ("0.5  1", "0.5 1", True),  # a column one character wider
])
def test_floats_within_tolerance(ref, test, ok):
    assert close_text(ref, test, LOOSE) is ok


def test_a_notebook_without_declared_tolerance_compares_exactly():
    assert notebook_tolerance({}) is EXACT
    assert not close_text("55.6323", "55.6322", EXACT)
    assert notebook_tolerance({"kvlab": {"float_rtol": 5e-3}}) == Tolerance(5e-3, 0.0, rounding=True)


def test_record_keeps_exact_values_exact():
    for v in (890, Fraction(14057, 4), 3514.25, 16.0, "holds", True, {"main": 288, "index": 68}, [0, 0, 0]):
        p = payload("x", v)
        assert "rtol" not in p, v
    assert payload("x", Fraction(389120, 437))["value"] == 890.435  # exact, shown to 6 significant digits
    assert not close_result(payload("x", 890), payload("x", 891))
    assert not close_result(payload("x", 3514.25), payload("x", 3514.26))


def test_record_rounds_measured_floats_and_carries_their_tolerance():
    p = payload("err", 0.0016668712345)
    assert p["value"] == 0.001667 and p["digits"] == 4 and p["rtol"] == RTOL and p["atol"] == 0.0
    assert payload("err", np.float32(0.1))["value"] == 0.1 and "rtol" in payload("err", np.float32(0.1))
    assert payload("kl", 0.3947, rtol=0.02)["rtol"] == 0.02
    # another CPU: the 4th digit on either side of a boundary, the 3rd digit within rtol
    assert close_result(payload("err", 0.0016668712345), payload("err", 0.00166649))
    assert close_result(payload("e", {"a": 0.12345000123456, "n": 7}), payload("e", {"a": 0.1234499987654, "n": 7}))
    assert not close_result(payload("e", {"a": 0.12345000123456, "n": 7}), payload("e", {"a": 0.12345000123456, "n": 8}))
    assert not close_result(payload("err", 0.0016668712345), payload("err", 0.00170))
    assert not close_result(payload("err", 0.5, ), payload("other", 0.5))
    floor = payload("gap", 4.11e-07, digits=1, atol=1e-5)
    assert floor["value"] == 4e-07 and close_result(floor, payload("gap", 5.06e-07, digits=1, atol=1e-5))


@pytest.mark.parametrize("bad", [dict(digits=0), dict(rtol=-1.0), dict(atol=float("nan")), dict(rtol=True)])
def test_record_refuses_bad_tolerances(bad):
    with pytest.raises(ValueError):
        payload("x", 0.1, **bad)


def test_tolerate_pairs_outputs_by_kind_and_uses_each_results_own_tolerance():
    def out(value, text, **kw):
        return {"output_type": "display_data", "data": {MIME: payload("r", value, **kw), "text/plain": text}}

    ref = [out(0.03941, "r = 0.03941", rtol=0.02), {"output_type": "stream", "name": "stdout", "text": "n = 890\n"}]
    test = [out(0.03961, "r = 0.03961", rtol=0.02), {"output_type": "stream", "name": "stdout", "text": "n = 890\n"}]
    assert tolerate(test, ref) == ref  # the 0.5% KL spread is within this result's rtol
    test[1]["text"] = "n = 891\n"
    assert tolerate(test, ref)[1]["text"] == "n = 891\n"  # left for nbval to report


def test_sanitizers_never_touch_numbers():
    """notebooks/sanitize.cfg only masks addresses and timings: no pattern may match a bare number."""
    patterns = re.findall(r"^regex:\s*(.+)$", (ROOT / "notebooks" / "sanitize.cfg").read_text(), re.M)
    assert patterns
    for text in ("890", "147,456", "891 B per token", "0.0927", "3514.25", "1e-05", "2,990,080 B"):
        assert not any(re.search(p, text) for p in patterns), text


# --- end to end: nbval with the repository's configuration ----------------------------------------
def _nbval(path: Path):
    """`make test`'s nbval on one notebook (pyproject addopts: sanitizers, kvlab.nb.nbval_plugin)."""
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-c", str(ROOT / "pyproject.toml"), "--rootdir",
                           str(ROOT), str(path)], capture_output=True, text=True, cwd=ROOT)


def _edit_outputs(nb: dict, edit) -> None:
    for cell in nb["cells"]:
        for out in cell.get("outputs", []):
            if "text" in out:
                out["text"] = edit("".join(out["text"]) if isinstance(out["text"], list) else out["text"])
            for k, v in out.get("data", {}).items():
                if k.startswith("text/"):
                    out["data"][k] = edit("".join(v) if isinstance(v, list) else v)


def _nbval_each(paths: list[Path]) -> tuple[dict[str, bool], str]:
    """`make test`'s nbval (pyproject addopts: sanitizers, kvlab.nb.nbval_plugin) over several notebooks in one
    pytest run: {notebook name: every cell passed}, and the run's output."""
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rA", "-c", str(ROOT / "pyproject.toml"), "--rootdir",
                        str(paths[0].parent), *map(str, paths)], capture_output=True, text=True, cwd=ROOT)
    failed = set(re.findall(r"^FAILED \S*?([^/\s]+\.ipynb)::", p.stdout, re.M))
    passed = set(re.findall(r"^PASSED \S*?([^/\s]+\.ipynb)::", p.stdout, re.M))
    assert passed | failed == {x.name for x in paths}, p.stdout[-3000:]  # every notebook ran
    return {x.name: x.name not in failed for x in paths}, p.stdout


def _tampered(src: Path, old: str, new: str, dest: Path, least: int) -> Path:
    nb = json.loads(src.read_text())
    hits = []
    _edit_outputs(nb, lambda s: (hits.append(s.count(old)) or s.replace(old, new)))
    assert sum(hits) >= least, (src.name, old, hits)
    dest.write_text(json.dumps(nb))
    return dest


def _float_notebook(path: Path, stored: str, declared: bool, cell_rtol: float | None = None) -> Path:
    """One cell printing 0.0016668712 and 890, its stored output `stored`; `declared`: a float tolerance;
    `cell_rtol`: the cell's own (overriding the notebook's)."""
    nb = {"nbformat": 4, "nbformat_minor": 5, "metadata": {"kernelspec": {"name": "kvlab", "display_name": "kvlab",
                                                                         "language": "python"}},
          "cells": [{"cell_type": "code", "execution_count": 1, "id": "a", "metadata": {},
                     "source": "print(0.0016668712, 890)",
                     "outputs": [{"output_type": "stream", "name": "stdout", "text": stored + "\n"}]}]}
    if declared:
        nb["metadata"]["kvlab"] = {"float_rtol": 5e-3}
    if cell_rtol is not None:
        nb["cells"][0]["metadata"]["kvlab"] = {"float_rtol": cell_rtol}
    path.write_text(json.dumps(nb))
    return path


@pytest.mark.slow
def test_nbval_fails_on_a_changed_exact_figure_and_tolerates_float_noise_only_where_declared(tmp_path):
    """One nbval run over edited copies: a stored 890 made 891 in notebook 02 and a 147,456 made 147,457 in notebook
    01 fail (exact figures stay exact); a stored float that differs from the rerun in its 6th digit passes in a
    notebook that declares a tolerance and fails in one that does not; a changed stored integer fails in both.
    (The unedited notebooks pass in the suite's own nbval run over notebooks/.)"""
    nbs = ROOT / "notebooks"
    cases = {  # notebook -> passes?
        _tampered(nbs / "02_deepseek_890_bytes.ipynb", "890 B", "891 B", tmp_path / "t890.ipynb", 3): False,
        _tampered(nbs / "01_kv_bytes_per_token.ipynb", "147,456", "147,457", tmp_path / "t147.ipynb", 2): False,
        _float_notebook(tmp_path / "exact.ipynb", "0.0016668712 890", declared=False): True,
        _float_notebook(tmp_path / "noise_declared.ipynb", "0.0016669 890", declared=True): True,
        _float_notebook(tmp_path / "noise_undeclared.ipynb", "0.0016669 890", declared=False): False,
        _float_notebook(tmp_path / "int_changed.ipynb", "0.0016668712 891", declared=True): False,
        _float_notebook(tmp_path / "cell_wider.ipynb", "0.00169 890", declared=True, cell_rtol=0.02): True,
        _float_notebook(tmp_path / "cell_narrower.ipynb", "0.0016669 890", declared=True, cell_rtol=0.0): False,
        _float_notebook(tmp_path / "notebook_only.ipynb", "0.00169 890", declared=True): False,
    }
    got, out = _nbval_each(list(cases))
    assert got == {p.name: ok for p, ok in cases.items()}, out[-3000:]
    assert "Cell outputs differ" in out
