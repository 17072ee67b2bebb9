"""vLLM 0.33.0's own KV-cache planning, run as the oracle of kvlab.serving.vllm_plan (issue 34).

Run it with the vLLM venv's python (`make oracle-vllm` does, then checks kvlab against the result):
    .venv-vllm/bin/python tests/oracles/vllm_capacity.py tests/fixtures/vllm_capacity.json
It is not part of kvlab's test run (it imports vllm, which lives in its own 9.5 GB venv); the fixture it writes is
what CI compares kvlab with, block for block (tests/test_vllm_capacity.py).

For every case (a model: a catalog config from data/models or a generated one; a KV dtype; TP / DCP; the KV memory
handed to the engine, vLLM's --kv-cache-memory-bytes; max_model_len; max_num_batched_tokens; prefix caching; async
scheduling) it records what the engine core logs at start-up -- "GPU KV cache size: N tokens, Maximum concurrency
for L tokens per request: C" -- and what lies behind it: num_blocks, the KV cache groups with their layers, block
size, page bytes and blocks per request, the bytes of one pool block, the mamba cache mode, the block size the
engine settles on. A configuration vLLM refuses is recorded with its error.

vLLM code called unchanged (vllm 0.33.0, site-packages/vllm):
  config/ VllmConfig, ModelConfig, CacheConfig, SchedulerConfig, ParallelConfig: the derived max_model_len
      (config/model.py _get_and_verify_max_len), mamba_cache_mode 'align' under prefix caching and the mamba block
      size (model_executor/models/config.py MambaModelConfig.verify_and_update_config), max_in_flight_tokens =
      max_concurrent_batches x max_num_batched_tokens (config/vllm.py)
  platforms/interface.py Platform.update_block_size_for_backend: the preferred block size of the attention backend
      (_preferred_block_size_for_backends) and the hybrid alignment (_align_hybrid_block_size)
  model_executor/models/<model>.py get_mamba_state_shape_from_config / get_mamba_state_dtype_from_config
      (layers/mamba/mamba_utils.py MambaStateShapeCalculator, MambaStateDtypeCalculator)
  model_executor/layers/attention/attention.py _largest_kernel_block_within (a sliding-window layer's block)
  v1/worker/utils.py customize_attention_spec (what the GPU model runner applies to every attention spec)
  v1/kv_cache_interface.py FullAttentionSpec, SlidingWindowSpec, MLAAttentionSpec, MambaSpec
  v1/attention/backends/utils.py get_supported_kv_cache_layouts, resolve_kv_cache_layout
  v1/core/kv_cache_planning.py get_global_kv_cache_groups, get_kv_cache_configs
  v1/core/kv_cache_utils.py generate_scheduler_kv_cache_config, get_kv_cache_capacity (the logged figures)
  (the calls follow v1/engine/core.py EngineCore._initialize_kv_caches)

What runs on a GPU and is therefore constructed here, as the CUDA path builds it on an H200 (SM90):
  - the attention backend (vllm/platforms/cuda.py _get_backend_priorities, SM90): FLASH_ATTN for GQA / MHA layers;
    for MLA FLASH_ATTN_MLA (first on SM90; its supported_kv_cache_dtypes are auto / float16 / bfloat16), else
    FLASHMLA for an FP8 cache. The backend classes themselves are vLLM's (FLASH_ATTN_MLA's module needs two CUDA
    kernels at import; they are stubbed, nothing of them is called);
  - each layer's spec, built as the layers' get_kv_cache_spec build it (layers/attention/attention.py Attention,
    layers/attention/mla_attention.py MLAAttention, layers/mamba/abstract.py MambaBase, with the Gated DeltaNet
    (layers/mamba/gdn/qwen_gdn_linear_attn.py) and Mamba-2 (layers/mamba/mamba_mixer2.py) prefill checkpoint block);
    the hybrid KV cache manager on (VllmConfig turns it off on this CPU's platform, CudaPlatform keeps it on);
    which layers slide as the model files decide (gpt_oss.py: even layers; gemma3.py / llama.py: layer_types);
  - the prefill checkpoint alignment the instantiated Mamba layers would report
    (layers/mamba/abstract.py get_mamba_prefill_checkpoint_alignment): on SM90 the GDN prefill runs FlashInfer
    (qwen_gdn_linear_attn.py _resolve_gdn_prefill_backend), alignment FLASHINFER_GDN_CHECKPOINT_ALIGNMENT = 64 in
    'align' mode; Mamba-1 layers report none. No layer is instantiated here, so the function is given that value.
MiniMax-Text-01 (kvlab's minimax family) is no longer supported by vLLM 0.33 ("supported until v0.23.0").
What is not expressed: DeepSeek V3.2 (sparse MLA + indexer caches), V4 and V4.1 (compressed, circular-buffer and
sliding MLA caches packed side by side): their specs come from model-specific attention modules
(vllm/models/deepseek_v32, deepseek_v4, deepseek_v41) that need their CUDA kernels to be built; the fixture lists
them under "not_expressed" with the reason.
"""
from __future__ import annotations

