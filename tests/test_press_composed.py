"""kvlab.hf.presses.Composed, the one composition type: a press composed with a format holds, keeps and computes
exactly what make_cache's keywords give (bytes, kept positions and logits bit-equal), a setting string parses to it,
two presses in sequence are refused in one line, and every list of press names reads the registry (PRESSES)."""
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from kvlab.errors import ParameterError
from kvlab.hf import make_cache
from kvlab.hf.presses import PRESSES, WRAPPERS, Budget, Composed, compose, get_press, make_plan
from kvlab.hf.quality import press_settings

pytestmark = pytest.mark.usefixtures("one_thread")
ROOT = Path(__file__).resolve().parents[1]
CHECKPOINT = ROOT / "data" / "checkpoints" / "qwen3-tiny"


@pytest.fixture(scope="module")
def model():
    return AutoModelForCausalLM.from_pretrained(CHECKPOINT, dtype=torch.bfloat16, attn_implementation="sdpa").eval()


def run(model, cache, n=110, context=100):  # a context longer than SnapKV's window of 64
    x = torch.randint(32, 127, (1, n), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        model(x[:, :context], past_key_values=cache, use_cache=True)
        return model(x[:, context:], past_key_values=cache, use_cache=True).logits


@pytest.mark.parametrize("text, keywords", [
    ("snapkv keep 1/4 nvfp4", dict(press="snapkv", keep=0.25, kv_format="nvfp4")),
    ("knorm keep 20 int4", dict(press="knorm", keep=20, kv_format="int4", residual=16)),
])
def test_composed_is_the_keywords(model, text, keywords):
    composed = Composed.parse(text)
    if keywords.get("residual"):
        composed = Composed(composed.press, composed.budget, composed.kv_format, keywords["residual"], name=text)
    assert composed.label() == text
    a, b = make_cache(model, press=composed), make_cache(model, **keywords)
    la, lb = run(model, a), run(model, b)
    assert torch.equal(la, lb) and a.nbytes == b.nbytes == a.predicted_bytes() and a.kv_format == b.kv_format
    for x, y in zip(a.layers, b.layers):
        assert torch.equal(x.positions, y.positions)


def test_settings_compose_through_it():
    s, = press_settings(["snapkv keep 1/4 nvfp4"])
    assert isinstance(s.options["press"], type(get_press("snapkv"))) and s.options["kv_format"] == "nvfp4"
    c = compose("snapkv", keep=0.25, kv_format="nvfp4")
    assert isinstance(c, Composed) and c.label() == "snapkv keep 0.25 nvfp4"
    assert make_plan(c).label() == make_plan("snapkv", 0.25).label() == "snapkv keep 0.25"
    assert compose(c) is c


@pytest.mark.parametrize("call, match", [
    (lambda: press_settings(["snapkv+knorm keep 1/4"]), r"presses snapkv \+ knorm in sequence: .* give one press"),
    (lambda: make_plan("snapkv+knorm", 0.25), r"presses snapkv \+ knorm in sequence"),
    (lambda: Composed((get_press("snapkv"), get_press("knorm")), Budget(0.25)), r"in sequence"),
    (lambda: make_cache(CHECKPOINT_CONFIG(), press=compose("snapkv", 0.25), keep=0.5), r"give it without keep"),
    (lambda: make_cache(CHECKPOINT_CONFIG(), press=compose("snapkv", 0.25), kv_format="nvfp4"), "without kv_format"),
    (lambda: Composed("snapkv", Budget(0.25)), "Composed takes a Press"),
    (lambda: Composed(get_press("snapkv"), Budget(0.25), mode="later"), "press mode"),
])
def test_refused_in_one_line(call, match):
    with pytest.raises(ParameterError, match=match) as e:
        call()
    assert "\n" not in str(e.value)


def CHECKPOINT_CONFIG():
    from transformers import AutoConfig
    return AutoConfig.from_pretrained(CHECKPOINT)


def test_press_lists_read_the_registry():
    """The CLI's help, the kvpress oracle's cases and the benchmarks' presses come from PRESSES."""
    from kvlab.cli.eval import _presses
    assert _presses()[0] == list(PRESSES)
    sys.path.insert(0, str(ROOT / "tests"))
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import kvpress_oracle
        import kvpress_side
        from bench_presses import PRESSES as BENCHED
    finally:
        sys.path.remove(str(ROOT / "tests"))
        sys.path.remove(str(ROOT / "benchmarks"))
    assert list(kvpress_oracle.CASES) == list(PRESSES) and kvpress_oracle.WRAPPED == set(WRAPPERS)
    assert set(kvpress_side.CLASSES) <= set(PRESSES) and BENCHED == [n for n in PRESSES if n in kvpress_side.CLASSES]
