"""Notebook 06's parameters (sessions per GPU). Checked on construction, so a bad value stops the notebook in its
second cell.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..hardware import gpu_names
from ..models import catalog_names
from .params import NotebookParams


@dataclass
class SessionsParams(NotebookParams):
    """Notebook 06's parameters (sessions per GPU), checked on construction; `kw` is what `plan` takes."""

    models: list  # catalog models to plan for
    gpus: list  # GPUs from data/hardware.json
    contexts: list  # session lengths in tokens
    prefix_hit_rates: list  # shares of each session served from a shared prefix cache
    ttls_s: list  # host-DRAM TTLs for V4.1-Flash's window state, seconds
    utilization: float  # share of device memory the engine may use
    activation_gb: float  # reserve for activations and non-torch memory per GPU
    synthetic_sessions: int  # sessions in the synthetic agent workload that supplies pause times
    seed: int  # seed of the synthetic workload
    checklist_model: str  # model for the worked checklist
    checklist_gpu: str  # GPU for the worked checklist
    checklist_context: int  # session length for the worked checklist
    checklist_prefix_hit_rate: float  # prefix-hit share for the worked checklist
    prefill_tokens_per_s: float  # prefill rate for recompute times
    decode_tokens_per_s: float  # one GPU's decode throughput at full batch
    tokens_per_request: int  # generated tokens per request
    tokens_per_s_per_session: float  # decode speed each live session gets
    deployment_gpu: str  # GPU of the multi-GPU deployment table
    deployment_size: int  # GPUs per deployment: the TP size, and the ranks of DP attention
    deployment_models: list  # models for the deployment table
    vllm_models: list  # models for vLLM's own plan (reserved at admission beside held while decoding)
    vllm_kv_cache_memory_gib: float  # KV memory handed to vLLM per GPU (its --kv-cache-memory-bytes), GiB
    vllm_max_model_len: int  # the request length vLLM plans for
    vllm_tps: list  # tensor-parallel sizes of vLLM's plan
    kw: dict = field(init=False)  # utilization and activation_gb, as `plan` takes them

    def __post_init__(self):
        models, gpus = catalog_names(), gpu_names()
        self.need_names("models", models)
        self.need_choice("checklist_model", models, self.need_text("checklist_model"))
        for g in self.need_names("gpus"):
            self.need_choice("gpus", gpus, g.upper())
        self.need_choice("checklist_gpu", gpus, self.need_text("checklist_gpu").upper())
        self.need_ints("contexts")
        self.need_numbers("prefix_hit_rates", 0.0, 1.0)
        self.need_numbers("ttls_s", 0.0, lo_open=True)
        self.need_number("utilization", 0.01, 1.0)
        self.need_number("activation_gb", 0.0)
        self.need_int("synthetic_sessions")
        self.need_int("seed", 0)
        self.need_int("checklist_context")
        self.need_number("checklist_prefix_hit_rate", 0.0, 1.0)
        for name in ("prefill_tokens_per_s", "decode_tokens_per_s", "tokens_per_s_per_session"):
            self.need_number(name, 0.0, lo_open=True)
        self.need_int("tokens_per_request")
        self.need_names("deployment_models", models)
        self.need_choice("deployment_gpu", gpus, self.need_text("deployment_gpu").upper())
        self.need_int("deployment_size")
        self.need_names("vllm_models", models)
        self.need_number("vllm_kv_cache_memory_gib", 0.0, 2.0**30, lo_open=True)
        self.need_int("vllm_max_model_len", 1, 2**31)
        self.need_ints("vllm_tps", 1, 1024)
        self.kw = dict(utilization=self.utilization, activation_gb=self.activation_gb)

    @property
    def vllm_kv_bytes(self) -> int:
        """vllm_kv_cache_memory_gib in bytes."""
        return int(self.vllm_kv_cache_memory_gib * 2**30)