import contextlib
import copy
import io
import itertools
import json
import logging
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "data" / "models"
GIB = 2**30
HYBRIDS = ("qwen3_next", "jamba", "nemotron_h", "lfm2")  # model types whose plan prefix caching changes
H200_MAX_NUM_BATCHED_TOKENS = 8192  # engine/arg_utils.py get_batch_defaults: >= 70 GiB, not A100, `vllm serve`
NOT_EXPRESSED = {
    "deepseek-v3.2": "DeepSeek V3.2's sparse MLA (fp8_ds_mla) and indexer caches are built by its own attention "
                     "modules (vllm/models/deepseek_v32) that need their CUDA kernels; not constructed on a CPU",
    "deepseek-v4-flash": "DeepSeek V4's compressed, indexer, circular-buffer and sliding MLA caches are built by "
                         "vllm/models/deepseek_v4 (CUDA kernels at import) and packed block-outermost; not "
                         "constructed on a CPU",
    "deepseek-v4-pro": "as deepseek-v4-flash",
    "deepseek-v4.1-flash": "DeepSeek V4.1's caches come from vllm/models/deepseek_v41 (CUDA kernels at import); not "
                           "constructed on a CPU",
}


def quiet_import():
    logging.disable(logging.WARNING)
    import vllm  # noqa: F401
    from vllm.v1.attention.backends import fa_utils
    for name in ("flash_attn_varlen_func", "get_scheduler_metadata"):  # CUDA-only kernels FLASH_ATTN_MLA imports
        if not hasattr(fa_utils, name):
            setattr(fa_utils, name, None)


# --- configs ------------------------------------------------------------------------------------------------
def catalog_config(name: str) -> dict:
    cfg = json.loads((MODELS / f"{name}.json").read_text())
    for k in [k for k in cfg if k.startswith("_")]:
        del cfg[k]
    cfg.pop("quantization_config", None)  # weight quantization: no part of the KV specs, and no CPU kernels for it
    return cfg


