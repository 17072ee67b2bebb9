"""Every attention mechanism against the dense reference, with stated tolerances (float32 math)."""
import math

import pytest
import torch

from kvlab.attention import (AttentionShapeError, CacheFormatError, Compressor, MLAWeights, SelectionError,
                             Stack, StackConfig, WindowState, candidate_pool, causal_mask, cosine,
                             dense_attention, gated_pool, index_scores, kl, logits_kl, mass_covered, mla_absorbed,
                             mla_decode, mla_expanded, model_plan, pool_keys, recall_at_k, rel_error, select_topk,
                             sparse_attention, window_attention)
from kvlab.attention.rope import apply_rope, rms_norm
from kvlab.attention.window import window_positions
from kvlab.cache import vector_store
from kvlab.errors import ShapeError
from kvlab.models import load_model
from kvlab.quant import roundtrip

TOL = 1e-5  # float32 paths that only reorder sums


pytestmark = pytest.mark.usefixtures("one_thread")


def rand(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def explicit(q, k, v, mask=None, sinks=None):
    """Attention written out per head with a plain softmax (no SDPA)."""
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    if sinks is not None:
        s = torch.cat([s, sinks.view(1, -1, 1, 1).expand(s.shape[0], -1, s.shape[2], 1)], -1)
    p = s.softmax(-1)[..., :k.shape[2]]
    return p @ v


@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (4, 2), (4, 1)], ids=["mha", "gqa", "mqa"])
@pytest.mark.parametrize("s", [1, 6])
def test_dense_matches_explicit(heads, kv_heads, s):
    q, k, v = rand(2, heads, s, 16, seed=1), rand(2, kv_heads, 9, 16, seed=2), rand(2, kv_heads, 9, 8, seed=3)
    mask = causal_mask(s, 9)
    assert torch.allclose(dense_attention(q, k, v, causal=True), explicit(q, k, v, mask), atol=TOL)
    sinks = rand(heads, seed=4)
    assert torch.allclose(dense_attention(q, k, v, causal=True, sinks=sinks), explicit(q, k, v, mask, sinks), atol=TOL)


def test_causal_mask_decode_alignment():
    m = causal_mask(2, 5)  # queries at positions 3 and 4
    assert m.tolist() == [[True, True, True, True, False], [True] * 5]
    w = causal_mask(1, 10, window=3, sink_tokens=2)
    assert torch.nonzero(w[0]).flatten().tolist() == [0, 1, 7, 8, 9] == window_positions(10, 3, 2).tolist()


def test_mla_absorbed_equals_expanded():
    w = MLAWeights.random(heads=4, rank=32, d_nope=16, d_rope=8, d_v=16, seed=0)
    qn, qp = rand(2, 4, 5, 16, seed=1), rand(2, 4, 5, 8, seed=2)
    c, kp = rand(2, 11, 32, seed=3), rand(2, 11, 8, seed=4)
    a, e = mla_absorbed(w, qn, qp, c, kp), mla_expanded(w, qn, qp, c, kp)
    assert rel_error(e, a) < 1e-5  # same math, summed in another order
    store = vector_store(32 + 8, "bf16", "latent")  # a kvlab.cache store holds one sequence: batch 0's latents
    store.append(torch.cat([c, kp], -1)[0][:, None])  # [T, 1, r + dr]
    lat = store.read().transpose(0, 1)  # [1, T, r + dr]
    d = mla_decode(w, qn[:1, :, -1:], qp[:1, :, -1:], store)
    ref = mla_expanded(w, qn[:1, :, -1:], qp[:1, :, -1:], lat[..., :32], lat[..., 32:])
    assert rel_error(ref, d) < 1e-5
    with pytest.raises(CacheFormatError, match="40-wide"):
        mla_decode(MLAWeights.random(4, 16, 16, 8, 16), qn, qp, store)
    with pytest.raises(AttentionShapeError, match="kv_lora_rank"):
        mla_expanded(w, qn, qp, c[..., :30], kp)


