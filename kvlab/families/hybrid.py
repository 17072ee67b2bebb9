"""Shared machinery of the hybrid families: attention layers whose KV grows, beside linear-attention / SSM layers
whose convolution and recurrent state has a fixed size per sequence.

A hybrid family module says which layers are which (from the config's `layer_types`, or its own pattern
fields), the dimensions of its linear layer, and the shapes and dtypes of that layer's state under each scheme:
  storage  what transformers' own cache holds after a forward pass (transformers 5.24 cache_utils.py
           LinearAttentionLayer: conv_states with `kernel` columns in the model dtype, recurrent_states as the
           family's kernel returns them, float32 for Gated DeltaNet, Mamba and KDA)
  vllm     vLLM's MambaSpec shapes (vllm/model_executor/layers/mamba/mamba_utils.py MambaStateShapeCalculator:
           conv state of `kernel - 1` columns; MambaStateDtypeCalculator: mamba_cache_dtype for the conv state,
           mamba_ssm_cache_dtype for the recurrent one, both the model dtype unless set)
  bf16     transformers' shapes, everything in BF16
`kv_format` / `k_format` / `v_format` apply to the attention layers' K and V; the states keep their dtypes.

Under tensor parallelism vLLM splits the state's heads and channels over the ranks (divide(): the counts must
divide); under decode context parallelism the states stay whole on every rank (SGLang's DCP documentation: on
Kimi, "request-indexed KDA state is unchanged"); pipeline stages hold their own layers' states.
vLLM's hybrid allocator enlarges the attention block until one attention page holds a layer's state and pads the
state page to it (vllm/platforms/interface.py _align_hybrid_block_size). With prefix caching (vLLM's default) the
state is kept in mamba_cache_mode 'align' (model_executor/models/config.py MambaModelConfig), and the block is
also a multiple of the prefill checkpoint alignment of layers that export checkpoints from inside a prefill
(`vllm_checkpoint_alignment`: Gated DeltaNet on SM90, 64); without it, mode 'none'. How many state pages a request
reserves in each mode is kvlab.serving.vllm_plan's concern.
"""
from __future__ import annotations

from fractions import Fraction
from math import lcm

from ..checks import cdiv
from ..engines import Engine
from ..errors import ConfigError, ParameterError
from ..formats import Format, get_format
from ..layout import Component, Entry, LayerCache, Part
from ..models import ModelSpec, cfg_int
from .base import VLLM_DCP_DOC, VLLM_KV_HEADS, Family, Split, check_heads, head_dim_of, kv_heads_of, named_dtype
from .dense import attention_layer, check_dcp

KIND_NAMES = {  # layer-type names across transformers' layer_types, legacy names and family patterns -> kind
    "full_attention": "attention", "attention": "attention",
    "linear_attention": "linear", "mamba": "linear", "conv": "linear",
    "hybrid": "hybrid",
    "mlp": "none", "moe": "none",
}
STATE_SPLIT = Split("heads", False,
                    "vllm/model_executor/layers/mamba/mamba_utils.py MambaStateShapeCalculator: heads and channels "
                    "divide(tp); SGLang docs advanced_features/dcp.md: DCP leaves request-indexed (KDA) state "
                    "unchanged")
VLLM_HYBRID = ("vllm/platforms/interface.py _align_hybrid_block_size: attention block = alignment x "
               "cdiv(state page, alignment x attention page of one token), rounded up to the backends' kernel block, "
               "state page padded to the attention page; vllm/v1/kv_cache_interface.py MambaSpec")
VLLM_MLA_HYBRID_BLOCK = 128  # _align_hybrid_block_size: an MLA hybrid's block is a multiple of 128


def layer_kinds_from(types, n: int, name: str, field: str) -> tuple[str, ...]:
    """Kinds from a list of per-layer type names (transformers' layer_types, or a legacy layers_block_type)."""
    if not isinstance(types, list) or len(types) < n:
        raise ConfigError(f"{name}: {field!r} must list one type per layer ({n})")
    bad = [(i, t) for i, t in enumerate(types[:n]) if not isinstance(t, str) or t not in KIND_NAMES]
    if bad:
        raise ConfigError(f"{name}: {field!r} gives layer {bad[0][0]} the type {bad[0][1]!r}; a hybrid layer is one "
                          f"of {', '.join(KIND_NAMES)}")
    return tuple(KIND_NAMES[t] for t in types[:n])


def listed_kinds(c: dict, n: int, name: str) -> tuple[str, ...] | None:
    """Kinds from `layer_types` or `layers_block_type` when the config lists them, else None."""
    for field in ("layer_types", "layers_block_type"):
        if c.get(field) is not None:
            return layer_kinds_from(c[field], n, name, field)
    return None


def conv_part(channels: int, kernel: int, scheme: str, fmt: Format) -> Part:
    """A causal-convolution state: `channels` x its width (transformers keeps `kernel` columns, vLLM kernel - 1)."""
    return Part("conv", channels * (kernel - 1 if scheme == "vllm" else kernel), fmt)


def divide(name: str, what: str, n: int, tp: int) -> int:
    """n / tp, or a clear error (vLLM's divide() asserts an even split)."""
    if n % tp:
        raise ParameterError(f"{name}: {n} {what} cannot be split over TP {tp} (vLLM splits them evenly: "
                             f"vllm/model_executor/layers/mamba/mamba_utils.py MambaStateShapeCalculator)")
    return n // tp


