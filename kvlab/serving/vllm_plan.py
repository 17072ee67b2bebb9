"""vLLM's KV-cache plan: the block count and maximum concurrency vLLM 0.33 logs at start-up, from kvlab's layouts.

Two answers to two questions, each output naming which it is:
  reserved at admission  what vLLM plans with: the blocks one request of max_model_len tokens may claim in every KV
                         cache group, by which it divides its pool ("GPU KV cache size: N tokens, Maximum
                         concurrency for L tokens per request: C", `VllmPlan.logged`)
  held while decoding    the bytes one such request holds once it runs (kvlab.engines.Allocation.session: a
                         window's last W - 1 tokens, one state page per linear layer) -- `held_bytes`
The rules (vllm 0.33.0 as it runs on an SM90 GPU, H100 / H200), each with its source; tests/test_vllm_capacity.py
checks them, to the block, against what vLLM's own code computes (tests/oracles/vllm_capacity.py):
  specs        one per layer on one GPU (TP heads, DCP): full attention (MLA too), sliding window, or a linear
               layer's state; block size and pages from the family's vLLM rule (kvlab.engines, kvlab.families)
  pages        of one size on every layer: a linear layer's state page is padded to the attention page
               (kvlab.families.hybrid); vLLM's unify_kv_cache_spec_page_size for pages of other sizes, which no family
               here produces, is not modelled (refused)
  groups       one group when all layers are alike (same spec, or same kind, block and window); else layers of
               one spec in groups of equal size -- the smallest kind's count, or the largest's when that is under
               1.5 x the smallest -- the last group of a kind padded, each kind's layers dealt round-robin
               (layers[i::n]) (_get_kv_cache_groups_uniform_page_size)
  blocks       num_blocks = memory // (the widest group's layers x their pages): every group draws its blocks from
               one pool of blocks that size (get_kv_cache_config_from_groups, _get_kv_cache_bytes_per_block)
  per request full attention cdiv(cdiv(L, dcp), block); sliding window cdiv(min(W - 1 + tokens in flight, L),
               block) + 1, tokens in flight = max_num_batched_tokens x batches in flight (2 under async
               scheduling, vLLM's default; config/vllm.py max_in_flight_tokens); a linear layer's state 2 blocks
               (+ 1 prefill checkpoint block for GDN / Mamba-2) in 'align' mode (prefix caching on), 1 in 'none'
               (v1/kv_cache_interface.py max_memory_usage_bytes, SlidingWindowSpec.max_admission_blocks_per_request)
  concurrency  num_blocks / the sum over groups; GPU KV cache size int(concurrency x L) tokens
               (v1/core/kv_cache_utils.py get_max_concurrency_for_kv_cache_config, get_kv_cache_capacity)
  refusals     memory less one block (the null block the pool holds back) must hold one request
               (kv_cache_planning.py _check_enough_kv_cache_memory); max_model_len at most the model's
               (config/model.py _get_and_verify_max_len); DCP with a sliding window or a linear layer's state
Not modelled: pipeline parallelism (vLLM plans every stage and takes the smallest block count), speculative
decoding's extra blocks, block-outermost packing (only backends SM90 does not select for these layers declare
it), and the DeepSeek V3.2 / V4 / V4.1 caches (their specs are model-specific; see docs/guide.md).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..checks import cdiv, need_int, need_type
from ..engines import Allocation, allocate
from ..errors import NoEngineLayout, ParameterError
from ..explain import fmt_bytes, layer_list
from ..layout import Shard
from ..models import ModelSpec, load_model

VLLM_VERSION = "0.33.0"  # the vLLM whose planning code these rules follow (tests/fixtures/vllm_capacity.json)
VLLM_MAX_NUM_BATCHED_TOKENS = 8192  # `vllm serve` on an H100 / H200 (vllm/engine/arg_utils.py get_batch_defaults)
VLLM_BATCHES_IN_FLIGHT = 2  # async scheduling, on by default: two batches in flight (config/vllm.py
#                             max_concurrent_batches); 1 without it
MAX_BYTES = 2**60  # bound on a KV memory anyone types
MAX_TOKENS = 2**31  # bound on token counts anyone types
MAX_BATCHES = 64
ROPE_NOT_SCALED = ("su", "longrope", "llama3", "yarn", "deepseek_yarn", "deepseek_llama_scaling")
MAX_LEN_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "model_max_length",
                "max_sequence_length", "max_seq_length", "seq_len")  # vllm config/model_arch derived keys
KINDS = {"full": "full attention", "sliding": "sliding window", "state": "linear (state)"}


@dataclass(frozen=True)
class VllmLayer:
    """One layer's KV cache spec as vLLM builds it on one GPU."""

    layer: int  # decoder layer index
    kind: str  # "full", "sliding" or "state"
    block_tokens: int  # tokens per block (a state: vLLM's mamba block size)
    page_bytes: int  # bytes of one block of this layer, padding included
    window: int | None = None  # sliding: tokens a query sees (W)
    latent: bool = False  # an MLA latent
    raw_page_bytes: int | None = None  # a state's bytes before vLLM padded its page (None: not padded)

    @property
    def key(self) -> tuple:
        return self.kind, self.block_tokens, self.page_bytes, self.window, self.latent


