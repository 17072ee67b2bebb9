"""Multi-head latent attention: DeepSeek-V2 / V3 (`mla`) and V3.2 with its DSA indexer keys (`mla_dsa`).

Per layer and token: one latent of `kv_lora_rank` plus the decoupled RoPE key (`qk_rope_head_dim`), shared by
every head; V3.2 adds an `index_head_dim` indexer key. The model's own storage is the checkpoint dtype (V2 / V3)
or FlashMLA's fp8_ds_mla entry (V3.2: FP8 latent with one FP32 scale per 128, BF16 RoPE = 656 B; FP8 indexer key
+ FP32 scale = 132 B; deepseek-ai/FlashMLA, vLLM).

Parallelism: the latent is replicated on every TP rank (vLLM decodes MLA as MQA) and DCP interleaves it over the
ranks of a TP group; V3.2's indexer keys stay whole on every rank (SGLang PR #18167 keeps them unsplit).
"""
from __future__ import annotations

from ..engines import VLLM_FLASHMLA, VLLM_MLA, Engine
from ..errors import ParameterError
from ..formats import get_format
from ..layout import Component, Entry, LayerCache, Part, split_residual, window_held
from ..models import ModelSpec, cfg_int
from ..registry import register
from .base import VLLM_DCP_DOC, VLLM_MLA_TP, Family, Split, dense_engine, dtype_of

V3_2_INDEXER_DCP = ("sgl-project/sglang PR #18167 (DCP for DeepSeek V3.2): the indexer's K cache is not sharded "
                    "across DCP ranks")
FP8_DS_MLA = (("latent", "fp8_e4m3_b128"), ("rope", "bf16"))  # 512 + 16 + 128 = 656 B (FlashMLA / vLLM)


