"""A tiny Llama written as a GGUF file with the `gguf` package's writer, so the GGUF -> model folder conversion
(kvlab.hf.convert) is tested in seconds, on a file whose every weight is known.

The tensors are float32 (GGUF type F32), so conversion must give back the very same model: its logits equal the
source model's bit for bit. The query and key projections are stored as llama.cpp stores them, rows permuted for
its RoPE layout (llama.cpp convert_hf_to_gguf.py, LlamaModel.permute: per head, the two halves of each rotary pair
interleaved); transformers undoes that when it reads a llama GGUF
(modeling_gguf_pytorch_utils.py, LlamaTensorProcessor._reverse_permute_weights).
"""
from __future__ import annotations

from pathlib import Path

import torch

V_BYTES = 256  # GPT-2's byte-level alphabet: one token per byte


def byte_alphabet() -> list[str]:
    """GPT-2's printable stand-in for each byte (the byte-level BPE alphabet), in byte order."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    chars, n = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + n)
            n += 1
    return [chars[b] for b in range(256)]


def permute(w: torch.Tensor, heads: int) -> torch.Tensor:
    """llama.cpp's row order for a rotary projection [heads * D, hidden]: per head, (D/2, 2) read as (2, D/2)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def tiny_llama(seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM
    merges = ["h e", "l l", "Ġ t"]
    cfg = LlamaConfig(vocab_size=V_BYTES + len(merges) + 1, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
                      rope_theta=10_000.0, rms_norm_eps=1e-5, tie_word_embeddings=True, bos_token_id=V_BYTES + 3,
                      eos_token_id=V_BYTES + 3)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "norm" in n:  # norms away from 1, so a norm read from the wrong tensor shows
                p.uniform_(0.5, 1.5)
    return model, merges


def write_tiny_gguf(path: Path, seed: int = 0):
    """Write a tiny random Llama to `path` as a GGUF file; returns the transformers model it holds."""
    import gguf
    model, merges = tiny_llama(seed)
    c = model.config
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("kvlab tiny llama")
    w.add_block_count(c.num_hidden_layers)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_rope_dimension_count(c.head_dim)
    w.add_rope_freq_base(c.rope_parameters["rope_theta"])
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_vocab_size(c.vocab_size)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    tokens = byte_alphabet() + [m.replace(" ", "") for m in merges] + ["<|endoftext|>"]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([gguf.TokenType.NORMAL] * (len(tokens) - 1) + [gguf.TokenType.CONTROL])
    w.add_token_merges(merges)
    w.add_bos_token_id(c.bos_token_id)
    w.add_eos_token_id(c.eos_token_id)
    sd = {k: v.detach().float() for k, v in model.state_dict().items()}
    names = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
             "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
             "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}
    w.add_tensor("token_embd.weight", sd["model.embed_tokens.weight"].numpy())
    for i in range(c.num_hidden_layers):
        for hf, gg in names.items():
            t = sd[f"model.layers.{i}.{hf}.weight"]
            if gg == "attn_q":
                t = permute(t, c.num_attention_heads)
            elif gg == "attn_k":
                t = permute(t, c.num_key_value_heads)
            w.add_tensor(f"blk.{i}.{gg}.weight", t.contiguous().numpy())
    w.add_tensor("output_norm.weight", sd["model.norm.weight"].numpy())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return model
