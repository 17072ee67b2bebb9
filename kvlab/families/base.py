"""What every family module provides: the `Family` base class and the helpers its layer builders share.

A family is one class with (in this order of use):
  detect(cfg)        does this config belong to the family (its model_type, or the fields only it has)
  parse(cfg, ...)    the validated ModelSpec of a config (every field check names the field)
  recipes / align    which number format each cached role takes under each scheme, and entry byte alignment
  build(...)         the layers of a Layout under a scheme, format overrides and a Shard (one GPU's part)
  splits             per role, how tensor and decode-context parallelism treat it, with the source
  engine(...)        the paging rule each serving engine applies to it
  replay_window      tokens a host-cache miss replays (V4.1's bounded sliding-window replay)
  explain(layout)    the step-by-step derivation of its bytes per token
as transformers maps a config's `layer_types` to cache-layer classes and gpt-fast keeps its named presets in
one table: a new family is one new module (and its tests).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..engines import Engine, sglang, trtllm
from ..errors import ConfigError, NoEngineLayout, ParameterError, UnknownFormatError
from ..formats import Format, dtype_format, get_format
from ..layout import Entry, KVPlan, Part, Shard
from ..models import ModelSpec, cfg_int

SCHEMES = ("storage", "vllm", "bf16")


@dataclass(frozen=True)
class Split:
    """How one cached role is spread over the GPUs of a deployment."""

    tp: str  # "heads": split over TP ranks, replicated when there are fewer heads than ranks; "replicated"
    dcp: bool  # True: entries interleaved over decode-context-parallel ranks; False: every DCP rank holds them all
    source: str  # where the rule comes from (engine source path, documentation, pull request)


VLLM_KV_HEADS = ("vllm/config/model.py ModelConfig.get_num_kv_heads: max(1, total_num_kv_heads // tp); "
                 "vllm/model_executor/layers/linear.py QKVParallelLinear: heads divide(tp), replicated tp / kv_heads "
                 "times when fewer")
VLLM_DCP_DOC = ("vLLM docs/serving/context_parallel_deployment.md: DCP interleaves tokens over the ranks of a TP "
                "group, dcp in [1, tp / kv_heads]")
VLLM_MLA_TP = "vllm/config/model.py ModelConfig.get_num_kv_heads: `if self.use_mla: return 1` (every TP rank holds it)"


def shared_heads(heads: int, tp: int) -> int:
    """Heads one TP rank holds: heads / tp, or one (replicated) when there are fewer heads than ranks."""
    return max(1, heads // tp)


def check_heads(name: str, what: str, heads: int, tp: int) -> None:
    """vLLM splits heads with `divide`: heads % tp == 0, or (fewer heads than ranks) tp % heads == 0."""
    ok = heads % tp == 0 if heads >= tp else tp % heads == 0
    if not ok:
        raise ParameterError(f"{name}: {heads} {what} cannot be spread over TP {tp}: vLLM splits them evenly "
                             f"(heads a multiple of TP) or replicates them (TP a multiple of the heads) "
                             f"(vllm/model_executor/layers/linear.py QKVParallelLinear)")


class Family:
    """Base of every model family (one subclass per module of kvlab/families, registered by name)."""

    name: str = ""  # registry key, also ModelSpec.family
    description: str = ""  # one line for tables and explanations
    order: int = 100  # detection order: families with more specific markers are asked first
    recipes: dict[str, dict[str, tuple]] = {}  # scheme -> role -> ((part, format name or None = model dtype), ...)
    align: dict[str, int] = {}  # role -> entry bytes rounded up to a multiple of this (own formats only)
    splits: dict[str, Split] = {}  # role -> how TP / DCP treat it
    vllm: Engine | None = None  # vLLM's paging rule (None: no published vLLM layout)
    split_formats: bool = True  # separate K / V formats make sense for this family
    sources: str = ""  # where the family's layout facts come from

    # --- config -> spec -------------------------------------------------------------------------------
    def detect(self, cfg: dict) -> bool:
        raise NotImplementedError

    def parse(self, cfg: dict, name: str, common: dict) -> ModelSpec:
        raise NotImplementedError

    # --- spec -> layers -------------------------------------------------------------------------------
    def build(self, spec: ModelSpec, scheme: str, fmts: KVPlan, shard: Shard):
        """(layers, notes) of this family's layout: one LayerCache per decoder layer, under a formats-only plan
        (`KVPlan.formats_only`: K and V formats, nothing held back)."""
        raise NotImplementedError

    def build_planned(self, spec: ModelSpec, scheme: str, plans: tuple):
        """(layers, notes) under one KVPlan per layer (residual, key groups, per-layer formats): what kvlab.hf's
        transformers cache holds. Dense and MLA families provide it."""
        raise ParameterError(f"{spec.name}: a residual, key groups and per-layer plans apply to dense and MLA "
                             f"models, not to a {self.name} model ({self.description})")

    def check_shard(self, spec: ModelSpec, shard: Shard) -> None:
        """Refuse a TP / DCP combination the engines refuse (each family adds its own rules)."""
        if shard.tp % shard.dcp:
            raise ParameterError(f"DCP {shard.dcp} must divide TP {shard.tp}: decode context parallelism reuses the "
                                 f"ranks of a TP group (vllm/config/parallel.py: tp_size must be divisible by "
                                 f"dcp_size)")
        if spec.num_heads and spec.num_heads % shard.tp:
            raise ParameterError(f"{spec.name}: {spec.num_heads} attention heads cannot be split over TP {shard.tp} "
                                 f"(vllm/config/model.py verify_with_parallel_config: heads must be divisible by "
                                 f"tensor_parallel_size)")

    def entry(self, spec: ModelSpec, scheme: str, role: str, dims: dict[str, int], fmt: Format | None) -> Entry:
        """The entry of `role` with part sizes `dims` under a scheme, or one override format for all of it."""
        if fmt is not None or scheme == "bf16":
            return Entry((Part(role, sum(dims.values()), fmt or get_format("bf16")),))
        recipe = self.recipes.get(scheme)
        if recipe is None:
            raise NoEngineLayout(f"{spec.name}: no published {scheme!r} layout for a {self.name} model "
                                 f"({self.description}); use one of: "
                                 f"{', '.join(s for s in SCHEMES if s in self.recipes or s == 'bf16')}")
        parts = []
        for part, fname in recipe[role]:
            n = sum(dims.values()) if part == "all" else dims[part]
            parts.append(Part(role if part == "all" else part, n,
                              dtype_of(spec) if fname is None else get_format(fname)))
        return Entry(tuple(parts), self.align.get(role, 1))

    def kv_entry(self, spec, scheme, role: str, dims: dict[str, int], fmts: KVPlan) -> Entry:
        """An entry of two parts, the first in the key format and the second in the value format when they
        differ (an MLA latent counts as keys, its RoPE key as values); an unset one keeps the scheme's format."""
        if fmts.same_formats:
            return self.entry(spec, scheme, role, dims, fmts.k_format)
        (kname, kdim), (vname, vdim) = dims.items()
        own = self.entry(spec, scheme, role, dims, None)
        by_name = {p.name: p.fmt for p in own.parts}
        return Entry((Part(kname, kdim, fmts.k_format or by_name.get(kname, own.parts[0].fmt)),
                      Part(vname, vdim, fmts.v_format or by_name.get(vname, own.parts[-1].fmt))))

    def refuse_split(self, spec: ModelSpec, fmts: KVPlan) -> None:
        if not fmts.same_formats and not self.split_formats:
            raise ParameterError(f"{spec.name}: separate key and value formats do not apply to a {self.name} model "
                                 f"({self.description}): its entries hold keys and values as one vector; give one "
                                 f"kv_format")

    # --- serving --------------------------------------------------------------------------------------
    def engine(self, layout, name: str, page_size: int | None = None, prefix_caching: bool = True) -> Engine:
        """The paging rule `name` applies to this family's layout (`prefix_caching`: vLLM's switch, which sets a
        hybrid's block size)."""
        if name == "vllm":
            if self.vllm is None:
                raise NoEngineLayout(f"{layout.model.name}: no published vLLM allocation for a {self.name} model "
                                     f"({self.description})")
            return self.vllm
        raise NoEngineLayout(f"{layout.model.name}: kvlab has no published {name} layout for a {self.name} model "
                             f"({self.description}); {name} is modelled for dense and MLA models "
                             f"(--engine vllm covers this family)")

    def attention_params(self, spec: ModelSpec) -> int | None:
        """Parameters of the attention projections (what data-parallel attention replicates on every rank), or
        None when the family does not say."""
        return None

    def replay_window(self, spec: ModelSpec) -> int:
        """Tokens a host-cache miss replays (0: nothing bounded to replay)."""
        return 0

    def explain(self, layout) -> list[str]:
        from ..explain import explain_layout
        return explain_layout(layout)


