"""How an engine allocates a layout: exact storage, or paged blocks with page alignment.

Exact storage holds each entry's bytes and nothing more. A paged engine allocates every
growing component in pages of `block_tokens` tokens (a page of a ratio-m component holds
block_tokens / m entries) and rounds each page up to a multiple of `page_align` bytes;
bounded components take the pages that their window can touch, a compressor tail one page
sized for its m - 1 pending tokens, and a fixed-size state (linear-attention / SSM layers)
one page of its own (padded to `state_page` bytes where the engine pads it).

Each family (kvlab.families) says which rule an engine applies to it; the rules and their
sources:
  vLLM     (0.33, the backends an SM90 GPU -- H100 / H200 -- selects: vllm/platforms/cuda.py
           _get_backend_priorities) dense attention: FLASH_ATTN, 16-token blocks, page = block x heads x
           head_size x dtype per K and V (vllm/v1/kv_cache_interface.py AttentionSpec.page_size_bytes); MLA:
           FLASH_ATTN_MLA, 16-token blocks, for a BF16 / FP16 cache, FLASHMLA, 64-token blocks, for an FP8 one
           (FLASH_ATTN_MLA's supported_kv_cache_dtypes are auto / float16 / bfloat16); DSA (V3.2): 64-token
           blocks; DeepSeek V4: 256-token logical blocks, each page rounded up to a multiple of 576 B; hybrid
           attention + Mamba / linear-attention models: the attention block enlarged until one attention page
           holds a layer's state, and the state page padded to it (vllm/platforms/interface.py
           _align_hybrid_block_size; vllm/v1/kv_cache_interface.py MambaSpec). How vLLM turns pages into
           its block count and maximum concurrency is kvlab.serving.vllm_plan's concern.
  SGLang   a token-granular pool: page_size 1 unless --page-size (python/sglang/srt/mem_cache/memory_pool.py,
           server_args.py page_size); KV dtypes auto, fp8_e4m3 / fp8_e5m2 (one scale per tensor), fp4_e2m1
           (E2M1 with one 8-bit scale per 16 values: kvlab's mxfp4_b16) and int8 (per token and head, FP16
           scale + zero point) (docs/advanced_features/quantized_kv_cache.md)
  TRT-LLM  tokens_per_block 32 (tensorrt_llm/llmapi/llm_args.py KvCacheConfig.tokens_per_block); KV dtypes
           auto, fp8 (one scale per tensor), nvfp4 (E2M1 + one FP8 scale per 16 + a per-tensor FP32 scale:
           kvlab's nvfp4_2level; tensorrt_llm/_torch/pyexecutor/resource_manager.py
           KVCacheManager.get_cache_size_per_token)
What memory each engine gives the pool is kvlab.serving.budget's concern.
"""
from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from .checks import cdiv, need_choice, need_int, need_type
from .errors import ParameterError
from .layout import WINDOW_RULES, Component, Layout, SessionBytes, Shard, build_layout, check_tokens

ENGINES = ("vllm", "sglang", "trtllm")  # engines whose allocation rules kvlab models


@dataclass(frozen=True)
class Engine:
    """An allocation policy."""

    name: str  # "exact" or an engine's name
    block_tokens: int | None = None  # tokens per page (None: exact storage, no pages)
    page_align: int = 1  # each page's bytes rounded up to a multiple of this
    source: str = ""  # where the rule comes from
    state_page: int | None = None  # bytes of one fixed-size state page (a hybrid engine pads states to this)
    window_extra: int = 0  # tokens a sliding window holds beyond the layout's W - 1 (layout.WINDOW_RULES)

    def __post_init__(self):
        if self.block_tokens is not None:
            need_int("block_tokens", self.block_tokens, 1)
        need_int("page_align", self.page_align, 1)
        if self.state_page is not None:
            need_int("state_page", self.state_page, 1)
        need_int("window_extra", self.window_extra, 0)

    def rows_per_page(self, c: Component) -> int:
        """Entries one page of component c holds: block_tokens / m for growing and windowed components; a
        compressor tail (at most m - 1 pending tokens) is one buffer page sized for all of them; a state one."""
        if c.tail_of is not None:
            return c.max_entries
        if c.state:
            return 1
        return cdiv(self.block_tokens, c.tokens_per_entry)

    def page_bytes(self, c: Component) -> int:
        """Bytes of one page of component c (one layer)."""
        raw = self.rows_per_page(c) * c.entry_bytes
        if c.state and self.state_page is not None:
            if self.state_page < raw:
                raise ParameterError(f"{self.name}: a state page of {self.state_page:,} B cannot hold "
                                     f"{c.role}'s {raw:,} B")
            return self.state_page
        return cdiv(raw, self.page_align) * self.page_align

    def window_tokens(self, c: Component, tokens: int) -> int:
        """Tokens a windowed component holds under this engine after `tokens` tokens: the layout's count, plus
        the tokens this engine keeps beyond it (SGLang and TensorRT-LLM keep W where the layout counts W - 1)."""
        held = c.held_tokens(tokens)
        if self.window_extra and c.residual is None:
            held = min(tokens, c.window + self.window_extra)
        return held

    def pages(self, c: Component, tokens: int) -> int:
        """Pages component c holds after `tokens` tokens."""
        if c.tail_of is not None or c.state:  # one buffer page while anything is pending / from the first token
            return 1 if c.entries(tokens) else 0
        if c.window is not None:  # a window of W tokens touches at most ceil((W-1)/B) + 1 blocks
            w = self.window_tokens(c, tokens)
            return 0 if w == 0 else cdiv(w - 1, self.block_tokens) + 1
        return cdiv(c.held_tokens(tokens), self.block_tokens * c.interleave)  # interleaved: this rank's pages


