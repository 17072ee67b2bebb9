"""Architectures to train from scratch, as transformers models built from their own config classes.

  dense  transformers' Qwen3 (Qwen3Config / Qwen3ForCausalLM): GQA, QK-norm, SwiGLU, tied embeddings
  mla    transformers' DeepSeek-V3 (DeepseekV3Config / DeepseekV3ForCausalLM): multi-head latent attention
         with the decoupled RoPE key; every layer's MLP dense (first_k_dense_replace = layers: no MoE, which
         changes no cached byte), no MTP module
  v41    kvlab's DeepSeek V4.1-like stack (kvlab.toy.v41: registered with AutoConfig / AutoModelForCausalLM
         under model_type "kvlab_v41")

Each is built at one of the named size presets of kvlab.toy.sizes: "tiny" trains in 31 min (dense), 44 min (MLA)
and 75 min (V4.1-like) on one CPU thread, "small" and "base" are for a GPU. Every preset keeps the architectures close in
parameters, so bytes per token is what mostly differs.
"""
from __future__ import annotations

import torch

from ..checks import need_choice, need_int
from ..toy.data import VOCAB
from ..toy.sizes import Size, get_size

ARCHS = ("dense", "mla", "v41")
NAMES = {"dense": "qwen3", "mla": "deepseek-v3", "v41": "kvlab-v41"}  # checkpoint name stems: <stem>-<size>


def dense_config(size: str | Size = "tiny", vocab: int = VOCAB):
    from transformers import Qwen3Config
    s = get_size(size)
    return Qwen3Config(vocab_size=vocab, hidden_size=s.hidden, intermediate_size=s.intermediate,
                       num_hidden_layers=s.layers, num_attention_heads=s.heads, num_key_value_heads=s.kv_heads,
                       head_dim=s.head_dim, max_position_embeddings=s.max_positions, tie_word_embeddings=True,
                       rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, bos_token_id=None,
                       eos_token_id=None, pad_token_id=None)


def mla_config(size: str | Size = "tiny", vocab: int = VOCAB):
    from transformers import DeepseekV3Config
    s = get_size(size)
    return DeepseekV3Config(vocab_size=vocab, hidden_size=s.hidden, intermediate_size=s.intermediate,
                            num_hidden_layers=s.layers, num_attention_heads=s.heads, num_key_value_heads=s.heads,
                            kv_lora_rank=s.kv_lora_rank, q_lora_rank=None, qk_rope_head_dim=s.rope_dim,
                            qk_nope_head_dim=s.head_dim, v_head_dim=s.head_dim, first_k_dense_replace=s.layers,
                            n_routed_experts=1, n_group=1, topk_group=1, num_experts_per_tok=1, n_shared_experts=1,
                            moe_intermediate_size=s.intermediate, num_mtp_layers=0,
                            max_position_embeddings=s.max_positions, tie_word_embeddings=True,
                            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                            bos_token_id=None, eos_token_id=None, pad_token_id=None)


def make_config(arch: str, size: str | Size = "tiny", vocab: int = VOCAB):
    """The transformers config of an architecture at a size preset."""
    need_choice("arch", arch, ARCHS)
    need_int("vocab", vocab, 1)
    if arch == "dense":
        return dense_config(size, vocab)
    if arch == "mla":
        return mla_config(size, vocab)
    from ..toy.v41 import v41_config
    return v41_config(size, vocab)


def build_model(arch: str, size: str | Size = "tiny", seed: int = 0, vocab: int = VOCAB):
    """A freshly initialised model (float32, seeded: the same seed gives the same weights)."""
    from transformers import AutoModelForCausalLM
    cfg = make_config(arch, size, vocab)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa" if arch != "v41" else None,
                                             dtype=torch.float32)
    return model


def count_parameters(model) -> int:
    """Distinct parameters (tied embeddings counted once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