@pytest.mark.parametrize("window,sinks", [(3, 0), (3, 2), (1, 0), (64, 0)])
def test_window_against_dense_on_kept_positions(window, sinks):
    q, k, v = rand(1, 2, 1, 8, seed=1), rand(1, 1, 20, 8, seed=2), rand(1, 1, 20, 8, seed=3)
    keep = window_positions(20, window, sinks)
    ref = dense_attention(q, k[:, :, keep], v[:, :, keep])
    assert torch.allclose(window_attention(q, k, v, window, sinks), ref, atol=TOL)
    if window >= 20:
        assert torch.allclose(window_attention(q, k, v, window), dense_attention(q, k, v, causal=True), atol=TOL)


def test_window_state_ttl_and_replay():
    st = WindowState(window=4, ttl=60.0, tensors={"x": torch.ones(2)})
    st.offload(now=0.0)
    assert st.where == "host"
    calls = []

    def replay():
        calls.append(1)
        return {"x": torch.zeros(2)}, 4, 100.0

    assert torch.equal(st.fetch(30.0, replay)["x"], torch.ones(2))  # within the TTL: a hit
    assert (st.stats.fetches, st.stats.misses, calls) == (1, 0, [])
    st.offload(100.0)
    assert torch.equal(st.fetch(200.0, replay)["x"], torch.zeros(2))  # past the TTL: a miss, replayed
    assert (st.stats.misses, st.stats.replayed_tokens, st.stats.replay_flops) == (1, 4, 100.0)
    st.offload(300.0)
    with pytest.raises(SelectionError, match="more than the window"):
        st.fetch(1000.0, lambda: ({}, 5, 0.0))
    with pytest.raises(SelectionError, match="window"):
        WindowState(window=0, ttl=1.0)


def test_compression_m1_is_no_compression():
    x = rand(2, 7, 24, seed=1)
    c = Compressor.random(24, 16, 1, overlap=False, rope_dim=4, seed=3)
    uncompressed = apply_rope(rms_norm((x @ c.w_kv).float(), c.norm), torch.arange(7), 4, c.rope_theta)
    assert torch.equal(c(x), uncompressed)  # one slot: softmax weight exactly 1
    k, v, q = rand(1, 1, 9, 8, seed=4), rand(1, 1, 9, 8, seed=5), rand(1, 2, 1, 8, seed=6)
    assert torch.equal(pool_keys(k, 1), k)
    assert torch.allclose(dense_attention(q, pool_keys(k, 1), pool_keys(v, 1)), dense_attention(q, k, v), atol=TOL)


@pytest.mark.parametrize("overlap", [False, True], ids=["hca", "csa"])
def test_streaming_compressor_equals_stateless(overlap):
    m = 4
    c = Compressor.random(16, 8, m, overlap=overlap, rope_dim=4, seed=1)
    x = rand(1, 23, 16, seed=2)
    st = c.state()
    parts = [st.append(x[:, a:b]) for a, b in [(0, 3), (3, 9), (9, 10), (10, 23)]]
    assert st.pending == 23 % m and st.pending < m  # the tail stays bounded
    assert torch.allclose(torch.cat(parts, 1), c(x), atol=TOL)


def test_csa_pooling_by_hand():
    m = 2  # one channel (d = 1)
    kv = torch.tensor([[[1.0, 10.0], [2.0, 20.0], [3.0, 30.0], [4.0, 40.0]]])  # [B, 4, 2d]: Ca | Cb
    out = gated_pool(kv, torch.zeros_like(kv), m, overlap=True)
    # window 0: Cb of tokens 0,1 only (no previous window); window 1: Ca of tokens 0,1 + Cb of tokens 2,3
    assert torch.allclose(out[0, :, 0], torch.tensor([15.0, (1 + 2 + 30 + 40) / 4]))
    with pytest.raises(SelectionError, match="ratio"):
        gated_pool(kv, kv, 0, False)
    with pytest.raises(AttentionShapeError, match="multiple of m"):
        gated_pool(kv[:, :3], kv[:, :3], 2, False)


