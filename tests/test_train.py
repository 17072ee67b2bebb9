"""kvlab.train's models and committed checkpoints: loading, bytes, quality against an untrained model, and a short
retrain that reproduces the start of each committed loss curve (within a tolerance: floats differ between CPUs)."""
import json
from dataclasses import replace
from fractions import Fraction

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache

from kvlab.cli import main
from kvlab.errors import ParameterError
from kvlab.layout import build_layout
from kvlab.train import checkpoint_dir, evaluate, load_corpus, load_record, retrain, train
from kvlab.train.loop import TrainConfig, step_batch
from kvlab.train.models import build_model, count_parameters
from kvlab.toy.v41 import KvlabV41ForCausalLM, plan_of, to_stack

CHECKPOINTS = {"qwen3-tiny": ("dense", "Qwen3ForCausalLM"), "deepseek-v3-tiny": ("mla", "DeepseekV3ForCausalLM"),
               "kvlab-v41-tiny": ("v41", "KvlabV41ForCausalLM")}
RETRAIN_STEPS = 12  # a short rerun of each committed recipe
CURVE_RTOL = 0.02  # relative tolerance on its losses (thread counts and CPUs change the last digits)

pytestmark = pytest.mark.usefixtures("one_thread")


def load(name, dtype=torch.float32):
    return AutoModelForCausalLM.from_pretrained(checkpoint_dir(name), dtype=dtype)


@pytest.fixture(scope="module")
def corpus():
    return load_corpus()


@pytest.mark.parametrize("name", CHECKPOINTS)
def test_checkpoint_loads_with_from_pretrained(name):
    arch, cls = CHECKPOINTS[name]
    path = checkpoint_dir(name)
    model = load(name)
    cfg, curve, record = load_record(path)
    assert type(model).__name__ == cls and cfg.arch == arch and cfg.name == name
    assert record["parameters"] == count_parameters(model)
    assert record["corpus"]["python"] and len(record["corpus"]["sha256"]) == 64
    assert record["steps_run"] == cfg.steps == len(curve["text_loss"]) and record["tokens"] == cfg.tokens
    assert (path / "model.safetensors").stat().st_size < 3_000_000  # small enough to commit
    tok = AutoTokenizer.from_pretrained(path)
    assert tok("def f():")["input_ids"] == list(b"def f():")


from trained import AWAITING_RETRAIN  # noqa: E402  (checkpoints still on the earlier recipe)


def test_same_budget_for_every_model():
    """Every checkpoint on today's recipe shares one budget (architecture and evaluation schedule aside)."""
    from kvlab.train.records import current_recipe
    recipes = [load_record(checkpoint_dir(n))[0] for n in CHECKPOINTS if n not in AWAITING_RETRAIN]
    # the architecture and the evaluation schedule (what is recorded, not what is trained) may differ
    budgets = {json.dumps({k: v for k, v in c.to_dict().items() if k not in ("arch", "eval_every")}, sort_keys=True)
               for c in recipes}
    assert len(budgets) == 1
    assert all(current_recipe(c.to_dict()) for c in recipes)


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.xfail(reason=AWAITING_RETRAIN[n], strict=True))
                                  if n in AWAITING_RETRAIN else n for n in CHECKPOINTS])
def test_every_checkpoint_is_on_todays_recipe(name):
    from kvlab.train.records import current_recipe
    assert current_recipe(load_record(checkpoint_dir(name))[0].to_dict())


@pytest.mark.parametrize("name", CHECKPOINTS)
def test_kvlab_bytes_equals_what_the_cache_holds(name, capsys):
    tokens = 40
    assert main(["bytes", str(checkpoint_dir(name)), "--tokens", str(tokens), "--json"]) == 0
    predicted = json.loads(capsys.readouterr().out)
    model = load(name, torch.bfloat16)
    ids = torch.tensor([list(b"for i in range(10):\n    print(i * i)  # ok\n")[:tokens]])
    if CHECKPOINTS[name][0] == "v41":
        # the Stack holds the storage layout's entry formats: NVFP4 main entries, MXFP4 index keys
        stack = to_stack(model, {"main": "nvfp4", "index": "mxfp4"})
        stack.prefill(ids)
        held = stack.cache_bytes()
        assert held["main"] + held["index"] == predicted["growing_bytes"] > 0
    else:
        cache = DynamicCache(config=model.config)
        with torch.no_grad():
            model(input_ids=ids, past_key_values=cache, use_cache=True)
        held = sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values))
        assert held == predicted["session_bytes"] == tokens * predicted["bytes_per_token"]