@dataclass(frozen=True)
class VllmGroup:
    """A KV cache group: layers sharing one block table."""

    kind: str  # "full", "sliding" or "state"
    layers: tuple[int, ...]  # its layers (a padded group has fewer than the widest)
    block_tokens: int  # tokens per block
    page_bytes: int  # one layer's page (a group of unequal pages: their sum / layers, see `pages`)
    pages: tuple[int, ...]  # each layer's page
    window: int | None  # sliding: W
    blocks_per_request: int  # blocks one max_model_len request reserves at admission
    rule: str  # the arithmetic behind blocks_per_request


@dataclass(frozen=True)
class VllmPlan:
    """vLLM's KV pool for one model on one GPU: blocks, groups and maximum concurrency, as the engine logs them."""

    model: str  # model name
    kv_format: str | None  # KV format (None: the model's dtype)
    shard: Shard  # the GPU's part of the model (TP, DCP)
    kv_cache_memory_bytes: int  # KV memory handed to the engine (vLLM's --kv-cache-memory-bytes)
    max_model_len: int  # request length planned for
    max_num_batched_tokens: int  # tokens one scheduler step may batch
    batches_in_flight: int  # batches scheduled but not settled (2 with async scheduling, else 1)
    prefix_caching: bool  # vLLM's --enable-prefix-caching
    mamba_cache_mode: str | None  # 'align' / 'none' for models with linear-layer state, else None
    block_tokens: int  # the engine's block size (cache_config.block_size: the smallest group's block)
    block_rule: str  # where the block size comes from
    groups: tuple[VllmGroup, ...]  # the KV cache groups
    bytes_per_block: int  # one pool block: the widest group's pages
    num_blocks: int  # blocks in the pool
    held_bytes: int  # held while decoding by one max_model_len request (steady state, this GPU)
    notes: tuple[str, ...] = ()  # page padding and unification applied

    @property
    def tokens_in_flight(self) -> int:
        return self.max_num_batched_tokens * self.batches_in_flight

    @property
    def blocks_per_request(self) -> int:
        """Blocks one max_model_len request reserves at admission, over all groups."""
        return sum(g.blocks_per_request for g in self.groups)

    @property
    def max_concurrency(self) -> float:
        """vLLM's "Maximum concurrency": num_blocks / blocks per request (reserved at admission)."""
        return self.num_blocks / self.blocks_per_request

    @property
    def kv_cache_size_tokens(self) -> int:
        """vLLM's "GPU KV cache size" in tokens: int(max_concurrency x max_model_len)."""
        return int(self.max_concurrency * self.max_model_len)

    @property
    def reserved_bytes(self) -> int:
        """Pool bytes one max_model_len request reserves at admission."""
        return self.blocks_per_request * self.bytes_per_block

    @property
    def held_concurrency(self) -> float:
        """Requests of max_model_len tokens the memory holds, counted as held while decoding."""
        return self.kv_cache_memory_bytes / self.held_bytes

    def logged(self) -> str:
        """The line vLLM's engine core logs (v1/core/kv_cache_utils.py update_kv_cache_capacity)."""
        return (f"GPU KV cache size: {self.kv_cache_size_tokens:,} tokens, Maximum concurrency for "
                f"{self.max_model_len:,} tokens per request: {self.max_concurrency:.2f}x")

    def explain(self) -> list[str]:
        fmt = self.kv_format or "the model's dtype"
        mode = f", mamba_cache_mode '{self.mamba_cache_mode}'" if self.mamba_cache_mode else ""
        lines = [f"vLLM {VLLM_VERSION} plan for {self.model} ({self.shard.label()}), KV in {fmt}, max_model_len "
                 f"{self.max_model_len:,}, prefix caching {'on' if self.prefix_caching else 'off'}{mode}; "
                 f"{self.tokens_in_flight:,} tokens in flight ({self.max_num_batched_tokens:,} batched x "
                 f"{self.batches_in_flight} batch{'es' if self.batches_in_flight > 1 else ''})",
                 f"  block size {self.block_tokens:,} tokens: {self.block_rule}"]
        lines += [f"  note: {n}" for n in self.notes]
        for i, g in enumerate(self.groups):
            lines.append(f"  group {i}: {len(g.layers)} {KINDS[g.kind]} layer{'s' if len(g.layers) > 1 else ''} "
                         f"({layer_list(list(g.layers))}), {g.block_tokens:,}-token blocks of "
                         f"{fmt_bytes(g.page_bytes)} B a layer: {g.rule}")
        widest = max(self.groups, key=lambda g: sum(g.pages))
        lines.append(f"  one pool block = the widest group's pages: {len(widest.layers)} x "
                     f"{fmt_bytes(widest.page_bytes)} B = {self.bytes_per_block:,} B; {self.kv_cache_memory_bytes:,} B "
                     f"// {self.bytes_per_block:,} B = {self.num_blocks:,} blocks")
        lines.append(f"  reserved at admission: {self.blocks_per_request:,} blocks = {self.reserved_bytes:,} B per "
                     f"request; max concurrency {self.num_blocks:,} / {self.blocks_per_request:,} = "
                     f"{self.max_concurrency:.2f} ({self.logged()})")
        lines.append(f"  held while decoding: {self.held_bytes:,} B per {self.max_model_len:,}-token request "
                     f"(kvlab.engines steady state) -> {self.held_concurrency:.2f} requests")
        return lines

    def as_dict(self) -> dict:
        return dict(counted_as="reserved at admission", vllm_version=VLLM_VERSION, model=self.model,
                    kv_format=self.kv_format, tp=self.shard.tp, dcp=self.shard.dcp,
                    kv_cache_memory_bytes=self.kv_cache_memory_bytes, max_model_len=self.max_model_len,
                    max_num_batched_tokens=self.max_num_batched_tokens, batches_in_flight=self.batches_in_flight,
                    tokens_in_flight=self.tokens_in_flight, prefix_caching=self.prefix_caching,
                    mamba_cache_mode=self.mamba_cache_mode, block_tokens=self.block_tokens,
                    bytes_per_block=self.bytes_per_block, num_blocks=self.num_blocks,
                    groups=[dict(kind=g.kind, layers=list(g.layers), block_tokens=g.block_tokens,
                                 page_bytes=g.page_bytes, window=g.window, blocks_per_request=g.blocks_per_request,
                                 rule=g.rule) for g in self.groups],
                    blocks_per_request=self.blocks_per_request, reserved_bytes_per_request=self.reserved_bytes,
                    max_concurrency=self.max_concurrency, kv_cache_size_tokens=self.kv_cache_size_tokens,
                    logged=self.logged(),
                    held_while_decoding=dict(bytes_per_request=self.held_bytes,
                                             concurrency=self.held_concurrency))