def test_index_scores_by_hand():
    q, w, k = rand(1, 2, 3, 4, seed=1), rand(1, 2, 3, seed=2), rand(1, 5, 4, seed=3)
    ref = torch.zeros(1, 2, 5)
    for s in range(2):
        for t in range(5):
            ref[0, s, t] = sum(w[0, s, h] / math.sqrt(3) * torch.relu(q[0, s, h] @ k[0, t]) / 2 for h in range(3))
    assert torch.allclose(index_scores(q, w, k), ref, atol=TOL)


@pytest.mark.parametrize("kv_heads", [1, 2])
def test_topk_covering_every_position_equals_dense(kv_heads):
    q, k, v = rand(2, 4, 3, 8, seed=1), rand(2, kv_heads, 12, 8, seed=2), rand(2, kv_heads, 12, 8, seed=3)
    idx = select_topk(rand(2, 3, 12, seed=4), 12)
    assert torch.allclose(sparse_attention(q, k, v, idx), dense_attention(q, k, v), atol=TOL)
    # a window as the extra part, every position selected once: equals dense over the union
    assert torch.allclose(sparse_attention(q, k[:, :, :7], v[:, :, :7], select_topk(rand(2, 3, 7), 7),
                                           extra=(k[:, :, 7:], v[:, :, 7:], None)), dense_attention(q, k, v), atol=TOL)


def test_topk_and_candidate_pool():
    scores = torch.tensor([[0.0, 5.0, 1.0, 9.0, 2.0, 3.0, 8.0]])
    assert select_topk(scores, 2).tolist() == [[3, 6]]
    valid = torch.tensor([[True, True, True, False, True, True, True]])
    assert select_topk(scores, 2, valid).tolist() == [[6, 1]]
    assert select_topk(scores, 3, torch.tensor([[False] * 5 + [True, False]])).tolist() == [[5, -1, -1]]
    assert candidate_pool(scores, 1, 2).tolist() == [[2, 3]]  # block [1, 9] wins
    assert candidate_pool(scores, 2, 3).tolist() == [[3, 4, 5, 6, -1, -1]]  # blocks 1 (9) and 2 (8) beat 0 (5)
    assert candidate_pool(scores, 9, 2).tolist() == [[0, 1, 2, 3, 4, 5, 6, -1]]  # cap above the pool: everything
    with pytest.raises(SelectionError, match="top-k = 8 is larger than the pool of 7"):
        select_topk(scores, 8)
    with pytest.raises(SelectionError, match="candidate blocks"):
        candidate_pool(scores, 0, 2)


def test_metrics():
    p = torch.tensor([[0.5, 0.3, 0.2, 0.0]])
    assert kl(p, p) == 0 and kl(p, torch.tensor([[0.25] * 4])) > 0
    assert recall_at_k(torch.tensor([[0, 1]]), p, 2) == 1.0 and recall_at_k(torch.tensor([[2, 3]]), p, 2) == 0.0
    assert mass_covered(torch.tensor([[0, 2]]), p) == pytest.approx(0.7)
    x = rand(10)
    assert rel_error(x, x) == 0 and cosine(x, x) == pytest.approx(1.0)
    assert logits_kl(x[None], x[None]) == pytest.approx(0.0, abs=1e-7)


def test_bad_input_names_the_mismatch():
    q, k = rand(1, 3, 1, 8), rand(1, 2, 5, 8)
    with pytest.raises(AttentionShapeError, match="q heads = 3 is not a multiple of kv heads = 2"):
        dense_attention(q, k, k)
    with pytest.raises(AttentionShapeError, match="q head_dim = 8 does not match k head_dim = 4"):
        dense_attention(q, k[..., :4], k[..., :4])
    with pytest.raises(AttentionShapeError, match=r"\[B, H, S, D\]"):
        dense_attention(q[0], k, k)
    with pytest.raises(SelectionError, match="window must be an integer >= 1"):
        window_attention(q, k, k, 0)
    with pytest.raises(SelectionError, match="compression ratio m"):
        Compressor.random(8, 4, 0, False)
    s = vector_store(8, "nvfp4", "main")
    with pytest.raises(CacheFormatError, match="main cache is in nvfp4, expected mxfp4"):
        s.expect("mxfp4")
    with pytest.raises(ShapeError, match="width 4, the store holds 8"):
        s.append(rand(2, 1, 4))
    with pytest.raises(SelectionError, match="index_topk"):
        StackConfig(index_topk=0)
    with pytest.raises(SelectionError, match="unknown roles"):
        StackConfig(formats={"keys": "bf16"})


