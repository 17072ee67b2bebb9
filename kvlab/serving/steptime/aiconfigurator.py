"""Step times from NVIDIA aiconfigurator's measured operation data (PyPI aiconfigurator-core 0.12.0, Apache-2.0;
the optional extra `kvlab[serving]`, installed by `make`).

One `aiconfigurator_core.sdk.engine.EngineHandle.compile(model_id, system, backend, tp_size=...,
kvcache_quant_mode=...)` per combination; a step maps onto its queries (sdk/engine.py):
  prefill only   predict_prefill_latency(batch, isl=cached + tokens, prefix=cached)
  decode only    decode_step_latency(batch, isl=context, osl=1): evaluated at isl + osl // 2 + 1 = context + 1
                 keys, the cached tokens and the new one
  mixed          mixed_step_latency(ctx_tokens, n_decode, isl, osl, prefix): aiconfigurator's average-request
                 model (sdk/rust_engine_step.py: non-attention ops on all tokens, context attention of an
                 isl-token prompt / ceil(isl / ctx_tokens), decode attention at isl + osl // 2 + 1); kvlab passes
                 isl = cached + tokens of the mean chunk, prefix = its cached tokens and the osl that puts the
                 decode context at the mean decode context (at least isl + 1)
Chunks or decode contexts that differ within a step are priced at their mean (aiconfigurator takes one length).
Coverage: systems/support_matrix/<system>.csv rows with Mode agg and Status PASS at the backend's default version.
Every call into aiconfigurator runs inside `quiet()`: its table loader logs each cross-backend fill it uses, and
aiconfigurator 0.12.0 warns (DeprecationWarning) that its CLI and sweep functions move to the `aisimulate` package
in 0.13.0; kvlab pins 0.12.0 (pyproject's `serving` extra), so those notices are caught and kept in NOTICES, never
printed at the user.
"""
from __future__ import annotations

import contextlib
import csv
import functools
import importlib.metadata
import importlib.util
import io
import logging
import warnings
from pathlib import Path

from ...errors import ParameterError
from ...models import load_model
from .base import Chunk, Step, StepTime, StepTimeSource

# kvlab catalog name -> aiconfigurator model id (its model_configs/ and support matrix)
MODEL_IDS = {
    "qwen3-8b": "Qwen/Qwen3-8B",
    "llama-3.1-8b": "meta-llama/Meta-Llama-3.1-8B",
    "llama-3.1-70b": "meta-llama/Meta-Llama-3.1-70B",
    "deepseek-v3": "deepseek-ai/DeepSeek-V3",
    "deepseek-v3.2": "deepseek-ai/DeepSeek-V3.2",
    "deepseek-v4-flash": "deepseek-ai/DeepSeek-V4-Flash",
    "deepseek-v4-pro": "deepseek-ai/DeepSeek-V4-Pro",
    "gpt-oss-20b": "openai/gpt-oss-20b",
    "gpt-oss-120b": "openai/gpt-oss-120b",
}
SYSTEMS = {"H100": "h100_sxm", "H200": "h200_sxm", "B200": "b200_sxm", "L40S": "l40s"}  # kvlab GPU -> system
# kvlab KV format (None: the model's dtype) -> kvcache_quant_mode (sdk/common.py KVCacheQuantMode)
KV_MODES = {None: None, "bf16": "bfloat16", "fp8_e4m3": "fp8", "int8": "int8"}
EXTRA_KWARGS = {"deepseek-ai/DeepSeek-V3": dict(fmha_quant_mode="bfloat16")}  # the SDK needs it (serving.md)


PINNED = "0.12.0"  # the aiconfigurator(-core) release kvlab's figures and calls are checked against (pyproject)
NOTICES: list[str] = []  # warnings aiconfigurator raised inside quiet() (its deprecation notices), first of each


def available() -> bool:
    """True when aiconfigurator-core is importable."""
    return importlib.util.find_spec("aiconfigurator_core") is not None


def version() -> str | None:
    """The installed aiconfigurator-core's version (None: not installed)."""
    try:
        return importlib.metadata.version("aiconfigurator-core")
    except importlib.metadata.PackageNotFoundError:
        return None