# --- the model's length ---------------------------------------------------------------------------------------
def model_max_len(spec: ModelSpec) -> int | None:
    """The longest max_model_len vLLM accepts for a model (config/model.py _get_and_verify_max_len): the smallest
    of the config's length keys, times a RoPE scaling factor whose type does not already include it; None when
    the config names no length."""
    c = spec.config
    lens = [c[k] for k in MAX_LEN_KEYS if isinstance(c.get(k), int) and not isinstance(c.get(k), bool)]
    if not lens:
        return None
    n = min(lens)
    rope = c.get("rope_scaling") or c.get("rope_parameters")
    if isinstance(rope, dict) and "gemma3" not in str(c.get("model_type")):
        kind = rope.get("rope_type", rope.get("type"))
        if kind not in ROPE_NOT_SCALED and isinstance(rope.get("factor"), (int, float)):
            n = int(n * rope["factor"])
    return n


# --- specs, groups, blocks ------------------------------------------------------------------------------------
def layer_specs(a: Allocation, max_model_len: int, mode: str | None) -> list[VllmLayer]:
    """Each layer's spec on this GPU (a layer with attention and a state gives two, as vLLM builds two modules)."""
    e, name = a.engine, a.layout.model.name
    out = []
    for layer in a.layout.layers:
        att = [c for c in layer.components if not c.state]
        odd = [c for c in att if c.role not in ("k", "v", "latent") or c.tokens_per_entry != 1 or c.pending]
        if odd:
            raise NoEngineLayout(f"{name}: vLLM's planner is modelled here for full-attention, sliding-window, MLA and "
                                 f"linear-state layers; layer {layer.index}'s {odd[0].key!r} entries are "
                                 f"model-specific specs in vLLM, not checked against it (docs/guide.md)")
        if att:
            windows = {c.window for c in att}
            if len(windows) > 1:
                raise NoEngineLayout(f"{name}: layer {layer.index} mixes windowed and growing entries")
            held = windows.pop()
            out.append(VllmLayer(layer.index, "full" if held is None else "sliding", e.block_tokens,
                                 sum(e.page_bytes(c) for c in att), None if held is None else held + 1,
                                 latent=any(c.role == "latent" for c in att)))
        for c in layer.components:
            if c.state:  # mamba block: the attention block in 'align' mode, max_model_len in 'none'
                out.append(VllmLayer(layer.index, "state", e.block_tokens if mode == "align" else max_model_len,
                                     e.page_bytes(c), raw_page_bytes=c.entry_bytes if e.page_bytes(c) != c.entry_bytes
                                     else None))
    if not out:
        raise NoEngineLayout(f"{name}: no layer of this GPU holds a KV cache")
    return out


