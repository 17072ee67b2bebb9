"""DeepSeek V4 (`dsv4`: SWA, CSA and HCA layers) and V4.1 (`dsv41`: CSA2 with KV-source layers).

V4 (config `compress_ratios`, the V4-Flash / V4-Pro model cards): every layer keeps a `sliding_window`-token
window; ratio 4 (CSA) layers store one compressed entry and one indexer key per 4 tokens, ratio 128 (HCA) one
entry per 128 tokens and no indexer key; ratio 0 layers keep only the window. DeepSeek's storage format: a 584 B
entry (448 FP8 NoPE + 7 UE8M0 scales + 128 BF16 RoPE + 1 pad) and a 68 B MXFP4 indexer key; vLLM stores the
indexer key in FP8 (132 B) and pages in 256-token blocks, each page rounded up to a multiple of 576 B.

V4.1 (`kv_source_layer_ids`, the V4.1-Flash model card and report): only the KV-source (Full) layers store
entries (NVFP4, 288 B) and indexer keys (MXFP4, 68 B); Reindex and Reuse layers read their source's and store
none; every layer keeps an FP8 window. After a host-cache miss the window is replayed (bounded replay of the
last `sliding_window` tokens).

Parallelism: the shared K=V entry is replicated on every TP rank (one KV head); decode context parallelism
interleaves V4's compressed entries (its indexer keys stay whole: lightseekorg/tokenspeed PR #1498) and V4.1's
entries and indexer keys (vllm-project/vllm PR #56738); windows and compressor tails stay whole on every rank.
"""
from __future__ import annotations

from fractions import Fraction

from ..engines import VLLM_V4
from ..errors import ConfigError
from ..explain import explain_layout, fmt_bytes
from ..formats import get_format
from ..layout import Component, Entry, LayerCache, Part
from ..models import ModelSpec, cfg_int, cfg_int_list, cfg_layer_ids
from ..registry import register
from .base import VLLM_MLA_TP, Family, Split

V4_ENTRY = (("nope", "fp8_e4m3_b64_ue8m0"), ("rope", "bf16"))  # 448 + 7 + 128 = 583 -> 584 B (align 8)
TOKENSPEED_V4_DCP = ("lightseekorg/tokenspeed PR #1498 (DeepSeek V4 DCP): the compressed KV cache is sharded, the SWA "
                     "cache, compression states and indexer cache stay replicated")
VLLM_V41_DCP = ("vllm-project/vllm PR #56738 (DeepSeek V4.1 DCP): the shared main / index caches sharded by logical "
                "record, sliding-window and compressor state replicated")
V4_TP = f"one shared K=V head: {VLLM_MLA_TP.split(':')[0]} (MQA-like; every TP rank holds the entries)"


def tail(owner: Component, entry_dims: int, overlap: bool) -> Component:
    """The tail of compressed component `owner`: the kv and gate projections of its < m pending tokens, in BF16.

    Assumption (documented, bounded): an overlapping (CSA) compressor keeps projections of width
    2d, a non-overlapping (HCA) one width d, as in DeepSeek's reference compressor."""
    width = 2 * entry_dims * (2 if overlap else 1)  # kv + gate
    return Component("tail", Entry((Part("tail", width, get_format("bf16")),)), ratio=owner.ratio,
                     tail_of=owner.role)


def check_kv_sources(ratios: tuple[int, ...], srcs: tuple[int, ...], name: str) -> None:
    """V4.1: every KV-source layer stores entries (ratio > 0), and every other compressing layer has a source
    before it to read."""
    empty = [s for s in srcs if not ratios[s]]
    if empty:
        raise ConfigError(f"{name}: 'kv_source_layer_ids' lists layer {empty[0]}, whose compress ratio is 0 "
                          "(a sliding-window-only layer stores no entries to share)")
    first = min(srcs)
    orphans = [i for i, m in enumerate(ratios) if m and i < first]
    if orphans:
        raise ConfigError(f"{name}: layer {orphans[0]} compresses (ratio {ratios[orphans[0]]}) but comes before the "
                          f"first 'kv_source_layer_ids' layer ({first}), so it has no entries to read")