EXACT = Engine("exact", source="the layout's own bytes, nothing rounded")
VLLM_DENSE = Engine("vllm", 16, 1, "vllm/v1/kv_cache_interface.py AttentionSpec.real_page_size_bytes: 16-token blocks; "
                   f"windows: {WINDOW_RULES['vllm'][1]}")
VLLM_MLA = Engine("vllm", 16, 1, "vLLM FLASH_ATTN_MLA (SM90's first MLA backend for a BF16 / FP16 cache): 16-token "
                                 "blocks (vllm/v1/attention/backends/mla/flashattn_mla.py MultipleOf(16))")
VLLM_FLASHMLA = Engine("vllm", 64, 1, "vLLM FLASHMLA (SM90's MLA backend for an FP8 cache) and the sparse MLA "
                                      "backends: 64-token blocks (vllm/v1/attention/backends/mla/flashmla.py)")
VLLM_V4 = Engine("vllm", 256, 576, "vLLM DeepSeek V4: 256-token logical blocks, pages rounded up to a multiple of 576 B")
SGLANG_PAGE = 1  # SGLang's default page size: a token-granular pool (server_args.py page_size; --page-size)
TRTLLM_TOKENS_PER_BLOCK = 32  # TensorRT-LLM KvCacheConfig.tokens_per_block default (tensorrt_llm/llmapi/llm_args.py)

# The KV formats each engine offers, by its own name -> kvlab's format (None: the model's dtype, the scheme's own).
ENGINE_FORMATS: dict[str, dict[str, str | None]] = {
    "vllm": {"auto": None, "fp8": "fp8_e4m3", "fp8_e4m3": "fp8_e4m3", "fp8_e5m2": "fp8_e5m2"},
    "sglang": {"auto": None, "bf16": "bf16", "fp8_e4m3": "fp8_e4m3", "fp8_e5m2": "fp8_e5m2",
               "fp4_e2m1": "mxfp4_b16", "int8": "int8_token"},
    "trtllm": {"auto": None, "fp8": "fp8_e4m3", "nvfp4": "nvfp4_2level"},
}
ENGINE_FORMAT_SOURCES = {
    "vllm": "vLLM --kv-cache-dtype auto | fp8 | fp8_e4m3 | fp8_e5m2 (one k_scale / v_scale per tensor); DeepSeek "
            "layouts keep their fp8_ds_mla / V4 entries (vllm/config/cache.py CacheDType)",
    "sglang": "SGLang --kv-cache-dtype: fp8_e4m3 / fp8_e5m2 with per-tensor scales, fp4_e2m1 with one 8-bit scale "
              "per 16 values, INT8 per token and head with FP16 scale + zero point "
              "(docs/advanced_features/quantized_kv_cache.md)",
    "trtllm": "TensorRT-LLM KvCacheConfig.dtype: fp8 with per-tensor scales, nvfp4 = E2M1 + one FP8 scale per 16 "
              "(+ the global scale per tensor) (tensorrt_llm/_torch/pyexecutor/resource_manager.py "
              "get_cache_size_per_token)",
}