def generated_configs() -> dict[str, dict]:
    """Small configs that exercise each rule: dense MHA / GQA / MQA, MLA, sliding windows of several sizes and
    patterns, Mamba-1 and Gated DeltaNet hybrids. Each is a complete config.json kvlab and vLLM both read."""
    def llama(n, heads, kv, hd, types=None, window=None, mpe=131072):
        c = dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=heads * hd,
                 intermediate_size=4 * heads * hd, num_hidden_layers=n, num_attention_heads=heads,
                 num_key_value_heads=kv, head_dim=hd, max_position_embeddings=mpe, vocab_size=32000,
                 rms_norm_eps=1e-5, rope_theta=10000.0, torch_dtype="bfloat16", tie_word_embeddings=False)
        if types is not None:
            c.update(layer_types=types, sliding_window=window)
        return c

    def pattern(n, every, last_full=True):  # every `every`-th layer full, the rest sliding
        return ["full_attention" if (i + 1) % every == 0 else "sliding_attention" for i in range(n)]

    out = {
        "gen-mha-12x8x64": llama(12, 8, 8, 64),
        "gen-gqa-20x16x4x128": llama(20, 16, 4, 128),
        "gen-mqa-18x8x1x256": llama(18, 8, 1, 256),
        "gen-gqa-32x32x8x96": llama(32, 32, 8, 96),
        "gen-swa-all-w4096": llama(16, 16, 4, 128, ["sliding_attention"] * 16, 4096),
        "gen-swa-3to1-w512": llama(24, 16, 8, 128, pattern(24, 4), 512),
        "gen-swa-5to1-w1024": llama(30, 16, 8, 128, pattern(30, 6), 1024),
        "gen-swa-1to1-w128": llama(12, 8, 4, 64, ["sliding_attention", "full_attention"] * 6, 128),
        "gen-swa-20full-30sw-w2048": llama(50, 8, 8, 128, ["full_attention"] * 20 + ["sliding_attention"] * 30, 2048),
        "gen-swa-13full-12sw-w256": llama(25, 8, 2, 128, ["sliding_attention", "full_attention"] * 12
                                          + ["full_attention"], 256),
        "gen-swa-1full-7sw-w8000": llama(16, 16, 4, 128, pattern(16, 8), 8000),
        "gen-mla-small": dict(architectures=["DeepseekV3ForCausalLM"], model_type="deepseek_v3", hidden_size=2048,
                              intermediate_size=8192, moe_intermediate_size=512, num_hidden_layers=27,
                              num_attention_heads=16, num_key_value_heads=16, kv_lora_rank=256, q_lora_rank=768,
                              qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, n_routed_experts=8,
                              n_shared_experts=1, num_experts_per_tok=2, first_k_dense_replace=1,
                              max_position_embeddings=65536, vocab_size=32000, torch_dtype="bfloat16"),
        "gen-gdn-hybrid-i3": dict(architectures=["Qwen3NextForCausalLM"], model_type="qwen3_next", hidden_size=1024,
                                  num_hidden_layers=24, full_attention_interval=3, num_attention_heads=8,
                                  num_key_value_heads=4, head_dim=128, linear_conv_kernel_dim=4,
                                  linear_key_head_dim=128, linear_value_head_dim=128, linear_num_key_heads=8,
                                  linear_num_value_heads=16, num_experts=8, num_experts_per_tok=2,
                                  moe_intermediate_size=256, shared_expert_intermediate_size=256,
                                  max_position_embeddings=131072, vocab_size=32000, torch_dtype="bfloat16"),
        "gen-mamba1-hybrid-p4": dict(architectures=["JambaForCausalLM"], model_type="jamba", hidden_size=2048,
                                     intermediate_size=8192, num_hidden_layers=16, num_attention_heads=16,
                                     num_key_value_heads=4, attn_layer_period=4, attn_layer_offset=1,
                                     expert_layer_period=2, expert_layer_offset=1, num_experts=4,
                                     num_experts_per_tok=2, mamba_d_conv=4, mamba_d_state=16, mamba_expand=2,
                                     mamba_dt_rank=128, max_position_embeddings=131072, vocab_size=32000,
                                     torch_dtype="bfloat16"),
        "gen-mamba2-nemotronh": dict(architectures=["NemotronHForCausalLM"], model_type="nemotron_h",
                                     hidden_size=2048, intermediate_size=8192, num_hidden_layers=12,
                                     num_attention_heads=16, num_key_value_heads=4, head_dim=128,
                                     hybrid_override_pattern="M-M*M-M*M-M*", mamba_num_heads=64, mamba_head_dim=64,
                                     n_groups=8, ssm_state_size=128, conv_kernel=4, expand=2,
                                     max_position_embeddings=131072, vocab_size=32000, torch_dtype="bfloat16"),
        "gen-shortconv-lfm2": dict(architectures=["Lfm2ForCausalLM"], model_type="lfm2", hidden_size=1024,
                                   intermediate_size=4096, num_hidden_layers=16, num_attention_heads=16,
                                   num_key_value_heads=8, full_attn_idxs=[2, 5, 8, 10, 12, 14], conv_L_cache=3,
                                   conv_dim=1024, max_position_embeddings=128000, vocab_size=65536,
                                   torch_dtype="bfloat16"),
    }
    return out


