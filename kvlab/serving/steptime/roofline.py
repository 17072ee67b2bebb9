"""A roofline estimate of one step from kvlab's own counts, for what aiconfigurator does not cover.

  t = OVERHEAD_MS + max(FLOPs / (peak x COMPUTE_EFFICIENCY), bytes / (bandwidth x MEMORY_EFFICIENCY))
per GPU of a TP group (pipeline stages and TP communication are not modelled), where
  bytes   weights read once per step (this GPU's 1/TP share; an MoE reads its shared experts and the routed
          experts the step's tokens touch, E x (1 - (1 - k/E)^tokens) of E under uniform routing) + the KV the
          step reads: every decode request's and every chunk's cached context as kvlab's layout holds it on this
          GPU (kvlab.engines.allocate under the engine, `layout.session(context).total`: growing + bounded state,
          so a KV format changes this term by exactly its bytes; a sparse model's selected entries are not singled
          out, the held cache is read)
  FLOPs   2 x active parameters per computed token (attention and MLP projections, the active experts, the LM
          head) / TP, + attention over the keys each new token sees: 4 x heads x key width per key per attention
          layer / TP (MLA absorbed: 2 x heads x (2 x kv_lora_rank + rope)); windows cap the keys; DeepSeek V4 /
          V4.1 layouts take the context part of kvlab.attention.flops.decode_flops (compressed entries, indexer)
Peaks and bandwidth from data/hardware.json (bf16_tflops, or fp8_tflops for FP8 checkpoints; hbm_tb_s).
The three constants are assumptions fitted to aiconfigurator 0.12.0 (Qwen3-8B, H200, vLLM, TP 1, BF16: decode
batches 1-256 at 1K-32K, prefill 512-16K); `kvlab.serving.steptime.calibrate` re-measures them. Errors against
aiconfigurator on points it covers (CALIBRATION): mean 3.6% on the fit set, 5.3% held out on one GPU, 13-32% low
at TP 4 (communication not modelled), and far low for MoE models at TP 4-8 (a lower bound there).
"""
from __future__ import annotations

import math
from collections import Counter

import numpy as np

from ...attention.flops import DecodeCounter
from ...checks import need_number
from ...engines import ENGINES, allocate
from ...errors import KvlabError, ParameterError
from ...layout import Shard
from ...models import load_model
from ...sim.kernels import ENABLED
from ..capacity import param_bits, weight_bytes
from ...hardware import get_gpu
from .base import Step, StepTime, StepTimeSource

if ENABLED:
    from numba import njit
    _compiled = njit(cache=True, nogil=True)
else:  # pragma: no cover - without numba the kernel below runs as plain Python
    def _compiled(f):
        return f


@_compiled
def _run_sums(kv_at, fl_at, ctx, kv, fl):
    """kv[j], fl[j]: the batch's KV bytes and decode FLOPs (whole numbers, summed exactly in int64) at contexts
    ctx + j (at least 1) from the per-context tables, for every step j of a decode stretch ([steps] each), without
    the [steps, B] gathers."""
    for j in range(kv.shape[0]):
        a = 0
        f = 0
        for c in ctx:
            x = max(c + j, 1)
            a += kv_at[x]
            f += np.int64(fl_at[x])
        kv[j] = a
        fl[j] = f

MEMORY_EFFICIENCY = 0.92  # assumption (fitted): share of hbm_tb_s a step's weight and KV reads achieve
COMPUTE_EFFICIENCY = 0.80  # assumption (fitted): share of the dense tensor peak a step's matmuls achieve
OVERHEAD_MS = 1.6  # assumption (fitted): per-step fixed cost (launches, sampling, scheduling), ms
# Measured 2026-12-01 with kvlab.serving.steptime.calibrate (roofline / aiconfigurator - 1):
CALIBRATION = ("fit set (Qwen3-8B H200 vLLM, 20 steps) mean |error| 3.6%, max 15%; held out (Qwen3-8B H200 "
               "SGLang / TRT-LLM, H100 and B200 vLLM, Llama-3.1-8B H200 vLLM, 25 steps) mean 5.3%, max 21% "
               "(mixed steps and B200 prefill run low); L40S vLLM -22% to +5%; Llama-3.1-70B H100 vLLM TP 4 13-32% "
               "low (TP all-reduce not modelled); MoE far low: DeepSeek-V3 H200 TP 8 -27% to -83%, "
               "DeepSeek-V4-Flash B200 TP 4 -55% to -92% (expert and TP communication, small-batch MoE kernels "
               "and per-layer costs not modelled: treat MoE roofline figures as lower bounds)")