def engine_format(engine: str, name: str, head_dim: int | None = None) -> str | None:
    """kvlab's format for an engine's KV-dtype name (e.g. SGLang's fp4_e2m1 -> mxfp4_b16), or a clear error
    listing the engine's names. INT8 in SGLang groups a whole head: int8_g<head_dim>."""
    engine = need_choice("engine", engine, ENGINES)
    table = ENGINE_FORMATS[engine]
    if name not in table:
        raise ParameterError(f"{engine} has no KV dtype {name!r}; it offers {', '.join(table)} "
                             f"({ENGINE_FORMAT_SOURCES[engine]})")
    fmt = table[name]
    if fmt == "int8_token":
        if head_dim is None:
            raise ParameterError("int8 KV groups one head: the head width is needed")
        fmt = f"int8_g{head_dim}"
    return fmt


def engine_for(layout: Layout, name: str | None = None, page_size: int | None = None,
               prefix_caching: bool = True) -> Engine:
    """The engine rule for a layout: `name` (vllm, sglang, trtllm) as its family allocates it, or, with no name,
    the one its scheme implies (vLLM's paging for 'vllm', exact storage otherwise). `prefix_caching` (vLLM's
    default, on) decides how vLLM keeps a hybrid model's state ('align' mode, which can enlarge its blocks)."""
    need_type("prefix_caching", prefix_caching, bool, "True or False")
    if name is None:
        return layout.family.engine(layout, "vllm", prefix_caching=prefix_caching) if layout.scheme == "vllm" \
            else EXACT
    need_choice("engine", name, ENGINES)
    return layout.family.engine(layout, name, page_size, prefix_caching=prefix_caching)


def sglang(page_size: int | None = None) -> Engine:
    """SGLang's token pool: pages of `page_size` tokens (1 by default), nothing padded."""
    p = SGLANG_PAGE if page_size is None else need_int("page_size", page_size, 1)
    return Engine("sglang", p, 1, f"SGLang token-granular KV pool, page_size {p} (server_args.py page_size; "
                                  f"python/sglang/srt/mem_cache/memory_pool.py); windows: {WINDOW_RULES['sglang'][1]}",
                  window_extra=WINDOW_RULES["sglang"][0])


def trtllm(tokens_per_block: int | None = None) -> Engine:
    """TensorRT-LLM's paged pool: blocks of `tokens_per_block` tokens (32 by default)."""
    b = TRTLLM_TOKENS_PER_BLOCK if tokens_per_block is None else need_int("tokens_per_block", tokens_per_block, 1)
    return Engine("trtllm", b, 1, f"TensorRT-LLM paged KV cache, tokens_per_block {b} (tensorrt_llm/llmapi/"
                                  f"llm_args.py KvCacheConfig); windows: {WINDOW_RULES['trtllm'][1]}",
                  window_extra=WINDOW_RULES["trtllm"][0])


@dataclass(frozen=True)
class Allocation:
    """A layout as an engine allocates it."""

    layout: Layout  # what is stored
    engine: Engine  # how it is allocated

    @property
    def paged(self) -> bool:
        return self.engine.block_tokens is not None

    @property
    def bytes_per_token(self) -> Fraction:
        """Allocated bytes per token of context, amortized over full pages (padding included)."""
        if not self.paged:
            return self.layout.bytes_per_token
        e = self.engine
        return sum((Fraction(e.page_bytes(c), e.block_tokens * c.interleave) for _, c in self.layout.components(True)),
                   Fraction(0))

    @property
    def padding_per_token(self) -> Fraction:
        return self.bytes_per_token - self.layout.bytes_per_token

    def session(self, tokens: int) -> SessionBytes:
        """Allocated bytes after `tokens` tokens (whole pages when paged)."""
        tokens = check_tokens(tokens)
        if not self.paged:
            return self.layout.session(tokens)
        e = self.engine
        grow = sum(e.pages(c, tokens) * e.page_bytes(c) for _, c in self.layout.components(True))
        bound = sum(e.pages(c, tokens) * e.page_bytes(c) for _, c in self.layout.components(False))
        return SessionBytes(tokens, grow, bound + self.layout.tensor_bytes_at(tokens))

    def explain(self) -> list[str]:
        lines = self.layout.explain()
        if not self.paged:
            return lines
        e = self.engine
        lines.append(f"{e.name} allocation: {e.block_tokens}-token blocks"
                     + (f", pages rounded up to a multiple of {e.page_align} B" if e.page_align > 1 else ""))
        seen = {}
        for layer, c in self.layout.components(True):
            key = (c.role, c.tokens_per_entry, c.entry_bytes, c.interleave)
            seen.setdefault(key, [0, c])[0] += 1
        total = Fraction(0)
        for (role, ratio, eb, inter), (n, c) in seen.items():
            entries = cdiv(e.block_tokens, ratio)
            pb = e.page_bytes(c)
            total += Fraction(n * pb, inter)
            pad = f" -> {pb:,} B" if pb != entries * eb else ""
            spread = f", one page per {e.block_tokens * inter} tokens ({inter} ranks interleave)" if inter > 1 else ""
            lines.append(f"  {role} page (ratio {ratio}): {entries} entries x {eb:,} B = {entries * eb:,} B{pad}, "
                         f"x {n} layers{spread}")
        from .explain import fmt_bytes
        lines.append(f"  {fmt_bytes(total)} B per {e.block_tokens} tokens = {fmt_bytes(self.bytes_per_token)} B per "
                     f"token ({fmt_bytes(self.padding_per_token)} B of page padding)")
        states = [(l, c) for l, c in self.layout.components(False) if c.state]
        if states:
            pb = e.page_bytes(states[0][1])
            lines.append(f"  fixed-size state: {len(states)} layer states x one {pb:,} B page "
                         f"({states[0][1].entry_bytes:,} B held) per sequence")
        return lines