def group_specs(specs: list[VllmLayer]) -> list[list[VllmLayer]]:
    """KV cache groups (kv_cache_planning.py get_kv_cache_groups)."""
    if len({s.key for s in specs}) == 1:  # is_kv_cache_spec_uniform
        return [specs]
    first = specs[0]
    if all(s.kind == first.kind and s.block_tokens == first.block_tokens and s.latent == first.latent
           and (s.kind != "sliding" or s.window == first.window)
           and (s.kind != "state" or s.page_bytes == first.page_bytes) for s in specs):
        return [specs]  # UniformTypeKVCacheSpecs: one group of every layer
    buckets: dict[tuple, list[VllmLayer]] = {}
    for s in specs:
        buckets.setdefault(s.key, []).append(s)
    sizes = [len(b) for b in buckets.values()]
    size = max(sizes) if max(sizes) < min(sizes) * 1.5 else min(sizes)
    groups = []
    for b in buckets.values():
        n = cdiv(len(b), size)
        groups += [b[i::n] for i in range(n)]
    return groups


def blocks_per_request(s: VllmLayer, max_model_len: int, dcp: int, in_flight: int, mode: str | None,
                       checkpoint: bool) -> tuple[int, str]:
    """Blocks one max_model_len request reserves in a group of layers like `s`, with the arithmetic."""
    L = max_model_len
    if s.kind == "full":
        if dcp > 1:
            per = cdiv(L, dcp)
            return cdiv(per, s.block_tokens), f"cdiv(cdiv({L:,}, DCP {dcp}), {s.block_tokens:,}) = " \
                                              f"{cdiv(per, s.block_tokens):,} blocks"
        return cdiv(L, s.block_tokens), f"cdiv({L:,}, {s.block_tokens:,}) = {cdiv(L, s.block_tokens):,} blocks"
    if s.kind == "sliding":
        held = min(s.window - 1 + in_flight, L)
        n = cdiv(held, s.block_tokens) + 1
        return n, (f"cdiv(min(W - 1 + in flight = {s.window - 1:,} + {in_flight:,}, {L:,}), {s.block_tokens:,}) + 1 "
                   f"= {n:,} blocks (the window need not start on a block)")
    if mode == "align":
        n = 2 + int(checkpoint)
        why = " + 1 prefill checkpoint block" if checkpoint else ""
        return n, f"'align' mode: 2 state blocks{why} = {n} blocks"
    return 1, "'none' mode: 1 state block"