# --- the H200 CUDA path, constructed ---------------------------------------------------------------------------
def backend_for(model_config, cache_dtype: str):
    """The attention backend an SM90 GPU selects (vllm/platforms/cuda.py _get_backend_priorities, first valid)."""
    from vllm.v1.attention.backends.registry import AttentionBackendEnum
    from vllm.v1.kv_cache_interface import is_quantized_kv_cache
    if model_config.use_mla:
        name = "FLASHMLA" if is_quantized_kv_cache(cache_dtype) else "FLASH_ATTN_MLA"
    else:
        name = "FLASH_ATTN"
    return name, AttentionBackendEnum[name].get_class()


def is_gdn(model_config) -> bool:
    return model_config.hf_text_config.model_type.startswith(("qwen3_next", "qwen3_5"))


def is_mamba2(model_config) -> bool:
    return model_config.hf_text_config.model_type in ("nemotron_h", "granitemoehybrid", "falcon_h1")


def checkpoint_alignment(model_config, cache_config) -> int | None:
    """What layers/mamba/abstract.py get_mamba_prefill_checkpoint_alignment returns once the model's Mamba layers
    exist on SM90: Gated DeltaNet layers with FlashInfer prefill in align mode report 64
    (qwen_gdn_linear_attn.py get_prefill_checkpoint_alignment); Mamba-1, Mamba-2 and short-conv layers none."""
    from vllm.v1.attention.backends.gdn_attn import FLASHINFER_GDN_CHECKPOINT_ALIGNMENT
    if is_gdn(model_config) and cache_config.mamba_cache_mode == "align":
        return FLASHINFER_GDN_CHECKPOINT_ALIGNMENT
    return None


def layer_kinds(model_config) -> list[tuple[str, int | None]]:
    """(kind, sliding window) per decoder layer, as the vLLM model file decides it."""
    c = model_config.hf_text_config
    n = c.num_hidden_layers
    mt = c.model_type
    if model_config.use_mla:
        return [("mla", None)] * n
    if mt == "gpt_oss":  # gpt_oss.py OAIAttention: sliding_window if layer_idx % 2 == 0
        return [("attention", c.sliding_window if i % 2 == 0 else None) for i in range(n)]
    if mt == "jamba":  # jamba.py: config.layers_block_type
        return [("attention", None) if t == "attention" else ("mamba", None) for t in c.layers_block_type]
    types = getattr(c, "layer_types", None)
    if types:  # gemma3.py / llama.py / qwen3.py: layer_types[i] == "sliding_attention"; hybrids' linear layers
        window = getattr(c, "sliding_window", None)
        kinds = {"full_attention": ("attention", None), "sliding_attention": ("attention", window),
                 "linear_attention": ("mamba", None), "conv": ("mamba", None), "mamba": ("mamba", None)}
        return [kinds.get(t, ("none", None)) for t in types[:n]]  # mlp / moe layers keep no cache
    return [("attention", None)] * n