TABLE_MAX = 1 << 22  # contexts the per-context tables cover at most (32 MB each); longer steps are priced directly


class _Lookup(dict):
    """Per-context figures of one step past TABLE_MAX, indexed like the tables (context 0 priced as 1)."""

    def __getitem__(self, c):
        return super().__getitem__(max(c, 1))


def _c(cfg: dict, *keys, default=0):
    for k in keys:
        v = cfg.get(k)
        if v:
            return v
    return default


def moe_shape(spec) -> tuple[int, int, float]:
    """(routed experts E, experts per token k, parameters of all routed experts) from the config; (0, 0, 0) dense."""
    c = spec.config
    e = _c(c, "n_routed_experts", "num_experts", "num_local_experts")
    if not e:
        return 0, 0, 0.0
    k = _c(c, "num_experts_per_tok", "experts_per_token", default=1)
    inter = _c(c, "moe_intermediate_size", "intermediate_size")
    period = c.get("expert_layer_period")
    layers = spec.num_layers // period if period else spec.num_layers - (c.get("first_k_dense_replace") or 0)
    return e, k, float(layers * e * 3 * spec.hidden_size * inter)


class Roofline(StepTimeSource):
    """The roofline for one (model, GPU, engine, TP, KV format); every figure is an estimate."""

    name = "roofline"
    estimate = True

    def __init__(self, model, gpu, engine: str, tp: int = 1, kv_format: str | None = None, *,
                 memory_efficiency: float = MEMORY_EFFICIENCY, compute_efficiency: float = COMPUTE_EFFICIENCY,
                 overhead_ms: float = OVERHEAD_MS, weights: int | None = None):
        if engine not in ENGINES:
            raise ParameterError(f"unknown engine {engine!r}; choose one of {', '.join(ENGINES)}")
        self.spec = load_model(model)  # the model
        self.gpu = get_gpu(gpu)  # the accelerator (hardware table)
        self.engine, self.tp, self.kv_format = engine, tp, kv_format
        from ..stepmodel import Target
        self.target = Target.of(self.spec, self.gpu, engine, tp, 1, kv_format)  # the deployment it prices
        self.memory_efficiency = need_number("memory_efficiency", memory_efficiency, 0.0, 1.0, lo_open=True)
        self.compute_efficiency = need_number("compute_efficiency", compute_efficiency, 0.0, 1.0, lo_open=True)
        self.overhead_ms = need_number("overhead_ms", overhead_ms, 0.0, 1e6)
        try:  # this GPU's cache layout: the engine's, else the model's own storage (no published engine layout)
            self.alloc, self.layout_note = allocate(self.spec, None, kv_format, engine, shard=Shard(tp)), ""
        except KvlabError as e:
            self.alloc = allocate(self.spec, "storage", kv_format, shard=Shard(tp))
            self.layout_note = f"; KV counted as the model stores it ({str(e).split(';')[0]})"
        w = weight_bytes(self.spec) if weights is None else None
        self.weight_bytes = w.nbytes if w else int(weights)  # whole-model weight bytes
        self.experts, self.top_k, self.routed_params = moe_shape(self.spec)  # routed experts from the config
        self.weights_note = ""  # how given weights were split into parameters
        if w:
            self.params = w.params  # total parameters (data/weights.json)
            self.routed_bytes = self.routed_params * (self.weight_bytes / self.params)  # bytes of routed experts
        else:  # given weights: parameters at the config's bits (capacity.param_bits), routed experts counted first
            quant = self.spec.config.get("quantization_config")
            quant = quant if isinstance(quant, dict) else None
            eb, ob = param_bits(quant, self.spec.torch_dtype, True), param_bits(quant, self.spec.torch_dtype, False)
            self.routed_bytes = self.routed_params * eb / 8
            if self.routed_bytes > self.weight_bytes:  # the config's experts at its bits exceed the weights given
                self.weights_note = (f"; the {self.weight_bytes / 1e9:g} GB of weights given hold less than the "
                                     f"config's {self.routed_params / 1e9:.1f}B routed expert parameters at {eb:g} "
                                     "bits: all of them taken as routed experts")
                self.routed_bytes = float(self.weight_bytes)
                self.routed_params = self.routed_bytes * 8 / eb
            self.params = self.routed_params + (self.weight_bytes - self.routed_bytes) * 8 / ob
        quant = self.spec.config.get("quantization_config") or {}
        self.dtype = "fp8" if isinstance(quant, dict) and quant.get("quant_method") == "fp8" else "bf16"
        self.peak = self.gpu.flops_per_s(self.dtype)  # FLOP/s
        # DeepSeek V4 / V4.1: kvlab.attention.flops' counts of compressed entries, windows and the indexer
        self.v4 = DecodeCounter(self.spec) if self.spec.compress_ratios else None
        self._windows = None  # other layouts: attention layers per window, on first use (_keys_flops)
        self._kv_at: list[int] = []  # [C] KV bytes of one request at context c (index c >= 1), grown on demand
        self._flops_at: list[float] = []  # [C] attention FLOPs of one decode token at context c (same elementwise ops)
        self._kv_np = np.zeros(0, np.int64)  # [C] `_kv_at` as an array (a stretch of decode steps gathers from it)
        self._fl_np = np.zeros(0)  # [C] `_flops_at` as an array
        self._fl_whole = False  # every `_flops_at` entry a whole number below 2^53 (row sums exact in int64)

    @classmethod
    def for_deployment(cls, d) -> "Roofline":
        return cls(d.model, d.gpu, d.engine, d.tp, d.kv_format, weights=d.weights)

    def basis(self) -> str:
        return (f"kvlab's weight, KV and FLOP counts for {self.spec.name} on {self.gpu.name} ({self.engine}, TP "
                f"{self.tp}, KV {self.kv_format or 'own format'}) at {self.memory_efficiency:g} of "
                f"{self.gpu.hbm_tb_s:g} TB/s and {self.compute_efficiency:g} of {self.peak / 1e12:g} {self.dtype} "
                f"TFLOPS + {self.overhead_ms:g} ms a step, constants fitted to aiconfigurator 0.12.0's Qwen3-8B / "
                "H200 / vLLM figures" + ("; TP communication not modelled (13-32% low at TP 4)" if self.tp > 1 else "")
                + ("; MoE: a lower bound" if self.experts else "") + self.weights_note)

    # --- counts -------------------------------------------------------------------------------------------------
    def weight_read_bytes(self, tokens: int) -> float:
        """Weight bytes this GPU reads in a step computing `tokens` tokens."""
        if not self.experts:
            return self.weight_bytes / self.tp
        touched = 1 - (1 - self.top_k / self.experts) ** tokens
        routed = self.routed_bytes
        return ((self.weight_bytes - routed) + routed * touched) / self.tp

    def kv_read_bytes(self, step: Step) -> int:
        """KV bytes this GPU reads: every request's cached context as the layout holds it."""
        return self._kv_bytes(list(step.decode), [(c.tokens, c.cached) for c in step.prefill])

    def _kv_bytes(self, decode: list, chunks: list) -> int:
        kv_at, _ = self._tables(decode, chunks)
        return sum(map(kv_at.__getitem__, decode)) + sum(kv_at[c] for _, c in chunks if c)

    def active_params(self) -> float:
        if not self.experts:
            return self.params
        return self.params - self.routed_params * (1 - self.top_k / self.experts)

    def _keys_flops(self, keys: np.ndarray) -> np.ndarray:
        """[N] attention FLOPs (whole model) of one new token seeing each of `keys` keys ([N]; not a DeepSeek V4 /
        V4.1 layout: those go through `self.v4`). Layers are grouped by window, worked out once."""
        if self._windows is None:
            s = self.spec
            width = 2 * (2 * s.kv_lora_rank + (s.qk_rope_head_dim or 0)) if s.kv_lora_rank else 4 * s.head_dim
            self._per_key = width * s.num_heads  # FLOPs per key per attention layer
            self._windows = Counter(w for w, k in zip(s.layer_windows or [None] * s.num_layers,
                                                      s.layer_kinds or ["attention"] * s.num_layers)
                                    if k in ("attention", "hybrid"))  # window (None: full) -> layers
        out = np.zeros(keys.shape)
        for w, n in self._windows.items():
            out += n * (np.minimum(keys, w) if w else keys)
        return self._per_key * out

    def flops(self, step: Step) -> float:
        """FLOPs this GPU computes in the step: every decode request and prefill chunk priced in one call."""
        return self._flops(list(step.decode), [(c.tokens, c.cached) for c in step.prefill], step.tokens)

    def _flops(self, decode: list, chunks: list, tokens: int) -> float:
        _, fl_at = self._tables(decode, chunks)
        per = list(map(fl_at.__getitem__, decode))  # a decode token at each context
        if chunks:  # a chunk's tokens priced alike, at its middle
            if self.v4 is not None:  # compressed entries, windows and the indexer at each context
                per += [fl_at[max(c + n // 2, 1)] * n for n, c in chunks]
            else:  # a causal chunk's tokens see cached + 1 .. cached + tokens keys
                kf = self._keys_flops(np.array([c + (n + 1) / 2 for n, c in chunks], float))
                per += (kf * np.array([n for n, _ in chunks], float)).tolist()
        # fsum: the same total on every CPU (a BLAS dot is not)
        return (2 * self.active_params() * tokens + math.fsum(per)) / self.tp

    def _tables(self, decode: list, chunks: list):
        """Per-context KV bytes and decode-token attention FLOPs, [C] each (index c: context c; 0 priced as 1),
        covering every context of the step: a step's figures are sums of their entries, so the serving loop's
        ~10^5 steps a run look contexts up instead of pricing each anew. Grown by doubling up to TABLE_MAX
        contexts; a step past it (a huge context typed into `kvlab step-time`) gets its own contexts priced in a
        dict, so no size a user can type allocates more than the step itself."""
        hi = max(decode, default=1)
        for n, c in chunks:
            hi = max(hi, c + n)
        if hi >= TABLE_MAX:
            ctx = np.array(sorted({max(c, 1) for c in decode} | {max(c, 1) for _, c in chunks}
                                  | {max(c + n // 2, 1) for n, c in chunks}), dtype=np.int64)  # [U] distinct
            kv = self.alloc.layout.totals(ctx).tolist()
            fl = (self.v4.context_flops(ctx) if self.v4 is not None else self._keys_flops((ctx + 1).astype(float)))
            return _Lookup(zip(ctx.tolist(), kv)), _Lookup(zip(ctx.tolist(), fl.tolist()))
        if hi >= len(self._kv_at):
            t = np.maximum(np.arange(max(hi + 1, 2 * len(self._kv_at), 4096), dtype=np.int64), 1)  # [C]
            self._kv_np = self.alloc.layout.totals(t)
            self._fl_np = (self.v4.context_flops(t) if self.v4 is not None
                           else self._keys_flops((t + 1).astype(float)))  # a decode sees context + 1 keys
            self._kv_at, self._flops_at = self._kv_np.tolist(), self._fl_np.tolist()
            self._fl_whole = bool(np.all(np.floor(self._fl_np) == self._fl_np) and self._fl_np.max() < 2.0 ** 53)
            self._fl_max = float(self._fl_np.max())  # the largest decode FLOPs in the table
        return self._kv_at, self._flops_at

    def _terms(self, decode: list, chunks: list) -> tuple[float, int, float, float, float]:
        """(weight bytes, KV bytes, FLOPs, memory ms, compute ms) of a step given as decode contexts and
        (tokens, cached) chunks: what `time` reports and `step_s` sums, computed once for both."""
        tokens = sum(n for n, _ in chunks) + len(decode)
        wb, kv, fl = self.weight_read_bytes(tokens), self._kv_bytes(decode, chunks), self._flops(decode, chunks, tokens)
        mem_ms = (wb + kv) / (self.gpu.hbm_bytes_per_s * self.memory_efficiency) * 1e3
        cmp_ms = fl / (self.peak * self.compute_efficiency) * 1e3
        return wb, kv, fl, mem_ms, cmp_ms

    def step_s(self, prefill, decode) -> float:
        """The simulator's protocol without a Step per call (the serving loop prices ~10^5 steps a run): the same
        figure as `time(Step(...)).ms / 1e3` (tests/test_steptime.py)."""
        d = list(map(int, decode))
        if d and min(d) < 1:  # a context of 0 is priced as 1
            d = [max(1, c) for c in d]
        _, _, _, mem_ms, cmp_ms = self._terms(d, [(int(n), int(c)) for n, c in prefill])
        return float((self.overhead_ms + max(mem_ms, cmp_ms)) / 1e3)

    def decode_run_s(self, contexts, steps: int) -> np.ndarray:
        """[steps] seconds of `steps` consecutive pure-decode steps of one batch, step j at `contexts` + j ([B]):
        what the simulator fast-forwards between events. Each figure equals `step_s([], contexts + j)` exactly
        (integer byte sums, correctly rounded FLOP sums, the same float operations; tests/test_serve_fast.py)."""
        ctx = np.asarray(contexts, np.int64)  # [B]
        b = ctx.size
        wb = self.weight_read_bytes(b)
        f = 2 * self.active_params() * b
        hi = max(int(ctx.max()) + steps - 1, 1) if b and steps else 1  # the longest context priced
        fl = None
        if hi < TABLE_MAX:  # from the per-context tables (the same figures, computed once)
            self._tables([hi], [])
            if self._fl_whole and b * self._fl_max < 2.0 ** 62 and self._kv_np.dtype == np.int64:
                # whole numbers: int64 sums are exact, and casting one rounds once, as fsum does
                kv, fls = np.empty(steps, np.int64), np.empty(steps, np.int64)  # [steps] each
                _run_sums(self._kv_np, self._fl_np, ctx, kv, fls)
                fl = (f + fls.astype(float)) / self.tp  # [steps]
            else:
                at = np.maximum(ctx[None, :] + np.arange(steps, dtype=np.int64)[:, None], 1)  # [steps, B]
                kv = self._kv_np[at].sum(1)  # [steps] exact ints
                per = self._fl_np[at]  # [steps, B]
        else:
            at = np.maximum(ctx[None, :] + np.arange(steps, dtype=np.int64)[:, None], 1)  # [steps, B]
            kv = self.alloc.layout.totals(at.ravel()).reshape(at.shape).sum(1)  # [steps] exact ints
            per = (self.v4.context_flops(at.ravel()) if self.v4 is not None
                   else self._keys_flops((at + 1).ravel().astype(float))).reshape(at.shape)  # [steps, B]
        if fl is None:  # correctly rounded row sums
            fl = np.array([(f + math.fsum(row)) / self.tp for row in per.tolist()])  # [steps]
        mem_ms = (wb + kv) / (self.gpu.hbm_bytes_per_s * self.memory_efficiency) * 1e3
        cmp_ms = fl / (self.peak * self.compute_efficiency) * 1e3
        return (self.overhead_ms + np.maximum(mem_ms, cmp_ms)) / 1e3

    def time(self, step: Step) -> StepTime:
        wb, kv, fl, mem_ms, cmp_ms = self._terms(list(step.decode), [(c.tokens, c.cached) for c in step.prefill])
        ms = self.overhead_ms + max(mem_ms, cmp_ms)
        parts = dict(weight_bytes=wb, kv_bytes=kv, flops=fl, memory_ms=mem_ms, compute_ms=cmp_ms,
                     overhead_ms=self.overhead_ms, bound="memory" if mem_ms >= cmp_ms else "compute",
                     memory_efficiency=self.memory_efficiency, compute_efficiency=self.compute_efficiency,
                     peak_tflops=self.peak / 1e12, hbm_tb_s=self.gpu.hbm_tb_s)
        note = (f"estimate: {self.spec.name} on {self.gpu.name}, {self.engine}, TP {self.tp}, KV "
                f"{self.kv_format or 'default'}{self.layout_note}; roofline at {self.memory_efficiency:g} of {self.gpu.hbm_tb_s:g} TB/s "
                f"and {self.compute_efficiency:g} of {self.peak / 1e12:g} {self.dtype} TFLOPS + {self.overhead_ms:g} ms"
                f"{self.weights_note}")
        parts["calibration"] = CALIBRATION
        if self.why_not_aiconfigurator:
            parts["why_not_aiconfigurator"] = self.why_not_aiconfigurator
        return StepTime(ms, self.name, True, note, parts)