@contextlib.contextmanager
def quiet():
    """Run aiconfigurator without its chatter reaching the user: its loggers at ERROR, its stdout swallowed and
    its warnings (DeprecationWarning: the CLI moving to `aisimulate`; pandas' FutureWarnings) caught into NOTICES."""
    logs = [logging.getLogger(n) for n in ("aiconfigurator", "aiconfigurator_core")]
    levels = [g.level for g in logs]
    for g in logs:
        g.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(record=True) as caught, contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("always")
            yield
    finally:
        for g, lv in zip(logs, levels):
            g.setLevel(lv)
    for w in caught:
        text = f"{w.category.__name__}: {str(w.message).splitlines()[0]}"
        if text not in NOTICES:
            NOTICES.append(text)


def _root() -> Path:
    return Path(importlib.util.find_spec("aiconfigurator_core").origin).parent


@functools.lru_cache(maxsize=None)
def _default_version(system: str, backend: str) -> str | None:
    from aiconfigurator_core.sdk import engine
    try:
        return engine._literal_backend_version(system, backend, None, None, None)
    except (ValueError, KeyError, OSError):
        return None


@functools.lru_cache(maxsize=None)
def support(system: str) -> dict:
    """(model id, backend, version) -> status for aggregated serving, from the support matrix."""
    path = _root() / "systems" / "support_matrix" / f"{system}.csv"
    if not path.exists():
        return {}
    with path.open(newline="", encoding="utf-8") as f:
        return {(r["HuggingFaceID"], r["Backend"], r["Version"]): r["Status"] for r in csv.DictReader(f)
                if r["Mode"] == "agg"}


def why_not(model, gpu: str, engine: str, tp: int, kv_format: str | None) -> str | None:
    """None when aiconfigurator covers the combination, else the reason in one clause."""
    if not available():
        return "aiconfigurator-core is not installed (pip install 'kvlab[serving]')"
    name = load_model(model).name
    if name not in MODEL_IDS:
        return f"aiconfigurator has no model for {name!r} (it covers {', '.join(MODEL_IDS)})"
    if gpu.upper() not in SYSTEMS:
        return f"aiconfigurator has no data for GPU {gpu} (it covers {', '.join(SYSTEMS)})"
    if kv_format not in KV_MODES:
        return f"aiconfigurator has no KV mode for {kv_format!r} (it prices {', '.join(k or 'the model dtype' for k in KV_MODES)})"
    system = SYSTEMS[gpu.upper()]
    version = _default_version(system, engine)
    status = support(system).get((MODEL_IDS[name], engine, version))
    if status != "PASS":
        return (f"aiconfigurator's support matrix lists {MODEL_IDS[name]} on {system} {engine} {version} as "
                f"{status or 'absent'}")
    return None


@functools.lru_cache(maxsize=64)
def _handle(model_id: str, system: str, engine: str, tp: int, kv_mode: str | None, moe: bool):
    from aiconfigurator_core.sdk.engine import EngineHandle
    kw = dict(EXTRA_KWARGS.get(model_id, {}))
    if moe:  # experts tensor-parallel over the same ranks (vLLM's default without --enable-expert-parallel)
        kw["moe_tp_size"] = tp
    if kv_mode is not None:
        kw["kvcache_quant_mode"] = kv_mode
    with quiet():  # its table loader warns about every cross-backend fill it uses
        return EngineHandle.compile(model_id, system, engine, tp_size=tp, **kw)


