"""Mamba hybrids: Jamba (Mamba-1 layers) and the Mamba-2 hybrids Nemotron-H, Bamba, Granite 4.0-H and Falcon-H1.

Jamba (`attn_layer_period` / `attn_layer_offset`: layer i is attention when i % period == offset): a Mamba-1
layer keeps a conv state of intermediate = mamba_expand x hidden_size channels x mamba_d_conv columns and an SSM
state of intermediate x mamba_d_state.

Mamba-2 (Nemotron-H's `hybrid_override_pattern` M / * / - / E or `layers_block_type`; Bamba's
`attn_layer_indices`; Granite's `layer_types`; Falcon-H1: every layer runs attention and Mamba-2 side by side):
conv state (heads x head_dim + 2 x n_groups x d_state) channels x d_conv columns, SSM state heads x head_dim x
d_state.

transformers keeps the conv state in the model dtype with d_conv columns and the SSM state in float32 (its
reference scans compute it in float32); vLLM keeps d_conv - 1 columns, the SSM state in mamba_ssm_cache_dtype
(the model dtype by default; Nemotron-H reads its config's mamba_ssm_cache_dtype, float32 when absent:
vllm/model_executor/models/config.py NemotronHForCausalLMConfig), and under TP replicates the groups to the ranks
when n_groups does not divide them (mamba_utils.py extra_groups_for_head_shards).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError
from ..layout import Part
from ..models import cfg_int, cfg_int_list
from ..registry import register
from .hybrid import HybridFamily, conv_part, divide, listed_kinds

PATTERN = {"M": "linear", "*": "attention", "-": "none", "E": "none"}  # Nemotron-H's hybrid_override_pattern


@dataclass(frozen=True)
class Mamba1Dims:
    """One Mamba-1 layer's state dimensions."""

    intermediate: int  # mamba_expand x hidden_size: conv channels and SSM rows
    d_state: int  # mamba_d_state
    d_conv: int  # mamba_d_conv


@dataclass(frozen=True)
class Mamba2Dims:
    """One Mamba-2 layer's state dimensions."""

    heads: int  # SSM heads
    head_dim: int  # channels per head
    n_groups: int  # B / C groups
    d_state: int  # state size
    d_conv: int  # conv kernel
    vllm_ssm_dtype: str | None  # vLLM's SSM-state dtype for this model (None: the model dtype)

    @property
    def intermediate(self) -> int:
        return self.heads * self.head_dim


def _auto_int(c: dict, key: str, name: str, auto: int) -> int:
    """An integer field that may be "auto" (Bamba / Falcon-H1 derive it)."""
    return auto if c.get(key) in (None, "auto") else cfg_int(c, key, name)


@register
class Jamba(HybridFamily):
    name = "jamba"
    description = "Jamba: Mamba-1 layers + GQA attention every attn_layer_period layers"
    model_types = ("jamba",)
    state_source = "transformers jamba: conv model dtype, SSM float32; vLLM mamba1_state_shape"
    sources = "ai21labs Jamba config.json; transformers models/jamba; vLLM mamba_utils.py"

    def kinds(self, c, n, name):
        kinds = listed_kinds(c, n, name)
        if kinds is not None:
            return kinds
        period = cfg_int(c, "attn_layer_period", name, default=8)
        offset = cfg_int(c, "attn_layer_offset", name, default=4, minimum=0)
        if offset >= period:
            raise ConfigError(f"{name}: 'attn_layer_offset' ({offset}) must be smaller than 'attn_layer_period' "
                              f"({period})")
        return tuple("attention" if i % period == offset else "linear" for i in range(n))

    def parse_linear(self, c, name, common):
        hidden = cfg_int(c, "hidden_size", name)
        return Mamba1Dims(cfg_int(c, "mamba_expand", name, default=2) * hidden,
                          cfg_int(c, "mamba_d_state", name, default=16), cfg_int(c, "mamba_d_conv", name, default=4))

    def state_parts(self, spec, scheme, tp):
        d: Mamba1Dims = spec.linear
        rows = divide(spec.name, "Mamba channels", d.intermediate, tp)
        model = self.state_format(spec, scheme, None, "torch_dtype")
        ssm = self.state_format(spec, scheme, "float32" if scheme == "storage" else None, "mamba_ssm_cache_dtype")
        return [conv_part(rows, d.d_conv, scheme, model), Part("ssm", rows * d.d_state, ssm)]