def build_specs(vc, backend) -> dict:
    """Each layer's KV cache spec as the layers' get_kv_cache_spec and the GPU model runner build them."""
    from vllm.model_executor.layers.attention.attention import _largest_kernel_block_within
    from vllm.model_executor.models import ModelRegistry
    from vllm.utils.torch_utils import kv_cache_dtype_str_to_dtype
    from vllm.v1.kv_cache_interface import (FullAttentionSpec, MambaSpec, MLAAttentionSpec, SlidingWindowSpec,
                                            get_kv_quant_mode)
    from vllm.v1.worker.utils import customize_attention_spec
    mc, cc, pc = vc.model_config, vc.cache_config, vc.parallel_config
    dtype = kv_cache_dtype_str_to_dtype(cc.cache_dtype, mc)
    quant = get_kv_quant_mode(cc.cache_dtype)
    block = cc.block_size
    specs = {}
    mamba = None
    if mc.is_hybrid:
        model_cls, _ = ModelRegistry.resolve_model_cls(mc.architecture, model_config=mc)
        mamba = dict(shapes=tuple(model_cls.get_mamba_state_shape_from_config(vc)),
                     dtypes=tuple(model_cls.get_mamba_state_dtype_from_config(vc)))
    align = checkpoint_alignment(mc, cc)
    for i, (kind, window) in enumerate(layer_kinds(mc)):
        if kind == "mla":  # mla_attention.py MLAAttention.get_kv_cache_spec
            spec = MLAAttentionSpec(block_size=block, num_kv_heads=1, max_tp_shards=1, head_size=mc.get_head_size(),
                                    dtype=dtype, cache_dtype_str=cc.cache_dtype, kv_quant_mode=quant)
            specs[f"model.layers.{i}.self_attn.attn"] = customize_attention_spec(backend, spec)
        elif kind == "attention":  # attention.py Attention.get_kv_cache_spec
            kv, hd = mc.get_num_kv_heads(pc), mc.get_head_size()
            if window is not None:
                probe = backend.customize_spec(SlidingWindowSpec(block_size=1, num_kv_heads=kv, head_size=hd,
                                                                 dtype=dtype, kv_quant_mode=quant,
                                                                 sliding_window=window))
                per_token = probe.real_page_size_bytes
                sw_block = _largest_kernel_block_within(backend, per_token, per_token * block, block, probe)
                spec = SlidingWindowSpec(block_size=sw_block, num_kv_heads=kv, head_size=hd, dtype=dtype,
                                         kv_quant_mode=quant, sliding_window=window, page_size_padded=None)
            else:
                spec = FullAttentionSpec(block_size=block, num_kv_heads=kv, head_size=hd, dtype=dtype,
                                         kv_quant_mode=quant)
            specs[f"model.layers.{i}.self_attn.attn"] = customize_attention_spec(backend, spec)
        elif kind == "mamba":  # layers/mamba/abstract.py MambaBase.get_kv_cache_spec
            spec = MambaSpec(block_size=cc.mamba_block_size, page_size_padded=cc.mamba_page_size_padded,
                             mamba_cache_mode=cc.mamba_cache_mode, num_speculative_blocks=0, **mamba)
            if align is not None:  # qwen_gdn_linear_attn.py get_kv_cache_spec: one prefill checkpoint block
                from vllm.model_executor.layers.mamba.abstract import get_mamba_prefill_checkpoint_grid
                spec = replace(spec, num_prefill_checkpoint_blocks=1,
                               prefill_checkpoint_alignment=get_mamba_prefill_checkpoint_grid(vc))
            elif is_mamba2(mc):  # mamba_mixer2.py get_kv_cache_spec
                spec = replace(spec, num_prefill_checkpoint_blocks=1, prefill_checkpoint_alignment=1)
            specs[f"model.layers.{i}.mixer"] = spec
    return specs


