"""Notebook 03 (quantizers) runs through papermill with small parameters and records its results."""
import papermill as pm
import pytest

from kvlab.errors import ParameterError
from kvlab.nb.quantizers import QuantizersParams
from nbutil import run_notebook


@pytest.mark.slow
def test_nb_03_small(tmp_path):
    r = run_notebook("03", tmp_path, shape=[2, 64, 64], distributions=["gaussian", "student_t"],
                     formats=["fp8_e4m3", "nvfp4", "mxfp4", "int4"], seed=1, models=["llama-3.1-8b"])
    assert r["bits_nvfp4"] == 4.5 and r["bits_mxfp4"] == 4.25 and r["bits_int4"] == 5.0
    assert r["bytes_per_token_llama_3_1_8b_nvfp4"] == 36864  # 32 layers x 2 x 8 heads x 72 B
    assert r["sqnr_nvfp4_gaussian"] == pytest.approx(20.4, abs=0.5)  # measured floats: explicit tolerances
    assert r["sqnr_fp8_e4m3_gaussian"] > r["sqnr_nvfp4_gaussian"] > r["sqnr_mxfp4_gaussian"]
    assert 0 < r["attn_err_fp8_e4m3_student_t"] < r["attn_err_nvfp4_student_t"] < 1


@pytest.mark.parametrize("kw,match", [
    ({"shape": [2, 64]}, "parameter shape"), ({"distributions": ["uniform"]}, "parameter distributions"),
    ({"formats": ["fp5"]}, "parameter formats"), ({"shape": [2, 40, 64]}, "parameter shape"),
    ({"seed": -1}, "parameter seed"), ({"models": ["nope"]}, "parameter models"), ({"formats": "int4"}, "parameter formats"),
    ({"shape": [2, 64.0, 64]}, "parameter shape"),
])
def test_nb_03_bad_parameters(kw, match):
    p = dict(shape=[2, 64, 64], distributions=["gaussian"], formats=["int4"], seed=0, models=[])
    p.update(kw)
    with pytest.raises(ParameterError, match=match):
        QuantizersParams.of(p)


def test_nb_03_bad_parameter_stops_in_the_first_cells(tmp_path):
    with pytest.raises(pm.PapermillExecutionError, match="parameter shape must be"):
        run_notebook("03", tmp_path, shape=[2, 64])