@register
class Mla(Family):
    name = "mla"
    description = "Multi-head latent attention (DeepSeek-V2/V3): latent + decoupled RoPE key"
    order = 500
    recipes = {"storage": {"latent": (("latent", None), ("rope", None))},
               "vllm": {"latent": (("latent", None), ("rope", None))}}
    splits = {"latent": Split("replicated", True, f"{VLLM_MLA_TP}; {VLLM_DCP_DOC} (DeepSeek with -tp 8: "
                                                  "'8x KV cache duplication', removed by -dcp 8)")}
    vllm = VLLM_MLA
    sources = "DeepSeek-V2 / V3 config.json; vLLM's MLA backends"

    def detect(self, cfg: dict) -> bool:
        return cfg.get("kv_lora_rank") is not None and not cfg.get("index_head_dim")

    def parse(self, c: dict, name: str, common: dict):
        idx = cfg_int(c, "index_head_dim", name, required=False)
        return ModelSpec(
            family="mla_dsa" if idx else "mla",
            num_heads=cfg_int(c, "num_attention_heads", name),
            num_kv_heads=1,
            head_dim=cfg_int(c, "kv_lora_rank", name) + cfg_int(c, "qk_rope_head_dim", name),
            kv_lora_rank=cfg_int(c, "kv_lora_rank", name),
            qk_rope_head_dim=cfg_int(c, "qk_rope_head_dim", name),
            index_head_dim=idx,
            index_n_heads=cfg_int(c, "index_n_heads", name, required=False),
            index_topk=cfg_int(c, "index_topk", name, required=False),
            **common)

    def check_shard(self, spec, shard) -> None:
        super().check_shard(spec, shard)  # DCP divides TP; heads divide TP (dcp <= tp / 1 holds)

    def layer(self, spec, scheme, fmts, shard, index: int) -> LayerCache:
        """One MLA layer on one GPU: the whole latent (replicated over TP), its tokens interleaved over DCP; a
        window (a cache that keeps only the last tokens of an MLA model) bounds it, not interleaved."""
        lat = self.kv_entry(spec, scheme, "latent", {"latent": spec.kv_lora_rank, "rope": spec.qk_rope_head_dim},
                            fmts)
        window = window_held(spec.layer_windows[index] if spec.layer_windows else None)
        comps = [Component("latent", lat, window=window, interleave=shard.dcp if window is None else 1)]
        if spec.index_head_dim:
            comps.append(Component("index", self.entry(spec, scheme, "index", {"all": spec.index_head_dim},
                                                       fmts.k_format)))
        return LayerCache(index, "mla", tuple(comps))

    def build(self, spec, scheme, fmts, shard):
        self.check_shard(spec, shard)
        notes = ["MLA caches one latent (kv_lora_rank) plus the decoupled RoPE key per token per layer, shared by "
                 "all heads"]
        return [self.layer(spec, scheme, fmts, shard, i) for i in range(spec.num_layers)], notes

    def build_planned(self, spec, scheme, plans):
        """The latent per layer under its KVPlan: the K format for the latent, the V format for the RoPE key
        (what transformers caches as keys and values), a residual."""
        dims = {"latent": spec.kv_lora_rank, "rope": spec.qk_rope_head_dim}
        base = self.entry(spec, scheme, "latent", dims, None) if scheme != "bf16" else Entry(
            tuple(Part(n, k, get_format("bf16")) for n, k in dims.items()))
        layers = []
        windows = spec.layer_windows or (None,) * spec.num_layers  # (a cache that keeps a window of an MLA model)
        for i, p in enumerate(plans):
            if p.key_groups or p.value_groups:
                raise ParameterError(f"{spec.name}: per-channel groups (KIVI) apply to dense K and V; MLA caches a "
                                     "latent and a RoPE key, quantized per token (use key_axis='token')")
            if p.uniform and p.k_format is not None:
                lat = Entry((Part("latent", sum(dims.values()), p.k_format),))
            else:
                fmts = {"latent": p.k_format, "rope": p.v_format}
                lat = Entry(tuple(Part(q.name, q.elements, fmts.get(q.name) or q.fmt) for q in base.parts),
                            base.align)
            comps = list(split_residual(spec, "latent", lat, sum(dims.values()), 1, window_held(windows[i]), p,
                                        dtype_of(spec)))
            if spec.index_head_dim:
                comps.append(Component("index", self.entry(spec, scheme, "index", {"all": spec.index_head_dim}, None)))
            layers.append(LayerCache(i, "mla", tuple(comps)))
        notes = ["MLA caches one latent (kv_lora_rank) plus the decoupled RoPE key per token per layer, shared by "
                 "all heads; a K format applies to the latent, a V format to the RoPE key (what transformers caches "
                 "as keys and values)"]
        return layers, notes

    def engine(self, layout, name, page_size=None, prefix_caching=True):
        return dense_engine(self, layout, name, page_size, vllm_mla_engine(layout))

    def attention_params(self, spec):
        """DeepSeek-V2/V3 MLA projections per layer: q (through q_lora_rank when set), kv_a (latent + RoPE key),
        kv_b (latent -> per-head NoPE keys and values), o; V3.2's indexer projections are not counted."""
        c, h, d = spec.config, spec.num_heads, spec.hidden_size
        nope, v = c.get("qk_nope_head_dim"), c.get("v_head_dim")
        if not (isinstance(nope, int) and isinstance(v, int) and d):
            return None
        qk = nope + spec.qk_rope_head_dim
        ql = c.get("q_lora_rank")
        q = d * ql + ql * h * qk if isinstance(ql, int) and ql > 0 else d * h * qk
        kv = d * (spec.kv_lora_rank + spec.qk_rope_head_dim) + spec.kv_lora_rank * h * (nope + v)
        return spec.num_layers * (q + kv + h * v * d)


def vllm_mla_engine(layout) -> Engine:
    """vLLM's MLA backend on SM90 (vllm/platforms/cuda.py _get_backend_priorities): FLASH_ATTN_MLA (16-token blocks)
    unless the latent is quantized, which only FLASHMLA (64-token blocks) of the two stores."""
    quantized = any(p.fmt.element.bits < 16 for _, c in layout.components(True) if c.role == "latent"
                    for p in c.entry.parts)
    return VLLM_FLASHMLA if quantized else VLLM_MLA


@register
class MlaDsa(Mla):
    name = "mla_dsa"
    description = "MLA plus the DSA lightning-indexer key (DeepSeek-V3.2)"
    order = 490
    recipes = {"storage": {"latent": FP8_DS_MLA, "index": (("all", "fp8_e4m3_b128"),)},
               "vllm": {"latent": FP8_DS_MLA, "index": (("all", "fp8_e4m3_b128"),)}}
    splits = {**Mla.splits, "index": Split("replicated", False, f"{VLLM_MLA_TP}; {V3_2_INDEXER_DCP}")}
    vllm = VLLM_FLASHMLA  # the sparse MLA backends (FLASHMLA_SPARSE, 64-token blocks)
    sources = "DeepSeek-V3.2 config.json; deepseek-ai/FlashMLA fp8_ds_mla; vLLM"

    def detect(self, cfg: dict) -> bool:
        return cfg.get("kv_lora_rank") is not None and bool(cfg.get("index_head_dim"))

    def engine(self, layout, name, page_size=None, prefix_caching=True):
        return Family.engine(self, layout, name, page_size)  # vLLM only: SGLang / TRT-LLM DSA pools not modelled