class HybridFamily(Family):
    """Attention + linear-attention / SSM layers. Subclasses give model_types, kinds(), parse_linear() and
    state_parts()."""

    order = 300  # before MLA: Kimi Linear's attention layers are MLA
    model_types: tuple[str, ...] = ()  # the configs' model_type values this family claims
    # vLLM in 'align' mode (prefix caching): a linear layer whose spec holds one prefill checkpoint block beside its
    # two state blocks, and the token alignment of those checkpoints that the block size must be a multiple of
    # (None: the layers report none; layers/mamba/abstract.py get_mamba_prefill_checkpoint_alignment)
    vllm_checkpoint_block: bool = False
    vllm_checkpoint_alignment: int | None = None
    recipes = {"storage": {"kv": (("all", None),)}, "vllm": {"kv": (("all", None),)}}
    splits = {"k": Split("heads", True, f"{VLLM_KV_HEADS}; {VLLM_DCP_DOC}"),
              "v": Split("heads", True, f"{VLLM_KV_HEADS}; {VLLM_DCP_DOC}"),
              "state": STATE_SPLIT}
    state_source = ""  # where the state's shapes and dtypes come from

    def detect(self, cfg: dict) -> bool:
        return cfg.get("model_type") in self.model_types

    # --- what subclasses provide ------------------------------------------------------------------------
    def kinds(self, c: dict, n: int, name: str) -> tuple[str, ...]:
        kinds = listed_kinds(c, n, name)
        if kinds is None:
            raise ConfigError(f"{name}: config has no 'layer_types' to tell attention layers from linear ones")
        return kinds

    def parse_linear(self, c: dict, name: str, common: dict):
        raise NotImplementedError

    def state_parts(self, spec, scheme: str, tp: int) -> list[Part]:
        """The parts of one linear layer's state on one TP rank under a scheme."""
        raise NotImplementedError

    # --- shared ---------------------------------------------------------------------------------------
    def parse(self, c: dict, name: str, common: dict):
        kinds = self.kinds(c, common["num_layers"], name)
        heads = cfg_int(c, "num_attention_heads", name)
        return ModelSpec(family=self.name, num_heads=heads, num_kv_heads=kv_heads_of(c, name, heads),
                         head_dim=head_dim_of(c, name, heads, common["hidden_size"]), layer_kinds=kinds,
                         linear=self.parse_linear(c, name, common), **common)

    def state_format(self, spec, scheme: str, dtype: str | None, field: str) -> Format:
        """A state's format: BF16 under the bf16 scheme, else the named dtype (None: the model's)."""
        return get_format("bf16") if scheme == "bf16" else named_dtype(spec, dtype, field)

    def check_shard(self, spec, shard) -> None:
        super().check_shard(spec, shard)
        check_heads(spec.name, "KV heads", spec.num_kv_heads, shard.tp)
        check_dcp(spec, spec.num_kv_heads, shard)

    def attention(self, spec, scheme, fmts, shard, index: int) -> LayerCache:
        return attention_layer(self, spec, scheme, fmts, shard, index, None, spec.num_kv_heads, spec.head_dim)

    def build(self, spec, scheme, fmts, shard):
        self.check_shard(spec, shard)
        state = Component("state", Entry(tuple(self.state_parts(spec, scheme, shard.tp))), state=True)
        layers = []
        for i, kind in enumerate(spec.layer_kinds):
            comps: tuple = ()
            if kind in ("attention", "hybrid"):
                comps = self.attention(spec, scheme, fmts, shard, i).components
            if kind in ("linear", "hybrid"):
                comps = comps + (state,)
            layers.append(LayerCache(i, {"attention": "full", "none": "mlp"}.get(kind, kind), comps))
        n_att = sum(k in ("attention", "hybrid") for k in spec.layer_kinds)
        n_lin = sum(k in ("linear", "hybrid") for k in spec.layer_kinds)
        notes = [f"{n_att} attention layers grow with context; {n_lin} linear-attention / SSM layers keep a fixed-size "
                 f"state per sequence ({state.entry.describe()}; {self.state_source})"]
        return layers, notes

    def engine(self, layout, name, page_size=None, prefix_caching=True) -> Engine:
        if name != "vllm":
            return super().engine(layout, name, page_size)
        return hybrid_vllm_engine(layout, 16, checkpoint=self.vllm_checkpoint_alignment if prefix_caching else None)


def hybrid_vllm_engine(layout, kernel_block: int, mla: bool = False, checkpoint: int | None = None) -> Engine:
    """vLLM's hybrid allocator for a layout (vllm/platforms/interface.py _align_hybrid_block_size): with
    a = the attention backend's kernel block (an MLA hybrid's at least 128; in 'align' mode also a multiple of the
    layers' prefill `checkpoint` alignment), the attention block is a x cdiv(state page, a x one token's attention
    page of one layer), rounded up to a multiple of the kernel block, and each state page is padded to that block's
    attention page."""
    att = next((l for l in layout.layers if any(c.grows for c in l.components)), None)
    state = next((c for _, c in layout.components(False) if c.state), None)
    if att is None or state is None:  # no attention (or no state) on this GPU: plain pages
        return Engine("vllm", kernel_block, 1, VLLM_HYBRID)
    per_token = sum(Fraction(c.entry_bytes, c.ratio) for c in att.components if c.grows)  # physical rows
    if per_token.denominator != 1:
        raise ParameterError(f"{layout.model.name}: an attention page of {per_token} B per token is not whole bytes")
    per_token = int(per_token)
    align = max(kernel_block, VLLM_MLA_HYBRID_BLOCK) if mla else kernel_block
    if checkpoint is not None:
        align = lcm(align, checkpoint)
    block = align * cdiv(state.entry_bytes, align * per_token)
    block = kernel_block * cdiv(block, kernel_block)
    why = f", a multiple of the {checkpoint}-token prefill checkpoints ('align' mode)" if checkpoint else ""
    return Engine("vllm", block, 1, f"{VLLM_HYBRID} (block {block} tokens{why}, state page {block * per_token:,} B)",
                  state_page=block * per_token)

