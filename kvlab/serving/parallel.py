"""KV cache per GPU under parallelism: tensor (TP), decode-context (DCP), pipeline (PP) and data-parallel attention.

The per-GPU figure is not the whole-model figure divided by the GPUs. vLLM's rules, applied per component by
each family (kvlab.families: `Family.splits` names the rule and its source for every cached role):
  TP   KV heads are split over the ranks, and replicated when there are fewer KV heads than ranks
       (vllm/config/model.py get_num_kv_heads: max(1, kv_heads // tp)); an MLA latent and DeepSeek V4's shared
       K=V entry are replicated on every rank (get_num_kv_heads: `if self.use_mla: return 1`); linear-attention /
       SSM state is split by heads and channels (mamba_utils.py MambaStateShapeCalculator)
  DCP  decode context parallelism interleaves the growing entries over the ranks of a TP group (token t on rank
       t mod dcp; vLLM docs/serving/context_parallel_deployment.md), which the family allows per component:
       windows, compressor tails, V4's indexer keys, V3.2's indexer keys and linear states stay whole
  PP   each stage holds its own layers; vLLM gives every stage num_layers // pp layers and spreads the remainder
       over the stages before the last, from the second-to-last backwards (vllm/distributed/utils.py
       get_pp_indices), unless VLLM_PP_LAYER_PARTITION says otherwise
  DP attention  each rank runs attention for its own sessions with the whole per-token KV (attention TP 1);
       MoE layers stay expert-parallel across the ranks (SGLang --enable-dp-attention, vLLM data parallel)
`per_gpu` reports the most any one GPU holds per token, beside the unchanged whole-model figures.
"""
from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from ..checks import need_int, need_type
from ..engines import Allocation, allocate
from ..errors import ParameterError
from ..layout import Shard, stage_sizes
from ..models import load_model

DP_ATTENTION_SOURCE = ("SGLang --enable-dp-attention (docs: data-parallel attention) / vLLM data parallel: each rank "
                       "holds whole sessions, MoE experts stay expert-parallel")


@dataclass(frozen=True)
class Parallelism:
    """How a deployment spreads a model over GPUs."""

    tp: int = 1  # tensor-parallel size (with dp_attention: the ranks, each running attention on its own sessions)
    dcp: int = 1  # decode-context-parallel size inside each TP group
    pp: int = 1  # pipeline stages
    dp_attention: bool = False  # data-parallel attention over the tp ranks (attention TP 1 per rank)

    def __post_init__(self):
        need_int("tp", self.tp, 1)
        need_int("dcp", self.dcp, 1)
        need_int("pp", self.pp, 1)
        need_type("dp_attention", self.dp_attention, bool, "True or False")
        if self.tp % self.dcp:
            raise ParameterError(f"DCP {self.dcp} must divide TP {self.tp}: decode context parallelism reuses the ranks "
                                 "of a TP group (vllm/config/parallel.py: tp_size must be divisible by dcp_size)")
        if self.dp_attention and (self.dcp > 1 or self.pp > 1):
            raise ParameterError("data-parallel attention gives each rank whole sessions: combine it with TP only, "
                                 f"not with DCP {self.dcp} / PP {self.pp}")

    @property
    def gpus(self) -> int:
        return self.tp * self.pp

    @property
    def attention_tp(self) -> int:
        """Ranks one session's attention is split over (1 under DP attention)."""
        return 1 if self.dp_attention else self.tp

    @property
    def sessions_spread(self) -> bool:
        """True when one session's KV spans all the GPUs (TP / DCP / PP); False when each GPU holds its own."""
        return not self.dp_attention

    def shard(self, stage: int = 0) -> Shard:
        return Shard(self.attention_tp, self.dcp, self.pp, stage)

    def label(self) -> str:
        if self.dp_attention:
            return f"DP attention {self.tp}" if self.tp > 1 else "1 GPU"
        parts = [f"TP {self.tp}"] + ([f"DCP {self.dcp}"] if self.dcp > 1 else []) + (
            [f"PP {self.pp}"] if self.pp > 1 else [])
        return " + ".join(parts) if self.gpus > 1 else "1 GPU"