class Aiconfigurator(StepTimeSource):
    """aiconfigurator's engine model for one combination it covers (a ParameterError otherwise)."""

    name = "aiconfigurator"
    estimate = False

    def __init__(self, model, gpu: str, engine: str, tp: int = 1, kv_format: str | None = None):
        reason = why_not(model, gpu, engine, tp, kv_format)
        if reason:
            raise ParameterError(f"step-time source aiconfigurator: {reason}")
        from ..stepmodel import Target
        self.target = Target.of(model, gpu, engine, tp, 1, kv_format)  # the deployment it prices
        self.model_id = MODEL_IDS[load_model(model).name]  # aiconfigurator's model id
        self.system = SYSTEMS[gpu.upper()]  # aiconfigurator's system name
        self.engine, self.tp, self.kv_mode = engine, tp, KV_MODES[kv_format]
        from .roofline import moe_shape
        moe = moe_shape(load_model(model))[0] > 0
        try:
            self.handle = _handle(self.model_id, self.system, engine, tp, self.kv_mode, moe)
        except (ValueError, RuntimeError, KeyError, TypeError, NotImplementedError, AssertionError,
                OverflowError) as e:
            raise ParameterError(f"aiconfigurator cannot compile {self.model_id} on {self.system} {engine} TP {tp}: "
                                 f"{str(e).splitlines()[0][:200]}") from None
        self._priced: dict = {}  # (query, its arguments) -> ms: the serving loop asks the same steps again and again

    @classmethod
    def for_deployment(cls, d) -> "Aiconfigurator":
        """aiconfigurator knows GPUs by their catalog name (its `support` keys, upper case); weights are its own."""
        return cls(d.model, d.gpu.name.upper(), d.engine, d.tp, d.kv_format)

    def _query(self, n_pre: int, tokens: int, cached: int, n_dec: int, ctx: int) -> tuple[str, tuple]:
        """The EngineHandle query and arguments a step maps onto (module docstring): a step of `n_pre` chunks of
        (mean) `tokens` new on `cached` cached tokens and `n_dec` decodes at (mean) context `ctx`."""
        if not n_dec:
            return "predict_prefill_latency", (n_pre, cached + tokens, cached)
        if not n_pre:
            return "decode_step_latency", (n_dec, ctx, 1)
        isl = cached + tokens
        osl = max(1, 2 * (ctx - isl))  # decode context isl + osl // 2 + 1
        return "mixed_step_latency", (tokens * n_pre, n_dec, isl, osl, cached)

    def _ms(self, query: str, args: tuple, what) -> float:
        key = (query, args)
        ms = self._priced.get(key)
        if ms is None:
            try:
                with quiet():
                    ms = float(getattr(self.handle, query)(*args))
            except (ValueError, RuntimeError, KeyError, TypeError, AssertionError, OverflowError) as e:
                raise ParameterError(f"aiconfigurator cannot price {what()} ({self._where()}): "
                                     f"{str(e).splitlines()[0][:200]}") from None
            self._priced[key] = ms
        return ms

    def _where(self) -> str:
        return f"{self.model_id} on {self.system}, {self.engine}, TP {self.tp}, KV {self.kv_mode or 'model dtype'}"

    def basis(self) -> str:
        backend = _default_version(self.system, self.engine)
        return (f"NVIDIA aiconfigurator-core {version()}'s engine model over measured kernel data for {self.model_id} "
                f"on {self.system}, {self.engine} {backend}, TP {self.tp}, KV {self.kv_mode or 'model dtype'}")

    @staticmethod
    def _means(chunks, decode) -> tuple[int, int, int, int, int]:
        """(chunks, mean new tokens, mean cached, decodes, mean decode context): what aiconfigurator takes."""
        n_pre, n_dec = len(chunks), len(decode)
        tokens = round(sum(n for n, _ in chunks) / n_pre) if n_pre else 0
        cached = round(sum(c for _, c in chunks) / n_pre) if n_pre else 0
        ctx = round(sum(decode) / n_dec) if n_dec else 0
        return n_pre, tokens, cached, n_dec, ctx

    def time(self, step: Step) -> StepTime:
        query, args = self._query(*self._means([(c.tokens, c.cached) for c in step.prefill], step.decode))
        ms = self._ms(query, args, step.label)
        return StepTime(ms, self.name, False, f"{self._where()}: {query}{args}")

    def decode_run_s(self, contexts, steps: int):
        """[steps] seconds of consecutive decode-only steps of one batch, step j at `contexts` + j: each equals
        `step_s([], contexts + j)` (one decode_step_latency query per distinct mean context, remembered)."""
        import numpy as np
        ctx = [int(c) for c in contexts]
        b, low, s = len(ctx), min(ctx), sum(ctx)
        out = np.empty(steps)
        for j in range(steps):
            total = s + b * j if low + j >= 1 else sum(max(1, c + j) for c in ctx)  # contexts >= 1
            key = ("decode_step_latency", (b, round(total / b), 1))
            ms = self._priced.get(key)
            out[j] = (self._ms(*key, lambda: f"{b} decode(s)") if ms is None else ms) / 1e3
        return out

    def step_s(self, prefill, decode) -> float:
        """The simulator's protocol without a Step per call: `time(Step(...)).ms / 1e3` (decode contexts >= 1)."""
        dec = [max(1, int(c)) for c in decode]
        chunks = [(int(n), int(c)) for n, c in prefill]
        query, args = self._query(*self._means(chunks, dec))
        return self._ms(query, args, lambda: Step(tuple(Chunk(n, c) for n, c in chunks), tuple(dec)).label()) / 1e3