@pytest.mark.parametrize("fmt", ["bf16", "fp8_e4m3", "nvfp4", "mxfp4", "int4", "int2"])
def test_store_roundtrips_through_format(fmt):
    x = rand(6, 1, 32, seed=5)  # [n, copies, width]
    s = vector_store(32, fmt, "main", window=4)
    y = s.append(x)
    assert s.entries == 4 and torch.equal(s.read(), y[-4:])
    from kvlab.formats import get_format
    f = get_format(fmt)
    assert s.held_bytes == 4 * f.entry_bytes(32) + f.tensor_bytes  # bytes from the formats table (+ a pinned scale)
    limit = {"bf16": 0.01, "fp8_e4m3": 0.06, "nvfp4": 0.15, "mxfp4": 0.2, "int4": 0.15, "int2": 0.6}[fmt]
    assert rel_error(x, y) < limit


def test_model_plan_v41_modes():
    spec = load_model("deepseek-v4.1-flash")
    plan = model_plan(spec)
    assert [p.index for p in plan if p.mode == "full"] == list(spec.kv_source_layers)
    assert {p.index for p in plan if p.mode == "reindex"} == set(spec.index_source_layers) - set(spec.kv_source_layers)
    assert all(p.source == 20 for p in plan[20:]) and {p.source for p in plan[2:20]} == {2, 8, 14}
    assert [p.mode for p in model_plan("deepseek-v4-flash")][:4] == ["swa", "swa", "csa", "hca"]


F32 = {"swa": "fp32", "main": "fp32", "index": "fp32", "kv": "fp32"}


@pytest.mark.parametrize("model,kw", [("deepseek-v4.1-flash", dict(candidate_blocks=3)),
                                      ("deepseek-v4-flash", dict(layers=5, ratio_map={128: 8}))])
def test_stack_prefill_then_decode_equals_one_pass(model, kw):
    cfg = StackConfig(model=model, formats=F32, hidden=32, head_dim=16, index_topk=4, window=6, **kw)
    ids = torch.randint(0, cfg.vocab, (1, 40), generator=torch.Generator().manual_seed(0))
    one = Stack(cfg).forward(ids)
    s = Stack(cfg)
    s.prefill(ids[:, :30])
    assert torch.allclose(s.decode(ids[:, 30:]), one[:, 30:], atol=1e-4)  # float32, summation order only


def test_stack_dense_reference_and_replay():
    cfg = StackConfig(hidden=32, head_dim=16, window=8, index_topk=8, formats=F32)
    ids = torch.randint(0, cfg.vocab, (1, 48), generator=torch.Generator().manual_seed(1))
    v4 = StackConfig(model="deepseek-v4-flash", layers=4, hidden=32, head_dim=16, window=8, formats=F32)
    # with the window covering the whole prompt and no compressed entry complete yet (m = 4), sparse == dense
    assert torch.allclose(Stack(v4, dense=True).prefill(ids[:, :3]), Stack(v4).prefill(ids[:, :3]), atol=1e-5)
    sparse = Stack(cfg)
    sparse.prefill(ids[:, :40])
    ref = sparse.decode(ids[:, 40:41])
    sparse2 = Stack(cfg)
    sparse2.prefill(ids[:, :40])
    sparse2.offload_windows(now=0.0, ttl=60.0)
    st = sparse2.restore_windows(now=10.0)  # hit: the same state comes back
    assert st.stats.misses == 0 and torch.equal(sparse2.decode(ids[:, 40:41]), ref)
    sparse3 = Stack(cfg)
    sparse3.prefill(ids[:, :40])
    sparse3.offload_windows(now=0.0, ttl=60.0)
    st = sparse3.restore_windows(now=120.0)  # miss: the last 8 tokens are replayed
    assert (st.stats.misses, st.stats.replayed_tokens) == (1, 8)
    assert st.stats.replay_flops == 8 * sparse3.flops_per_token() > 0
    assert logits_kl(ref[:, 0], sparse3.decode(ids[:, 40:41])[:, 0]) < 0.5  # approximate: a truncated window
    assert sparse3.pos == 41 and len(sparse3.tokens) == 41