ONE_GPU = Parallelism()


@dataclass(frozen=True)
class PerGpu:
    """A model's KV on the GPUs of one deployment: the whole model and each pipeline stage's GPU."""

    parallel: Parallelism  # the deployment
    whole: Allocation  # the whole model (every figure as without parallelism)
    stages: tuple[Allocation, ...]  # one GPU of each pipeline stage (TP ranks of a stage hold the same)
    components: tuple[dict, ...]  # per cached role: how TP and DCP treat it, with the source

    @property
    def busiest(self) -> Allocation:
        """The stage GPU holding the most bytes per token."""
        return max(self.stages, key=lambda a: a.bytes_per_token)

    @property
    def per_gpu_bytes_per_token(self) -> Fraction:
        """The most any one GPU holds per token of context (engine allocation, padding included)."""
        return self.busiest.bytes_per_token

    @property
    def per_gpu_exact_bytes_per_token(self) -> Fraction:
        return max(a.layout.bytes_per_token for a in self.stages)

    def session_bytes(self, tokens: int) -> int:
        """The most any one GPU holds for one session of `tokens` tokens."""
        return max(a.session(tokens).total for a in self.stages)


def split_key(family, c) -> str:
    """The `Family.splits` key of a component: its role, 'window' for a dense sliding window, 'state', 'tail'."""
    if c.state:
        return "state"
    if c.tail_of is not None:
        return "tail"
    if c.window is not None and "window" in family.splits and c.role in ("k", "v"):
        return "window"
    return c.role


def describe_splits(whole: Allocation, stage: Allocation, parallel: Parallelism) -> tuple[dict, ...]:
    """One row per cached role: bytes per token and per GPU, how TP and DCP treat it, with the source."""
    fam = whole.layout.family
    out: dict[str, dict] = {}
    per_gpu = {}
    for _, c in stage.layout.components():
        per_gpu.setdefault(split_key(fam, c), c)
    for _, c in whole.layout.components():
        key = split_key(fam, c)
        if key in out:
            continue
        rule = fam.splits.get(key)
        g = per_gpu.get(key)
        row = dict(component=key, grows=c.grows, copies=c.copies, copies_per_gpu=g.copies if g else 0,
                   entry_bytes=c.entry_bytes, entry_bytes_per_gpu=g.entry_bytes if g else 0,
                   tp="replicated on every TP rank" if rule and rule.tp == "replicated" else
                   "split over TP ranks (replicated when fewer heads than ranks)",
                   dcp=("interleaved over DCP ranks" if rule and rule.dcp else "whole on every DCP rank")
                   if c.grows else "whole on every DCP rank (bounded)",
                   source=rule.source if rule else "")
        if parallel.dp_attention:
            row["tp"] = "whole on every rank (DP attention: each rank its own sessions)"
            row["source"] = DP_ATTENTION_SOURCE
        out[key] = row
    return tuple(out.values())


def per_gpu(model, parallel: Parallelism = ONE_GPU, scheme: str | None = None, kv_format=None, engine=None, *,
            k_format=None, v_format=None, page_size: int | None = None) -> PerGpu:
    """A model's KV on one deployment: the whole-model allocation and each pipeline stage's GPU."""
    need_type("parallel", parallel, Parallelism, "a kvlab.serving.parallel.Parallelism")
    spec = load_model(model)
    kw = dict(k_format=k_format, v_format=v_format, page_size=page_size)
    whole = allocate(spec, scheme, kv_format, engine, **kw)
    stage_sizes(spec.num_layers, parallel.pp)  # refuses more stages than layers
    stages = tuple(allocate(spec, scheme, kv_format, engine, shard=parallel.shard(s), **kw) for s in range(parallel.pp))
    return PerGpu(parallel, whole, stages, describe_splits(whole, stages[0], parallel))