@register
class Mamba2Hybrid(HybridFamily):
    name = "mamba2_hybrid"
    description = "Mamba-2 hybrids (Nemotron-H, Bamba, Granite 4.0-H, Falcon-H1): Mamba-2 + GQA attention"
    model_types = ("nemotron_h", "bamba", "granitemoehybrid", "falcon_h1")
    state_source = "transformers nemotron_h / bamba / falcon_h1: conv model dtype, SSM float32; vLLM mamba2_state_shape"
    vllm_checkpoint_block = True  # layers/mamba/mamba_mixer2.py get_kv_cache_spec: num_prefill_checkpoint_blocks=1
    sources = "Nemotron-H / Bamba / Granite / Falcon-H1 config.json; transformers; vLLM mamba_utils.py"

    def kinds(self, c, n, name):
        mt = c.get("model_type")
        if mt == "falcon_h1":  # attention and Mamba-2 side by side in every layer
            return ("hybrid",) * n
        kinds = listed_kinds(c, n, name)
        if kinds is not None:
            return kinds
        pattern = c.get("hybrid_override_pattern")
        if pattern is not None:
            if not isinstance(pattern, str) or len(pattern) < n or any(ch not in PATTERN for ch in pattern[:n]):
                raise ConfigError(f"{name}: 'hybrid_override_pattern' must give each of the {n} layers one of "
                                  f"{', '.join(PATTERN)} (Mamba-2, attention, MLP, MoE), got {str(pattern)[:60]!r}")
            return tuple(PATTERN[ch] for ch in pattern[:n])
        if c.get("attn_layer_indices") is not None:  # Bamba
            ids = set(cfg_int_list(c, "attn_layer_indices", name))
            return tuple("attention" if i in ids else "linear" for i in range(n))
        raise ConfigError(f"{name}: a {mt} config needs 'layer_types', 'hybrid_override_pattern' or "
                          "'attn_layer_indices' to tell attention layers from Mamba-2 layers")

    def parse_linear(self, c, name, common):
        if c.get("model_type") == "nemotron_h":
            ssm = c.get("mamba_ssm_cache_dtype", "float32")  # vLLM's NemotronH hook: the config's, else float32
            return Mamba2Dims(cfg_int(c, "mamba_num_heads", name), cfg_int(c, "mamba_head_dim", name),
                              cfg_int(c, "n_groups", name, default=8), cfg_int(c, "ssm_state_size", name),
                              cfg_int(c, "conv_kernel", name, default=cfg_int(c, "mamba_d_conv", name, default=4)),
                              ssm if isinstance(ssm, str) else "float32")
        hidden = cfg_int(c, "hidden_size", name)
        inner = _auto_int(c, "mamba_d_ssm", name, cfg_int(c, "mamba_expand", name, default=2) * hidden)
        heads = cfg_int(c, "mamba_n_heads", name)
        if inner % heads:
            raise ConfigError(f"{name}: the Mamba width ({inner}) is not divisible by 'mamba_n_heads' ({heads})")
        return Mamba2Dims(heads, _auto_int(c, "mamba_d_head", name, inner // heads),
                          cfg_int(c, "mamba_n_groups", name, default=1), cfg_int(c, "mamba_d_state", name),
                          cfg_int(c, "mamba_d_conv", name, default=4), None)

    def state_parts(self, spec, scheme, tp):
        d: Mamba2Dims = spec.linear
        heads = divide(spec.name, "Mamba-2 heads", d.heads, tp)
        if d.n_groups > tp:
            divide(spec.name, "Mamba-2 groups", d.n_groups, tp)
        groups = d.n_groups if d.n_groups % tp == 0 else tp  # vLLM: fewer groups than ranks are replicated to tp
        model = self.state_format(spec, scheme, None, "torch_dtype")
        ssm = self.state_format(spec, scheme, "float32" if scheme == "storage" else d.vllm_ssm_dtype,
                                "mamba_ssm_cache_dtype")
        channels = (d.intermediate + 2 * groups * d.d_state) // tp
        return [conv_part(channels, d.d_conv, scheme, model), Part("ssm", heads * d.head_dim * d.d_state, ssm)]