@register
class DeepSeekV4(Family):
    name = "dsv4"
    description = "DeepSeek V4: SWA, CSA (compressed + indexer) and HCA layers"
    order = 110
    recipes = {"storage": {"main": V4_ENTRY, "index": (("all", "mxfp4"),), "swa": V4_ENTRY},
               "vllm": {"main": V4_ENTRY, "index": (("all", "fp8_e4m3_b128"),), "swa": V4_ENTRY}}
    align = {"main": 8, "swa": 8}  # V4's 583 B entry is stored as 584 B
    splits = {"main": Split("replicated", True, f"{V4_TP}; {TOKENSPEED_V4_DCP}"),
              "index": Split("replicated", False, f"{V4_TP}; {TOKENSPEED_V4_DCP}"),
              "swa": Split("replicated", False, TOKENSPEED_V4_DCP),
              "tail": Split("replicated", False, TOKENSPEED_V4_DCP)}
    vllm = VLLM_V4
    split_formats = False
    sources = "DeepSeek-V4-Flash / V4-Pro config.json and model cards; vLLM's DeepSeek V4 support"

    def detect(self, cfg: dict) -> bool:
        return bool(cfg.get("compress_ratios")) and not cfg.get("kv_source_layer_ids")

    def parse(self, c: dict, name: str, common: dict):
        n = common["num_layers"]
        ratios = cfg_int_list(c, "compress_ratios", name)
        if len(ratios) < n:
            raise ConfigError(f"{name}: 'compress_ratios' has {len(ratios)} entries for {n} layers")
        srcs = cfg_layer_ids(c, "kv_source_layer_ids", name, n)
        head_dim, rope = cfg_int(c, "head_dim", name), cfg_int(c, "qk_rope_head_dim", name)
        if rope >= head_dim:
            raise ConfigError(f"{name}: 'qk_rope_head_dim' ({rope}) must be smaller than 'head_dim' ({head_dim}): "
                              "a DeepSeek V4 entry is a NoPE part of head_dim - qk_rope_head_dim dims plus the RoPE part")
        kv_heads = cfg_int(c, "num_key_value_heads", name, default=1)
        if kv_heads != 1:
            raise ConfigError(f"{name}: 'num_key_value_heads' is {kv_heads}; kvlab lays out DeepSeek V4-style models "
                              "(compress_ratios) with their one shared K=V head")
        if srcs:
            check_kv_sources(ratios[:n], srcs, name)
        return ModelSpec(
            family="dsv41" if srcs else "dsv4",
            num_heads=cfg_int(c, "num_attention_heads", name, required=False),
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            qk_rope_head_dim=rope,
            index_head_dim=cfg_int(c, "index_head_dim", name),
            index_n_heads=cfg_int(c, "index_n_heads", name, required=False),
            index_topk=cfg_int(c, "index_topk", name, required=False),
            compress_ratios=ratios[:n],
            sliding_window=cfg_int(c, "sliding_window", name),
            kv_source_layers=srcs,
            index_source_layers=cfg_layer_ids(c, "index_source_layer_ids", name, n),
            candidate_blocks=cfg_int(c, "candidate_topk_blocks", name, required=False),
            candidate_block_size=cfg_int(c, "candidate_block_size", name, required=False),
            **common)

    def entries(self, spec, scheme, fmts) -> tuple[Entry, Entry, Entry]:
        """(main entry, indexer key, SWA entry); main and SWA entries are NoPE + RoPE."""
        self.refuse_split(spec, fmts)
        dims = {"nope": spec.head_dim - spec.qk_rope_head_dim, "rope": spec.qk_rope_head_dim}
        return (self.entry(spec, scheme, "main", dims, fmts.k_format),
                self.entry(spec, scheme, "index", {"all": spec.index_head_dim}, fmts.k_format),
                self.entry(spec, scheme, "swa", dims, fmts.k_format))

    def attention_params(self, spec):
        """DeepSeek V4 attention projections per layer: wq_a (hidden -> q_lora_rank), wq_b (-> heads x head_dim),
        wkv (hidden -> head_dim: the shared K=V entry), wo_a (grouped: heads x head_dim / o_groups -> o_groups x
        o_lora_rank) and wo_b (-> hidden); the indexer's and compressors' projections are not counted."""
        c, h, hd, d = spec.config, spec.num_heads, spec.head_dim, spec.hidden_size
        ql, ol, g = c.get("q_lora_rank"), c.get("o_lora_rank"), c.get("o_groups")
        if not all(isinstance(x, int) and x > 0 for x in (ql, ol, g, h, d)):
            return None
        return spec.num_layers * (d * ql + ql * h * hd + d * hd + (h * hd // g) * g * ol + g * ol * d)

    def interleave(self, role: str, shard) -> int:
        """DCP ranks a growing role's entries are interleaved over (1: every rank holds them all)."""
        return shard.dcp if self.splits[role].dcp else 1

    def build(self, spec, scheme, fmts, shard):
        self.check_shard(spec, shard)
        main, index, swa = self.entries(spec, scheme, fmts)
        layers = []
        for i, m in enumerate(spec.compress_ratios):
            comps = [Component("swa", swa, window=spec.sliding_window)]  # a ring of W (WINDOW_RULES["deepseek_v4"])
            if m:
                csa = m < 128  # CSA layers carry indexer keys; HCA (m = 128) do not
                owners = [(Component("main", main, ratio=m, interleave=self.interleave("main", shard)),
                           spec.head_dim, csa)]
                if csa:
                    owners.append((Component("index", index, ratio=m, interleave=self.interleave("index", shard)),
                                   spec.index_head_dim, True))
                comps += [c for c, _, _ in owners]
                if m > 1:
                    comps += [tail(c, dims, overlap) for c, dims, overlap in owners]
            layers.append(LayerCache(i, "swa" if not m else ("csa" if m < 128 else "hca"), tuple(comps)))
        notes = ["every layer keeps a sliding window of `sliding_window` tokens (bounded)",
                 "CSA layers (ratio 4) store a compressed entry and an indexer key per 4 tokens; HCA (ratio 128) "
                 "an entry per 128 tokens and no indexer key",
                 "compressor tails (pending tokens' kv and gate projections, BF16) are bounded state"]
        return layers, notes


@register
class DeepSeekV41(DeepSeekV4):
    name = "dsv41"
    description = "DeepSeek V4.1: CSA2 with KV-source layers (Full / Reindex / Reuse)"
    order = 100
    recipes = {"storage": {"main": (("all", "nvfp4"),), "index": (("all", "mxfp4"),), "swa": V4_ENTRY}}
    align = {"swa": 8}
    splits = {"main": Split("replicated", True, f"{V4_TP}; {VLLM_V41_DCP}"),
              "index": Split("replicated", True, f"{V4_TP}; {VLLM_V41_DCP}"),
              "swa": Split("replicated", False, VLLM_V41_DCP),
              "tail": Split("replicated", False, VLLM_V41_DCP)}
    vllm = None  # no published vLLM layout for V4.1
    sources = "DeepSeek-V4.1-Flash config.json (kv_source_layer_ids, index_source_layer_ids), model card and report"

    def detect(self, cfg: dict) -> bool:
        return bool(cfg.get("compress_ratios")) and bool(cfg.get("kv_source_layer_ids"))

    def build(self, spec, scheme, fmts, shard):
        self.check_shard(spec, shard)
        main, index, swa = self.entries(spec, scheme, fmts)
        sources = sorted(spec.kv_source_layers)
        layers = []
        for i, m in enumerate(spec.compress_ratios):
            comps = [Component("swa", swa, window=spec.sliding_window)]  # a ring of W (WINDOW_RULES["deepseek_v4"])
            if not m:
                layers.append(LayerCache(i, "swa", tuple(comps)))
                continue
            if i in sources:
                owners = [(Component("main", main, ratio=m, interleave=self.interleave("main", shard)), spec.head_dim),
                          (Component("index", index, ratio=m, interleave=self.interleave("index", shard)),
                           spec.index_head_dim)]
                comps += [c for c, _ in owners]
                if m > 1:
                    comps += [tail(c, dims, True) for c, dims in owners]
                layers.append(LayerCache(i, "full", tuple(comps)))
            else:
                src = max((s for s in sources if s <= i), default=None)
                mode = "reindex" if i in spec.index_source_layers else "reuse"
                layers.append(LayerCache(i, mode, tuple(comps), source=src))
        notes = ["only kv_source_layer_ids (Full layers) store entries; Reindex and Reuse layers read their source's "
                 "entries and store none",
                 "index_source_layer_ids that are not KV sources (Reindex layers) are assumed to score over their "
                 "source's indexer keys and store none (the published 890 B/token requires it)",
                 "every layer keeps a 128-token FP8 sliding window (bounded; V4's 584 B entry assumed)"]
        return layers, notes

    def replay_window(self, spec) -> int:
        """V4.1 keeps its window state in host RAM with a TTL; a miss replays the last `sliding_window` tokens."""
        return spec.sliding_window or 0

    def explain(self, layout) -> list[str]:
        return explain_layout(layout, summary=factorized)


def factorized(layout) -> list[str]:
    """DeepSeek's factorisation, (entries per token) x (bytes per position), when every storing layer holds the
    same set of entries."""
    per_layer: dict[int, list] = {}
    for layer, c in layout.components(True):
        per_layer.setdefault(layer.index, []).append((c.role, c.entry_bytes, c.ratio * c.interleave))
    sets = {tuple(sorted((r, b) for r, b, _ in v)) for v in per_layer.values()}
    if len(sets) != 1:
        return []
    ept = sum((Fraction(1, v[0][2]) for v in per_layer.values()), Fraction(0))
    first = per_layer[min(per_layer)]
    pos = sum(b for _, b, _ in first)
    terms = " + ".join(f"{len([i for i, v in per_layer.items() if v[0][2] == r])} x 1/{r}"
                       for r in sorted({v[0][2] for v in per_layer.values()}, reverse=True))
    return [f"entries per token: {terms} = {fmt_bytes(ept)}",
            f"{fmt_bytes(ept)} x ({' + '.join(f'{b:,}' for _, b, _ in first)}) = {fmt_bytes(ept * pos)} B per token"]