# --- one case --------------------------------------------------------------------------------------------------
def run_case(case: dict, config: dict) -> dict:
    from vllm.config import CacheConfig, DeviceConfig, ModelConfig, ParallelConfig, SchedulerConfig, VllmConfig
    from vllm.platforms.interface import Platform
    from vllm.v1.attention.backends.utils import get_supported_kv_cache_layouts, resolve_kv_cache_layout
    from vllm.v1.core.kv_cache_planning import get_global_kv_cache_groups, get_kv_cache_configs
    from vllm.v1.core.kv_cache_utils import generate_scheduler_kv_cache_config, get_kv_cache_capacity
    import vllm.model_executor.layers.mamba.abstract as mamba_abstract

    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "config.json").write_text(json.dumps(config))
        mc = ModelConfig(model=d, skip_tokenizer_init=True, max_model_len=case["max_model_len"], dtype="auto")
        vc = VllmConfig(
            model_config=mc, device_config=DeviceConfig(device="cpu"),
            cache_config=CacheConfig(block_size=None, cache_dtype=case["kv_cache_dtype"],
                                     enable_prefix_caching=case["prefix_caching"]),
            scheduler_config=SchedulerConfig(max_num_batched_tokens=case["max_num_batched_tokens"],
                                             max_model_len=case["max_model_len"], is_encoder_decoder=False,
                                             async_scheduling=case["async_scheduling"]),
            parallel_config=ParallelConfig(tensor_parallel_size=case["tp"], decode_context_parallel_size=case["dcp"]))
        # config/vllm.py: the hybrid KV cache manager stays on where the platform supports it (CudaPlatform.
        # support_hybrid_kv_cache is True); on this CPU's platform VllmConfig turned it off, so it is set back
        vc.scheduler_config.disable_hybrid_kv_cache_manager = False
        backend_name, backend = backend_for(mc, vc.cache_config.cache_dtype)

        class H200(Platform):  # the CUDA platform's block-size steps, with the backend SM90 selects
            @classmethod
            def _find_non_ssm_backends(cls, vllm_config):
                return [backend]

        align = checkpoint_alignment(mc, vc.cache_config)
        saved = mamba_abstract.get_mamba_prefill_checkpoint_alignment
        mamba_abstract.get_mamba_prefill_checkpoint_alignment = lambda _vc: align
        try:
            H200.update_block_size_for_backend(vc)
            specs = build_specs(vc, backend)
        finally:
            mamba_abstract.get_mamba_prefill_checkpoint_alignment = saved
        # v1/engine/core.py EngineCore._initialize_kv_caches, in order
        layout = resolve_kv_cache_layout(vc, [[l.name for l in get_supported_kv_cache_layouts([backend])]],
                                         list(specs.values()))
        groups = get_global_kv_cache_groups(vc, [specs])
        configs = get_kv_cache_configs(vc, [specs], [case["kv_cache_memory_bytes"]], groups)
        sched = generate_scheduler_kv_cache_config(configs)
        participating = [g.kv_cache_spec.block_size for g in sched.kv_cache_groups
                         if g.kv_cache_spec.prefix_cacheable]
        tokens, concurrency = get_kv_cache_capacity(vc, sched)
        out_groups = []
        for g in configs[0].kv_cache_groups:
            s = sched.kv_cache_groups[len(out_groups)].kv_cache_spec
            out_groups.append(dict(kind=type(s).__name__, layers=sorted(int(n.split(".")[2]) for n in g.layer_names),
                                   block_tokens=s.block_size, page_bytes=s.page_size_bytes,
                                   window=getattr(s, "sliding_window", None),
                                   blocks_per_request=-(-s.max_memory_usage_bytes(vc) // s.page_size_bytes)))
        bytes_per_block = configs[0].kv_cache_tensors[0].size // configs[0].num_blocks
        return dict(backend=backend_name, kv_cache_layout=layout.name, block_tokens=min(participating),
                    mamba_cache_mode=vc.cache_config.mamba_cache_mode if mc.is_hybrid else None,
                    max_in_flight_tokens=vc.max_in_flight_tokens, num_blocks=configs[0].num_blocks,
                    bytes_per_block=bytes_per_block, groups=out_groups, kv_cache_size_tokens=tokens,
                    max_concurrency=concurrency,
                    logged=f"GPU KV cache size: {tokens:,} tokens, Maximum concurrency for "
                           f"{case['max_model_len']:,} tokens per request: {concurrency:.2f}x")


def derived_max_model_len(config: dict) -> int:
    from vllm.config import ModelConfig
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "config.json").write_text(json.dumps(config))
        return ModelConfig(model=d, skip_tokenizer_init=True, dtype="auto").max_model_len


# --- the grid --------------------------------------------------------------------------------------------------
def cases(models: dict[str, dict], lens: dict[str, int]):
    """The case grid: every model x KV dtype x TP at 40 GiB and min(32,768, the model's length), prefix caching
    on (vLLM's default), and off for the hybrids (and one dense model); then variations of memory, length, batch
    tokens, scheduling and DCP."""
    base = dict(kv_cache_memory_bytes=40 * GIB, max_num_batched_tokens=H200_MAX_NUM_BATCHED_TOKENS,
                prefix_caching=True, async_scheduling=True, dcp=1)
    for name, cfg in models.items():
        L = min(32768, lens[name])
        switches = (True, False) if cfg["model_type"] in HYBRIDS or name == "llama-3.1-8b" else (True,)
        for dtype, tp, pc in itertools.product(("auto", "fp8"), (1, 2, 4), switches):
            yield dict(base, model=name, kv_cache_dtype=dtype, tp=tp, max_model_len=L, prefix_caching=pc)
    extra = [
        ("llama-3.1-8b", dict(kv_cache_memory_bytes=80_000_000_000, max_model_len=131072)),
        ("llama-3.1-8b", dict(kv_cache_memory_bytes=10 * GIB, max_model_len=8191)),
        ("llama-3.1-8b", dict(kv_cache_memory_bytes=4 * 2**20 + 12345, max_model_len=16)),
        ("llama-3.1-8b", dict(kv_cache_memory_bytes=2 * GIB, max_model_len=131072)),  # too small: refused
        ("qwen3-8b", dict(kv_cache_memory_bytes=10 * GIB, max_model_len=40960)),
        ("deepseek-v3", dict(kv_cache_memory_bytes=80_000_000_000, max_model_len=163840)),
        ("deepseek-v3", dict(tp=4, dcp=4)),
        ("deepseek-v3", dict(tp=8, dcp=8, kv_cache_dtype="fp8")),
        ("deepseek-v3", dict(tp=8, dcp=2, max_model_len=100_001)),
        ("gen-mla-small", dict(tp=2, dcp=2, max_model_len=65536)),
        ("gen-gqa-20x16x4x128", dict(tp=8, dcp=2)),
        ("gen-mqa-18x8x1x256", dict(tp=4, dcp=4, max_model_len=77777)),
        ("gpt-oss-20b", dict(max_num_batched_tokens=2048)),
        ("gpt-oss-20b", dict(max_num_batched_tokens=16384, async_scheduling=False)),
        ("gpt-oss-20b", dict(max_model_len=131072, kv_cache_memory_bytes=80_000_000_000)),
        ("gpt-oss-20b", dict(max_model_len=4096)),
        ("gpt-oss-120b", dict(max_model_len=131072)),
        ("gemma-3-27b", dict(max_model_len=131072)),
        ("gemma-3-27b", dict(max_num_batched_tokens=2048, async_scheduling=False)),
        ("gemma-3-27b", dict(max_model_len=2048, kv_cache_memory_bytes=GIB)),
        ("gen-swa-all-w4096", dict(max_model_len=4096)),
        ("gen-swa-all-w4096", dict(max_model_len=131072, max_num_batched_tokens=512)),
        ("gen-swa-5to1-w1024", dict(max_num_batched_tokens=1024, async_scheduling=False)),
        ("gen-swa-1full-7sw-w8000", dict(max_model_len=8000)),
        ("qwen3-next-80b-a3b", dict(max_model_len=262144)),
        ("qwen3-next-80b-a3b", dict(max_model_len=1000, kv_cache_memory_bytes=3 * GIB)),
        ("jamba-v0.1", dict(max_model_len=262144, kv_cache_memory_bytes=80_000_000_000)),
        ("gen-gdn-hybrid-i3", dict(max_model_len=131072, kv_cache_memory_bytes=5 * GIB)),
        ("gen-mamba1-hybrid-p4", dict(max_model_len=8192, kv_cache_memory_bytes=GIB)),
        ("gen-mamba2-nemotronh", dict(max_model_len=100_000, kv_cache_memory_bytes=7 * GIB)),
        ("gen-shortconv-lfm2", dict(max_model_len=128000, kv_cache_memory_bytes=GIB)),
        ("qwen3-8b", dict(max_model_len=40961)),  # above the model's length: refused
        ("gen-mha-12x8x64", dict(kv_cache_memory_bytes=300_000)),  # under one block: refused
    ]
    for name, change in extra:
        c = dict(base, model=name, kv_cache_dtype="auto", tp=1, max_model_len=min(32768, lens[name]))
        c.update(change)
        yield c


def case_id(c: dict) -> str:
    return (f"{c['model']}|{c['kv_cache_dtype']}|tp{c['tp']}|dcp{c['dcp']}|mem{c['kv_cache_memory_bytes']}"
            f"|len{c['max_model_len']}|mbt{c['max_num_batched_tokens']}|pc{int(c['prefix_caching'])}"
            f"|async{int(c['async_scheduling'])}")


def main(out_path: str) -> int:
    t0 = time.time()
    quiet_import()
    models = {name: catalog_config(name) for name in sorted(p.stem for p in MODELS.glob("*.json"))
              if name not in NOT_EXPRESSED}
    generated = generated_configs()
    models.update(generated)
    lens = {name: derived_max_model_len(cfg) for name, cfg in models.items()}
    records = []
    only = sys.argv[2] if len(sys.argv) > 2 else ""  # a substring of case ids: run those only (debugging)
    for case in cases(models, lens):
        if only not in case_id(case):
            continue
        rec = dict(id=case_id(case), **case)
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                rec["vllm"] = run_case(case, copy.deepcopy(models[case["model"]]))
        except (ValueError, AssertionError, NotImplementedError) as e:  # what vLLM refuses, recorded as refused
            rec["refused"] = f"{type(e).__name__}: " + " ".join(str(e).split())[:600]
        records.append(rec)
        print(f"{rec['id']}: " + (rec["vllm"]["logged"] if "vllm" in rec else rec["refused"]), file=sys.stderr)
    import vllm
    fixture = dict(
        about="vLLM's KV-cache plan per case, from tests/oracles/vllm_capacity.py (its docstring names the vLLM code "
              "called); compared with kvlab.serving.vllm_plan by tests/test_vllm_capacity.py",
        vllm_version=vllm.__version__, gpu="H200 (SM90): FLASH_ATTN / FLASH_ATTN_MLA / FLASHMLA backends",
        generated_configs=generated, derived_max_model_len=lens,
        not_expressed=NOT_EXPRESSED, cases=records)
    text = json.dumps({k: v for k, v in fixture.items() if k != "cases"}, indent=1)[:-2]  # one case a line
    text += ',\n "cases": [\n' + ",\n".join(json.dumps(r, separators=(",", ":")) for r in records) + "\n ]\n}\n"
    json.loads(text)
    Path(out_path).write_text(text)
    print(f"{len(records)} cases ({sum('refused' in r for r in records)} refused) in {time.time() - t0:.0f} s "
          f"-> {out_path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else str(ROOT / "tests" / "fixtures" / "vllm_capacity.json")))