@pytest.mark.parametrize("fmt", ["bf16", "nvfp4", "mxfp4", "int4", "fp8_e4m3_b64_ue8m0"])
def test_packed_store_holds_the_same_values(fmt):
    """The packed store (kvlab.cache bytes) decodes to exactly the quantizer's values (kvlab.quant.roundtrip)."""
    x = rand(9, 1, 32, seed=7)  # [n, copies, width]
    b = vector_store(32, fmt, "swa", window=4)
    assert torch.equal(roundtrip(x[:5], fmt), b.append(x[:5]))
    b.append(x[5:])
    assert torch.equal(roundtrip(x[5:], fmt)[-4:], b.read()) and b.entries == 4
    from kvlab.formats import get_format
    assert b.held_bytes == 4 * get_format(fmt).entry_bytes(32)  # held bytes == the formats table
    with pytest.raises(AttentionShapeError, match="one sequence"):
        Stack(StackConfig(hidden=32, head_dim=16)).forward(torch.zeros(2, 1, dtype=torch.long))


def test_stack_reads_packed_caches():
    """The stack's caches are kvlab.cache stores: they hold the formats table's bytes, and reruns agree exactly."""
    from kvlab.formats import get_format
    f = {"main": "nvfp4", "index": "mxfp4", "swa": "fp8_e4m3_b64_ue8m0"}
    ids = torch.randint(0, 128, (1, 40), generator=torch.Generator().manual_seed(3))
    outs = []
    for _ in range(2):
        s = Stack(StackConfig(hidden=32, head_dim=16, window=6, index_topk=4, formats=f))
        s.prefill(ids[:, :36])
        outs.append((s.decode(ids[:, 36:]), s.cache_bytes()))
    assert torch.equal(outs[0][0], outs[1][0]) and outs[0][1] == outs[1][1]
    b = outs[0][1]
    assert b["window"] == len(s.swa) * 6 * get_format(f["swa"]).entry_bytes(16)
    assert b["main"] == sum(st.entries for st in s.main.values()) * get_format("nvfp4").entry_bytes(16) > 0
    assert b["index"] == sum(st.entries for st in s.index.values()) * get_format("mxfp4").entry_bytes(16) > 0


def test_weight_free_evaluation():
    from kvlab.attention.evaluate import EvalSetup, accuracy_table, needle_sweep, pareto, problem, run
    setup = EvalSetup(window=16, topk=16, candidate_blocks=4, candidate_block_size=8, hca_ratio=32)
    rows = {(r["mechanism"], r["format"]): r for r in accuracy_table(
        ["dense", "window", "topk", "capped", "csa", "hca", "mla"], ["fp32", "nvfp4"], 512, setup)}
    assert rows[("dense", "fp32")]["rel_error"] < 1e-5 and rows[("dense", "fp32")]["kl"] < 1e-6
    assert rows[("mla", "fp32")]["rel_error"] < 1e-5  # absorbed over an exact latent == expanded
    assert rows[("topk", "fp32")]["mass"] > rows[("window", "fp32")]["mass"]
    # a pure top-k selection: KL(approx || dense) == -log(mass covered)
    assert rows[("topk", "fp32")]["kl"] == pytest.approx(-math.log(rows[("topk", "fp32")]["mass"]), rel=1e-3)
    assert rows[("hca", "nvfp4")]["bytes"] < rows[("dense", "nvfp4")]["bytes"] < rows[("dense", "fp32")]["bytes"]
    heat = needle_sweep("topk", "bf16", [256], [0.5], setup)
    assert heat.shape == (1, 1) and heat[0, 0] > 0.9
    front = pareto(list(rows.values()))
    assert front[0]["bytes"] == min(r["bytes"] for r in rows.values())
    with pytest.raises(SelectionError, match="top-k = 16 is larger than the pool of 8"):
        run("topk", problem(setup, 8), setup)
    with pytest.raises(SelectionError, match="unknown mechanism"):
        run("sparse", problem(setup, 64), setup)