@pytest.mark.parametrize("name", CHECKPOINTS)
def test_trained_beats_untrained(name, corpus):
    arch = CHECKPOINTS[name][0]
    kw = dict(windows=4, samples=16, length=256, batch=4)
    trained, untrained = evaluate(load(name), corpus, **kw), evaluate(build_model(arch, seed=1), corpus, **kw)
    assert trained["heldout_loss"] < untrained["heldout_loss"] - 2.0  # nats per byte; untrained ~ ln 256 = 5.5
    gains = {t: trained["tasks"][t] - untrained["tasks"][t] for t in trained["tasks"]}
    assert max(gains.values()) > 0.05, gains  # answers in the answer alphabet, where the untrained model has none


class _Copier(torch.nn.Module):
    """An oracle with an induction head and nothing else: it predicts what followed the latest earlier occurrence
    of the current two tokens, and is uniform where there is none."""

    def forward(self, input_ids, use_cache=None):
        b, t = input_ids.shape
        logits = torch.zeros(b, t, 256)
        for i in range(b):
            x, seen = input_ids[i].tolist(), {}
            for j in range(1, t):
                if (x[j - 1], x[j]) in seen:
                    logits[i, j, x[seen[x[j - 1], x[j]] + 1]] = 10.0
                if j + 1 < t:
                    seen[x[j - 1], x[j]] = j
        return type("Out", (), {"logits": logits})()


def test_copy_probe_plants_strings_at_random_offsets_lengths_and_gaps(corpus):
    from kvlab.train.probe import PRINTABLE, copy_rows
    ids, plans = copy_rows(corpus, "heldout", seed=3, n=16, length=256)
    again, _ = copy_rows(corpus, "heldout", seed=3, n=16, length=256)
    assert ids.shape == (16, 256) and torch.equal(ids, again)
    for row, p in zip(ids, plans):
        first, second = row[p.offset:p.offset + p.length], row[p.second:p.second + p.length]
        assert torch.equal(first, second) and p.second + p.length <= 256 and p.offset >= 1
        assert all(chr(c) in PRINTABLE for c in first.tolist())
    # no fixed offset, length or distance: a positional shortcut cannot pass
    assert len({p.offset for p in plans}) > 8 and len({p.length for p in plans}) > 8
    assert len({p.second - p.offset for p in plans}) > 8


def test_copy_probe_tells_a_copier_from_a_model_that_cannot_look_back(corpus):
    from kvlab.train.probe import copy_probe
    copier = copy_probe(_Copier(), seed=3, n=4, length=256, corpus=corpus)
    assert copier.gain > 4.0 and copier.second < 1.0 and copier.accuracy > 0.85 and copier.first > 5.0
    untrained = copy_probe(build_model("dense", seed=1), seed=3, n=4, length=256, corpus=corpus)
    assert abs(untrained.gain) < 0.1 and untrained.first > 5.0  # ~ ln 256 on both copies
    with pytest.raises(ParameterError):
        copy_probe(_Copier(), length=8, corpus=corpus)
    with pytest.raises(ParameterError):
        copy_probe(_Copier(), length=256, skip=100, corpus=corpus)


@pytest.mark.parametrize("name", CHECKPOINTS)
def test_retrain_reproduces_the_committed_curve(name, corpus):
    cfg, saved, record = load_record(checkpoint_dir(name))
    result, _ = retrain(checkpoint_dir(name), RETRAIN_STEPS)
    got = result.curve
    assert got["step"] == list(range(RETRAIN_STEPS))
    assert got["text_loss"][-1] < got["text_loss"][0] - 0.3  # it learns
    if record["corpus"]["sha256"] != corpus.sha256:
        pytest.skip(f"this Python's stdlib (Python {corpus.python}) is not the corpus the checkpoint was trained on "
                    f"(Python {record['corpus']['python']}): the curve cannot match")
    for key in ("text_loss", "task_loss", "lr"):
        np.testing.assert_allclose(got[key], saved[key][:RETRAIN_STEPS], rtol=CURVE_RTOL, err_msg=key)


# --- the V4.1-like model ------------------------------------------------------------------------------
def test_v41_plan_is_the_layout_of_its_config():
    model = load("kvlab-v41-tiny")
    layout = build_layout(str(checkpoint_dir("kvlab-v41-tiny")))
    assert [p.mode for p in model.plan] == [layer.mode for layer in layout.layers]
    assert {p.mode for p in model.plan} == {"swa", "full", "reuse", "reindex"}
    assert layout.model.family == "dsv41"


