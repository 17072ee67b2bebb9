"""KV per GPU under TP / DCP / PP / DP attention, against hand-computed figures (vLLM's rules, with sources in
kvlab.serving.parallel and each family's `splits`)."""
import json
from fractions import Fraction

import pytest

from kvlab.cli import main
from kvlab.errors import ParameterError
from kvlab.layout import Shard, build_layout, stage_layers, stage_sizes
from kvlab.models import spec_from_config
from kvlab.serving.capacity import plan
from kvlab.serving.parallel import Parallelism, per_gpu

# Worked by hand: 2 (K,V) x layers x KV heads per rank x head_dim x 2 B (BF16); MLA: layers x 576 x 2 B.
WORKED = [
    ("qwen3-8b", Parallelism(tp=2), 2 * 36 * 4 * 128 * 2),  # 73,728: 8 KV heads -> 4 per rank
    ("qwen3-8b", Parallelism(tp=8), 2 * 36 * 1 * 128 * 2),  # 18,432: 1 per rank
    ("qwen3-8b", Parallelism(tp=16), 2 * 36 * 1 * 128 * 2),  # 18,432: 8 heads < 16 ranks, each replicated twice
    ("llama-3.1-70b", Parallelism(tp=4), 2 * 80 * 2 * 128 * 2),  # 81,920
    ("deepseek-v3", Parallelism(tp=8), 61 * 576 * 2),  # 70,272: the latent on every rank
    ("deepseek-v3", Parallelism(tp=8, dcp=8), 61 * 576 * 2 // 8),  # 8,784: tokens interleaved over 8
    ("qwen3-8b", Parallelism(pp=2), 2 * 18 * 8 * 128 * 2),  # 73,728: 18 layers per stage
    ("qwen3-8b", Parallelism(tp=8, dp_attention=True), 147_456),  # each rank whole sessions
]


@pytest.mark.parametrize("model,par,expected", WORKED, ids=[f"{m}-{p.label()}" for m, p, _ in WORKED])
def test_worked_per_gpu_figures(model, par, expected):
    share = per_gpu(model, par)
    assert share.per_gpu_bytes_per_token == expected
    assert share.whole.bytes_per_token == build_layout(model).bytes_per_token  # whole-model figure unchanged
    assert par.gpus == {True: par.tp, False: par.tp * par.pp}[par.dp_attention]


def test_these_are_the_figures_published_in_deployments():
    assert [per_gpu(m, p).per_gpu_bytes_per_token for m, p, _ in WORKED[:7]] == [
        73_728, 18_432, 18_432, 81_920, 70_272, 8_784, 73_728]


def test_kv_heads_fewer_than_ranks_are_replicated_not_split():
    L = build_layout("qwen3-8b", shard=Shard(tp=16))
    assert {c.copies for _, c in L.components()} == {1}  # max(1, 8 // 16)
    # 16 GPUs hold 16 x 18,432 B per token: twice the model's 147,456 (each head on two ranks)
    assert 16 * L.bytes_per_token == 2 * 147_456


def test_mla_is_replicated_under_tp_and_split_by_dcp():
    whole = build_layout("deepseek-v3").bytes_per_token
    for tp in (2, 4, 8):
        assert build_layout("deepseek-v3", shard=Shard(tp=tp)).bytes_per_token == whole
    assert build_layout("deepseek-v3", shard=Shard(tp=8, dcp=2)).bytes_per_token == whole / 2
    s = build_layout("deepseek-v3", shard=Shard(tp=8, dcp=8)).session(1001)
    assert s.growing == 61 * 1152 * 126  # rank 0 holds tokens 0, 8, ..., 1000: ceil(1001 / 8) = 126


def test_v32_indexer_keys_stay_whole_under_dcp():
    L = build_layout("deepseek-v3.2", "vllm", shard=Shard(tp=8, dcp=8))
    assert L.bytes_per_token == Fraction(61 * 656, 8) + 61 * 132  # latent split, 132 B indexer key whole


def test_v4_windows_tails_and_indexer_stay_whole_under_dcp():
    L = build_layout("deepseek-v4-flash", shard=Shard(tp=8, dcp=8))
    # 21 CSA x (584 / 8 + 68) / 4 + 20 HCA x 584 / 8 / 128: main entries split, indexer keys whole
    assert L.bytes_per_token == Fraction(21 * 584, 4 * 8) + Fraction(21 * 68, 4) + Fraction(20 * 584, 8 * 128)
    assert L.bounded_bytes == build_layout("deepseek-v4-flash").bounded_bytes  # windows and tails whole


def test_v41_entries_and_indexer_keys_split_under_dcp():
    assert build_layout("deepseek-v4.1-flash", shard=Shard(tp=8, dcp=8)).bytes_per_token == Fraction(890, 8)
    assert build_layout("deepseek-v4.1-flash", shard=Shard(tp=8)).bytes_per_token == 890


def test_pipeline_stages_follow_vllm_get_pp_indices():
    assert stage_sizes(36, 2) == [18, 18]
    assert stage_sizes(61, 8) == [7, 7, 8, 8, 8, 8, 8, 7]  # 61 = 8 x 7 + 5: one each to stages 6, 5, 4, 3, 2
    assert stage_sizes(10, 4) == [2, 3, 3, 2]
    assert list(stage_layers(61, 8, 2)) == list(range(14, 22))
    share = per_gpu("deepseek-v3", Parallelism(pp=8))
    assert [len(a.layout.layers) for a in share.stages] == [7, 7, 8, 8, 8, 8, 8, 7]
    assert share.per_gpu_bytes_per_token == 8 * 1152
    with pytest.raises(ParameterError, match="PP 40 exceeds the model's 36 layers"):
        per_gpu("qwen3-8b", Parallelism(pp=40))


def test_hybrid_state_splits_over_tp_and_stays_whole_under_dcp():
    whole = build_layout("qwen3-next-80b-a3b")
    tp2 = build_layout("qwen3-next-80b-a3b", shard=Shard(tp=2))
    assert tp2.bytes_per_token == whole.bytes_per_token / 2  # 2 KV heads -> 1 per rank
    assert tp2.state_bytes * 2 == whole.state_bytes  # conv channels and value heads split evenly
    tp8 = build_layout("qwen3-next-80b-a3b", shard=Shard(tp=8))
    assert tp8.bytes_per_token == whole.bytes_per_token / 2  # 2 KV heads < 8 ranks: replicated
    assert tp8.state_bytes * 8 == whole.state_bytes


@pytest.mark.parametrize("model,par,words", [
    ("qwen3-8b", dict(tp=8, dcp=3), ["DCP 3 must divide TP 8"]),
    ("qwen3-8b", dict(tp=8, dcp=2), ["DCP 2 exceeds TP / KV heads = 8 / 8 = 1"]),
    ("qwen3-8b", dict(tp=3), ["32 attention heads cannot be split over TP 3"]),
    (spec_from_config({"num_hidden_layers": 2, "num_attention_heads": 24, "num_key_value_heads": 6, "head_dim": 64},
                      "h24-kv6"), dict(tp=4), ["6 KV heads cannot be spread over TP 4"]),
    ("qwen3-8b", dict(tp=8, dcp=2, dp_attention=True), ["data-parallel attention"]),
    ("deepseek-v3", dict(tp=6), ["128 attention heads cannot be split over TP 6"]),
])
def test_invalid_combinations_are_clear_errors(model, par, words):
    with pytest.raises(ParameterError) as e:
        per_gpu(model, Parallelism(**par))
    for w in words:
        assert w in str(e.value)


def test_gemma_kv_heads_replicate_when_ranks_are_a_multiple():
    L = build_layout("gemma-3-27b", shard=Shard(tp=32))
    assert {c.copies for _, c in L.components()} == {1}


def test_components_say_what_splits_with_sources():
    rows = {r["component"]: r for r in per_gpu("deepseek-v4-flash", Parallelism(tp=8, dcp=8)).components}
    assert rows["main"]["dcp"] == "interleaved over DCP ranks" and "tokenspeed" in rows["main"]["source"]
    assert rows["index"]["dcp"].startswith("whole") and rows["swa"]["dcp"].startswith("whole")
    assert rows["main"]["tp"] == "replicated on every TP rank"
    dense = {r["component"]: r for r in per_gpu("qwen3-8b", Parallelism(tp=8)).components}
    assert dense["k"]["copies"] == 8 and dense["k"]["copies_per_gpu"] == 1
    assert "get_num_kv_heads" in dense["k"]["source"]


def test_sessions_per_gpu_and_per_deployment():
    ctx = 131_072
    tp8 = plan("deepseek-v3", "H200", ctx, parallel=Parallelism(tp=8))
    dcp8 = plan("deepseek-v3", "H200", ctx, parallel=Parallelism(tp=8, dcp=8))
    dp8 = plan("deepseek-v3", "H200", ctx, parallel=Parallelism(tp=8, dp_attention=True))
    assert tp8.usable_kv_bytes == dcp8.usable_kv_bytes  # the same weights per GPU
    # DP attention keeps the 11.4B MLA projection parameters (FP8, 128 x 128 block scales) on every rank
    att = 11_413_422_080 * (8 + 32 / 128**2) / 8
    assert abs(dp8.weight_share - (att + (dp8.weight_bytes - att) / 8)) < 2  # bytes, rounded up twice
    assert dp8.weight_share > tp8.weight_share == -(-tp8.weight_bytes // 8)
    assert tp8.session.total == 70_272 * ctx  # every rank holds the whole latent
    assert dcp8.session.total == 70_272 * ctx // 8
    assert dp8.session.total == 70_272 * ctx
    # TP 8: each session spans 8 GPUs, all of which hold its full latent: no more sessions than one GPU holds
    assert tp8.sessions_per_deployment == tp8.usable_kv_bytes // (70_272 * ctx)
    # DP attention: every rank its own sessions, 8x over the (smaller, attention replicated) pool of one
    assert dp8.sessions_per_deployment == 8 * (dp8.usable_kv_bytes // (70_272 * ctx))
    assert dcp8.sessions_per_deployment == tp8.usable_kv_bytes // (70_272 * ctx // 8)
    assert tp8.sessions_per_gpu == Fraction(tp8.sessions_per_deployment, 8) or \
        tp8.sessions_per_gpu == tp8.sessions_per_deployment / 8


def test_cli_bytes_reports_per_gpu_beside_the_whole_model(capsys):
    assert main(["bytes", "deepseek-v3", "--tp", "8", "--dcp", "8", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["bytes_per_token"] == 70_272 and out["per_gpu_bytes_per_token"] == 8_784 and out["gpus"] == 8
    assert {r["component"] for r in out["components"]} == {"latent"}
    assert main(["bytes", "qwen3-8b", "--pp", "2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["per_gpu_bytes_per_token"] == 73_728 and out["per_gpu_layers"] == [18, 18] and "pp_rule" in out
    assert main(["bytes", "qwen3-8b", "--json"]) == 0
    assert "per_gpu_bytes_per_token" not in json.loads(capsys.readouterr().out)  # one GPU: unchanged output


def test_cli_sessions_per_deployment(capsys):
    assert main(["sessions", "deepseek-v3", "--gpu", "H200", "--context", "131072", "--tp", "8", "--dcp", "8",
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    cap = plan("deepseek-v3", "H200", 131_072, parallel=Parallelism(tp=8, dcp=8))
    assert out["sessions_per_deployment"] == cap.sessions_per_deployment and out["gpus"] == 8
    assert out["deployment"] == "TP 8 + DCP 8" and out["whole_model_bytes_per_token"] == 70_272
    assert main(["sessions", "qwen3-8b", "--gpu", "H200", "--context", "131072", "--tp", "8", "--dp-attention"]) == 0
    assert "per deployment of 8 GPU(s)" in capsys.readouterr().out