def allocate(model, scheme: str | None = None, kv_format=None, engine: Engine | str | None = None, *,
             k_format=None, v_format=None, shard: Shard | None = None, page_size: int | None = None,
             prefix_caching: bool = True) -> Allocation:
    """Build a model's layout and allocate it. `engine` is an Engine, or an engine's name (vllm, sglang, trtllm:
    its rule for this model's family), or None for the one the scheme implies. `scheme` None: 'vllm' under
    vLLM, 'storage' otherwise (SGLang and TensorRT-LLM store the model's dtype unless a kv_format is given).
    `prefix_caching`: vLLM's switch (on by default), which sets a hybrid model's block size."""
    if isinstance(engine, str) and engine not in ENGINES:
        raise ParameterError(f"engine must be an engine's name ({', '.join(ENGINES)}) or a kvlab.engines.Engine "
                             f"(EXACT, VLLM_DENSE, ... or paged(block_tokens)); got {engine!r}")
    if engine is not None and not isinstance(engine, str):
        need_type("engine", engine, Engine, "a kvlab.engines.Engine (EXACT, VLLM_DENSE, ...), an engine's name "
                  f"({', '.join(ENGINES)}) or paged(block_tokens)")
    if isinstance(model, Layout):
        layout = model
    else:
        if scheme is None:
            scheme = "vllm" if engine == "vllm" else "storage"
        if isinstance(engine, str):  # an engine's own dtype names (SGLang's fp4_e2m1, TRT-LLM's nvfp4) are accepted
            kv_format, k_format, v_format = (native_format(engine, f, model) for f in (kv_format, k_format, v_format))
        layout = build_layout(model, scheme, kv_format, k_format=k_format, v_format=v_format, shard=shard)
    if isinstance(engine, Engine):
        return Allocation(layout, engine)
    rule = engine_for(layout, engine, page_size, prefix_caching)
    if engine in ("sglang", "trtllm"):
        check_engine_formats(layout, engine)
    return Allocation(layout, rule)


def native_format(engine: str, fmt, model):
    """An engine's KV-dtype name translated to kvlab's format name; anything else unchanged."""
    if not isinstance(fmt, str) or fmt not in ENGINE_FORMATS[engine]:
        return fmt
    head_dim = None
    if ENGINE_FORMATS[engine][fmt] == "int8_token":
        from .models import load_model
        head_dim = load_model(model).head_dim
    return engine_format(engine, fmt, head_dim)


def check_engine_formats(layout: Layout, engine: str) -> None:
    """The formats of a layout's attention entries must be ones `engine` offers (ENGINE_FORMATS)."""
    allowed = {f for f in ENGINE_FORMATS[engine].values() if f not in (None, "int8_token")}
    if engine == "sglang":
        allowed.add(f"int8_g{layout.model.head_dim}")
    for _, c in layout.components():
        if c.state:
            continue
        for part in c.entry.parts:
            name = part.fmt.name
            if part.fmt.scope == "none" or name in allowed:
                continue
            raise ParameterError(f"{engine} does not store KV as {name}: it offers "
                                 f"{', '.join(ENGINE_FORMATS[engine])} ({ENGINE_FORMAT_SOURCES[engine]})")


def paged(block_tokens: int, page_align: int = 1, name: str = "paged") -> Engine:
    """A custom paged engine."""
    return Engine(need_type("name", name, str, "a name"), need_int("block_tokens", block_tokens, 1),
                  need_int("page_align", page_align, 1))