def test_v41_is_the_stack_with_trained_weights(corpus):
    """The batched, trainable module and kvlab.attention's cached Stack compute the same logits (float32
    storage), in one prefill and token by token."""
    model = load("kvlab-v41-tiny")
    ids = corpus.windows("heldout", 1, 160, seed=5)
    with torch.no_grad():
        ref = model(input_ids=ids).logits[0]  # [T, V]
    stack = to_stack(model, {"main": "fp32", "index": "fp32", "swa": "fp32"})
    with torch.no_grad():
        stack.reset()
        first = stack.forward(ids[:, :120])[0]
        rest = stack.decode(ids[:, 120:])[0]
    assert torch.allclose(first, ref[:120], atol=1e-4) and torch.allclose(rest, ref[120:], atol=1e-4)


def test_v41_returns_the_indexer_loss():
    model = build_model("v41").train()
    ids = torch.randint(0, 256, (2, 96), generator=torch.Generator().manual_seed(0))
    out = model(input_ids=ids)
    assert out.aux_loss is not None and torch.isfinite(out.aux_loss) and out.aux_loss > 0
    out.aux_loss.backward()
    idx = model.layers[1]
    assert idx.idx_wq.grad is not None and idx.idx_wq.grad.abs().sum() > 0  # the indexer learns from the KL
    assert idx.wq.grad is None  # ... and the KL does not reach the model's attention
    assert isinstance(model, KvlabV41ForCausalLM) and plan_of(model.config) == model.plan
    assert model.eval()(input_ids=ids).aux_loss is None  # evaluation skips it


# --- recipe and errors -----------------------------------------------------------------------------
def test_batches_are_seeded():
    cfg = TrainConfig(steps=4)
    corpus = load_corpus()
    step = cfg.stages[0][0]  # the second stage: rows long enough for tasks
    a, b = step_batch(cfg, corpus, step), step_batch(cfg, corpus, step)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    ids, labels, kind = a
    rows = ids.shape[0]
    assert rows * ids.shape[1] == cfg.batch_tokens and ids.shape[1] == cfg.stages[1][1] >= cfg.task_min_length
    assert int((kind == 2).sum()) == round(rows * cfg.task_fraction)
    assert int((kind == 1).sum()) == round(rows * cfg.copy_fraction)
    dense = kind < 2
    assert (labels[dense] == ids[dense]).all() and (labels[~dense] == -100).float().mean() > 0.5
    short = step_batch(cfg, corpus, 0)[2]  # first stage: shorter than task_min_length, its task share copies
    assert cfg.stages[0][1] < cfg.task_min_length and not (short == 2).any()
    assert int((short == 1).sum()) == round(len(short) * (cfg.copy_fraction + cfg.task_fraction))


def test_few_rows_a_step_keep_every_share():
    """Two rows of 2,048 tokens a step cannot hold a quarter of task rows each step: the shares alternate over steps
    instead of rounding the tasks away, and the task rotation still reaches every task."""
    from kvlab.train.loop import _share
    cfg = TrainConfig(stages=((2, 1024), (40, 2048)), steps=40)
    corpus = load_corpus()
    kinds = [step_batch(cfg, corpus, s)[2] for s in range(2, 40)]
    n = len(kinds)
    assert all(len(k) == 2 for k in kinds)
    assert sum(int((k == 2).sum()) for k in kinds) == n // 2  # a quarter of 2 rows: one task row every other step
    assert sum(int((k == 1).sum()) for k in kinds) == n  # half of 2 rows: one copy row a step
    assert [_share(s, Fraction(4, 1)) for s in range(5)] == [4] * 5  # whole shares are the old counts
    assert sum(_share(s, Fraction(3, 8)) for s in range(8)) == 3