def check_len(spec: ModelSpec, max_model_len: int) -> None:
    most = model_max_len(spec)
    if most is not None and max_model_len > most:
        raise ParameterError(f"{spec.name}: max_model_len {max_model_len:,} exceeds the model's {most:,} tokens "
                             f"(its config's max_position_embeddings; vLLM refuses it: config/model.py "
                             f"_get_and_verify_max_len)")


def vllm_plan(model, kv_cache_memory_bytes: int, max_model_len: int, kv_format=None, *, tp: int = 1, dcp: int = 1,
              max_num_batched_tokens: int = VLLM_MAX_NUM_BATCHED_TOKENS,
              batches_in_flight: int = VLLM_BATCHES_IN_FLIGHT, prefix_caching: bool = True) -> VllmPlan:
    """vLLM's KV plan for `model` on one GPU of a TP (and DCP) deployment, given the KV memory handed to the engine
    (--kv-cache-memory-bytes), max_model_len, max_num_batched_tokens, the batches in flight (2 with async
    scheduling, vLLM's default) and prefix caching (on by default). `kv_format`: a kvlab format or vLLM's
    --kv-cache-dtype name (auto, fp8, ...). Raises ParameterError where vLLM refuses to start."""
    spec = load_model(model)
    mem = need_int("kv_cache_memory_bytes", kv_cache_memory_bytes, 1, MAX_BYTES)
    L = need_int("max_model_len", max_model_len, 1, MAX_TOKENS)
    mbt = need_int("max_num_batched_tokens", max_num_batched_tokens, 1, MAX_TOKENS)
    bif = need_int("batches_in_flight", batches_in_flight, 1, MAX_BATCHES)
    need_type("prefix_caching", prefix_caching, bool, "True or False")
    check_len(spec, L)
    shard = Shard(need_int("tp", tp, 1, 1 << 20), need_int("dcp", dcp, 1, 1 << 20))
    a = allocate(spec, "vllm", kv_format, "vllm", shard=shard, prefix_caching=prefix_caching)
    has_state = any(c.state for _, c in a.layout.components(False))
    mode = ("align" if prefix_caching else "none") if has_state else None
    specs = layer_specs(a, L, mode)
    for s in specs:
        if s.kind == "sliding" and s.window > L:
            raise ParameterError(f"{spec.name}: layer {s.layer}'s sliding window ({s.window:,} tokens) is larger than "
                                 f"max_model_len {L:,}: no request reaches it, so the window would save nothing; "
                                 f"raise max_model_len or check the window")
        if shard.dcp > 1 and s.kind != "full":
            raise ParameterError(f"{spec.name}: vLLM runs decode context parallelism (DCP {shard.dcp}) only over full "
                                 f"attention, not with {KINDS[s.kind]} layers (v1/kv_cache_interface.py "
                                 f"SlidingWindowSpec: 'DCP not support sliding window'; Mamba state is replicated)")
    if len({s.page_bytes for s in specs}) > 1:  # vLLM would unify them (unify_kv_cache_spec_page_size)
        raise NoEngineLayout(f"{spec.name}: layers with pages of unequal size ({sorted({s.page_bytes for s in specs})})"
                             f" are not modelled here; vLLM enlarges or pads them to one size")
    notes = sorted({f"each state page of {s.raw_page_bytes:,} B padded to the attention page, {s.page_bytes:,} B"
                    for s in specs if s.raw_page_bytes})
    in_flight = mbt * bif
    checkpoint = bool(getattr(a.layout.family, "vllm_checkpoint_block", False))
    groups = []

    def reserve(s: VllmLayer, n: int) -> tuple[int, str]:
        return blocks_per_request(s, n, shard.dcp, in_flight, mode, checkpoint)

    for members in group_specs(specs):
        s = members[0]
        n, rule = reserve(s, L)
        pages = tuple(m.page_bytes for m in members)
        groups.append(VllmGroup(s.kind, tuple(m.layer for m in members), s.block_tokens,
                                sum(pages) // len(pages), pages, s.window, n, rule))
    bytes_per_block = max(sum(g.pages) for g in groups)
    need = bytes_per_block * sum(g.blocks_per_request for g in groups)
    if mem - bytes_per_block < need:  # _check_enough_kv_cache_memory, the null block held back
        first = {g.layers[0]: s for s in specs for g in groups if s.layer == g.layers[0] and s.kind == g.kind}
        fits = longest_len(groups, L, lambda g, n: reserve(first[g.layers[0]], n)[0], mem - bytes_per_block,
                           bytes_per_block)
        raise ParameterError(f"{spec.name}: vLLM refuses {mem:,} B of KV memory: one {L:,}-token request reserves "
                             f"{need:,} B ({need // bytes_per_block:,} blocks of {bytes_per_block:,} B) and the "
                             f"pool holds one block back (the null block)"
                             + (f"; the longest max_model_len that fits is {fits:,}" if fits else
                                "; not even one block of every group fits"))
    return VllmPlan(spec.name, a.layout.kv_format, shard, mem, L, mbt, bif, prefix_caching, mode,
                    min(g.block_tokens for g in groups), a.engine.source, tuple(groups), bytes_per_block,
                    mem // bytes_per_block, a.session(L).total, tuple(notes))


def longest_len(groups: list[VllmGroup], L: int, need_blocks, memory: int, bytes_per_block: int) -> int:
    """The longest max_model_len (<= L) whose request fits `memory` (kv_cache_planning.py estimate_max_model_len's
    binary search), 0 when none does; need_blocks(group, n) gives a group's blocks for length n."""
    lo, hi, best = 1, L, 0
    while lo <= hi:
        mid = (lo + hi) // 2
        if sum(need_blocks(g, mid) for g in groups) * bytes_per_block <= memory:
            best, lo = mid, mid + 1
        else:
            hi = mid - 1
    return best


def planned(model, kv_cache_memory_bytes: int, max_model_len: int, kv_format=None, **options
            ) -> tuple[VllmPlan | None, str]:
    """(vLLM's plan, "") or (None, the reason vLLM refuses it or kvlab does not model it): for tables that show
    vLLM's figure where there is one."""
    try:
        return vllm_plan(model, kv_cache_memory_bytes, max_model_len, kv_format, **options), ""
    except ParameterError as e:
        return None, str(e)