def dtype_of(spec: ModelSpec) -> Format:
    """The checkpoint dtype's format, or a ConfigError naming the model and the field."""
    try:
        return dtype_format(spec.torch_dtype)
    except UnknownFormatError as e:
        raise ConfigError(f"{spec.name}: {e}") from None


def named_dtype(spec: ModelSpec, dtype: str | None, field: str) -> Format:
    """A state dtype named in a config field (float32, bfloat16, ...), or the model's dtype when None."""
    if dtype is None:
        return dtype_of(spec)
    try:
        return dtype_format(dtype)
    except UnknownFormatError as e:
        raise ConfigError(f"{spec.name}: {field}: {e}") from None


def dense_engine(family: Family, layout, name: str, page_size: int | None, vllm: Engine | None = None) -> Engine:
    """SGLang's token pool and TensorRT-LLM's 32-token blocks: the rule both apply to dense and MLA caches;
    `vllm`: the family's vLLM rule for this layout (None: the family's `vllm`)."""
    if name == "sglang":
        return sglang(page_size)
    if name == "trtllm":
        return trtllm(page_size)
    if name == "vllm" and vllm is not None:
        return vllm
    return Family.engine(family, layout, name, page_size)


# --- attention config readers (kvlab.models holds the generic cfg_int ones; every failure names the field) ---------
def head_dim_of(c: dict, name: str, heads: int, hidden: int | None) -> int:
    """head_dim, or hidden_size / num_attention_heads when the config has no head_dim."""
    if c.get("head_dim") is not None:
        return cfg_int(c, "head_dim", name)
    if hidden is None:
        raise ConfigError(f"{name}: config is missing 'head_dim' (and 'hidden_size' to derive it)")
    if hidden % heads:
        raise ConfigError(f"{name}: 'hidden_size' ({hidden}) is not divisible by 'num_attention_heads' ({heads}), "
                          "so head_dim cannot be derived; add 'head_dim'")
    return hidden // heads


def kv_heads_of(c: dict, name: str, heads: int) -> int:
    kv = cfg_int(c, "num_key_value_heads", name, default=heads)
    if kv > heads or heads % kv:
        raise ConfigError(f"{name}: 'num_attention_heads' ({heads}) must be a multiple of 'num_key_value_heads' "
                          f"({kv}): each KV head serves a whole group of query heads (MHA, GQA or MQA)")
    return kv


__all__ = ["Family", "Split", "SCHEMES", "shared_heads", "check_heads", "dtype_of", "named_dtype",
           "dense_engine", "head_dim_of", "kv_heads_of"]