def test_long_rows_practise_short_copies_and_edge_needles():
    """copy_short caps the shortest planted string of long rows; edge_fraction puts that share of long niah rows'
    asked fact in the first or last tenth; neither touches rows below their lengths (a recipe's shorter stages)."""
    from kvlab.train.loop import _edge
    base = replace(TrainConfig(), copy_short=0, edge_fraction=0.0)  # the recipe before these two options
    cfg = replace(base, copy_short=64, edge_fraction=0.5)
    corpus = load_corpus()
    for step in (0, 2100, 3000, 3500):  # 64- to 512-token rows: the same batches as without the options
        assert all(torch.equal(a, b) for a, b in zip(step_batch(base, corpus, step), step_batch(cfg, corpus, step)))
    long_base, long_cfg = step_batch(base, corpus, 3700), step_batch(cfg, corpus, 3700)  # 1,024-token rows differ
    assert not torch.equal(long_base[0], long_cfg[0])
    depths = [_edge(cfg, "niah", seed, 1024).get("depth") for seed in range(400)]
    edge = [d for d in depths if d is not None]
    assert 150 < len(edge) < 250 and all(d <= 0.1 or d >= 0.9 for d in edge)
    assert any(d <= 0.1 for d in edge) and any(d >= 0.9 for d in edge)
    assert _edge(cfg, "niah", 1, 512) == {} and _edge(cfg, "recall", 1, 1024) == {} and _edge(base, "niah", 1, 4096) == {}
    from kvlab.toy import tasks as T
    s = T.get_task("niah").training_sample(7, 1024, depth=0.0)
    assert s.text.startswith("The code ")  # the asked fact first; other needles elsewhere


def test_a_stopped_run_resumes_bit_for_bit(tmp_path):
    """train(state=...) keeps the run resumable: stopped after 3 steps and resumed, it ends with the same weights
    and curve as one uninterrupted run; a state of other settings is refused with one message."""
    cfg = TrainConfig(steps=6, stages=((3, 64), (6, 128)), eval_every=100, batch_tokens=1024)
    whole = train(cfg, progress=False, evaluate_final=False)
    state = tmp_path / "run.pt"
    train(cfg, stop_after=3, progress=False, evaluate_final=False, state=state)
    resumed = train(cfg, progress=False, evaluate_final=False, state=state)
    for a, b in zip(whole.model.state_dict().values(), resumed.model.state_dict().values()):
        assert torch.equal(a, b)
    assert resumed.curve["text_loss"] == whole.curve["text_loss"] and resumed.curve["step"] == list(range(6))
    with pytest.raises(ParameterError, match="other settings"):
        train(replace(cfg, lr=1e-3), progress=False, evaluate_final=False, state=state)
    (tmp_path / "junk.pt").write_text("not a state")
    with pytest.raises(ParameterError, match="not a kvlab training state"):
        train(cfg, progress=False, evaluate_final=False, state=tmp_path / "junk.pt")


def test_length_curriculum_and_legacy_records():
    cfg = TrainConfig(steps=10, stages=((3, 128), (6, 256), (8, 1024)), batch_tokens=2048)
    assert [cfg.length(i) for i in range(10)] == [128] * 3 + [256] * 3 + [1024] * 4 and cfg.max_length == 1024
    assert TrainConfig.from_dict(cfg.to_dict()) == cfg
    old = cfg.to_dict()
    for k in ("stages", "copy_fraction", "task_dense", "beta2", "copy_weight", "eval_tasks", "eval_depth_samples",
              "eval_copy_strings", "copy_span", "task_min_length", "copy_short", "edge_fraction", "edge_min_length"):
        del old[k]
    legacy = TrainConfig.from_dict(old)  # a record written before the curriculum: the recipe of that time
    assert legacy.stages == () and legacy.copy_fraction == 0 and [legacy.length(i) for i in range(4)] == [
        *cfg.lengths, cfg.lengths[0]]


@pytest.mark.parametrize("bad", [dict(arch="gpt"), dict(size="huge"), dict(steps=0), dict(lengths=(8,)),
                                 dict(lengths=(512,), batch_tokens=256), dict(tasks=("copy",)),
                                 dict(task_fraction=1.5), dict(save_dtype="int8"),
                                 dict(stages=((10, 128), (5, 256))), dict(stages=((10, 8),)),
                                 dict(copy_fraction=0.7, task_fraction=0.5), dict(eval_tasks=("copy",)),
                                 dict(beta2=0.0), dict(copy_short=-1), dict(edge_fraction=1.5),
                                 dict(edge_min_length=0)])
def test_bad_recipe(bad):
    with pytest.raises(ParameterError):
        TrainConfig(**bad)


def test_cli_refuses_bad_input(capsys):
    assert main(["train", "gpt"]) == 2
    assert "arch" in capsys.readouterr().err
    assert main(["train", "dense", "--steps", "0"]) == 2
    assert main(["train", "dense", "--device", "nodevice"]) == 2
