"""Bad input gets one clear error, never a traceback, a silent wrong answer or a changed user file (issue 9).

One parametrized test per class of bad input; the cases are data. Each API case names the exception class and
words the message must hold (the argument, its value, what is allowed); each CLI case must exit 2 with exactly
one line `kvlab: error: ...` on stderr. kvlab/sim (traces, tiering, `kvlab simulate`) and notebook parameters
are checked in their own test files.
"""
from __future__ import annotations

import copy
import json
import math
import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import nbformat
import numpy as np
import pytest
import torch

from kvlab.nb import compare
from kvlab.cli import main
from kvlab.engines import Engine, allocate, paged
from kvlab.errors import (ConfigError, KvlabError, NoEngineLayout, ParameterError, ShapeError, UnknownFormatError,
                          WrongTypeError)
from kvlab.formats import FORMATS, dtype_format, get_format
from kvlab.layout import build_layout
from kvlab.models import read_config, spec_from_config
from kvlab.nb import runner
from kvlab.nb.record import read_results
from kvlab.quant import QuantizeError, kivi_quantize, quantize
from kvlab.quant.ranges import max_input
from kvlab.layout import Shard
from kvlab import hardware
from kvlab.serving import capacity
from kvlab.serving.budget import kv_budget
from kvlab.serving.parallel import Parallelism, per_gpu
from kvlab.serving.vllm_plan import vllm_plan
from nbutil import tiny_notebook

ROOT = Path(__file__).resolve().parents[1]


def _cli(argv, capsys) -> tuple[int, str, str]:
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def _one_line_error(rc: int, err: str, words) -> str:
    """rc 2, exactly one stderr line `kvlab: error: ...` holding every word, no traceback."""
    lines = err.strip().splitlines()
    assert rc == 2, f"exit code {rc}, stderr: {err!r}"
    assert len(lines) == 1, f"expected one line, got: {err!r}"
    assert lines[0].startswith("kvlab: error: ") and "Traceback" not in err
    for w in words:
        assert w in lines[0], f"{w!r} not in {lines[0]!r}"
    return lines[0]


def _raises(fn, exc, words):
    """fn() raises `exc`, a kvlab exception (ValueError / TypeError), whose message holds every word."""
    with pytest.raises(exc) as info:
        fn()
    assert isinstance(info.value, KvlabError), f"{type(info.value).__name__} is not a kvlab exception"
    msg = str(info.value)
    for w in words:
        assert w in msg, f"{w!r} not in {msg!r}"
    return msg


# --- 1. command-line arguments: counts, numbers, choices ----------------------------------------------------
CLI_ARGS = [
    ("count with a misplaced comma", ["bytes", "qwen3-8b", "--tokens", "1,5"], ["--tokens", "'1,5'", "1,000,000"]),
    ("count starting with a comma", ["bytes", "qwen3-8b", "--tokens", ",1"], ["--tokens", "',1'"]),
    ("count with doubled underscores", ["bytes", "qwen3-8b", "--tokens", "1__0"], ["'1__0'"]),
    ("count grouped by two", ["bytes", "qwen3-8b", "--tokens", "1,00,000"], ["'1,00,000'"]),
    ("count with mixed separators", ["bytes", "qwen3-8b", "--tokens", "1,000_000"], ["'1,000_000'"]),
    ("count with a trailing separator", ["bytes", "qwen3-8b", "--tokens", "1000,"], ["'1000,'"]),
    ("negative count", ["bytes", "qwen3-8b", "--tokens", "-5"], ["--tokens", "non-negative", "'-5'"]),
    ("fractional count", ["bytes", "qwen3-8b", "--tokens", "1.5"], ["--tokens", "'1.5'"]),
    ("fractional scientific count", ["bytes", "qwen3-8b", "--tokens", "1.5e0"], ["'1.5e0'"]),
    ("count beyond int64", ["bytes", "qwen3-8b", "--tokens", "99999999999999999999999"], ["at most"]),
    ("count 1e400", ["bytes", "qwen3-8b", "--tokens", "1e400"], ["'1e400'"]),
    ("count as a word", ["bytes", "qwen3-8b", "--tokens", "many"], ["'many'"]),
    ("empty count", ["bytes", "qwen3-8b", "--tokens", ""], ["--tokens", "''"]),
    ("measure count", ["measure", "qwen3-8b", "--tokens", "1,5"], ["--tokens", "'1,5'"]),
    ("zero context", ["sessions", "qwen3-8b", "--gpu", "H100", "--context", "0"], ["--context", ">= 1", "'0'"]),
    ("negative context", ["sessions", "qwen3-8b", "--gpu", "H100", "--context", "-1000"], ["--context"]),
    ("zero max-model-len", ["sessions", "qwen3-8b", "--gpu", "H100", "--context", "1000", "--max-model-len", "0"],
     ["--max-model-len", ">= 1"]),
    ("zero weight shards", ["sessions", "qwen3-8b", "--gpu", "H100", "--context", "1000", "--weight-shards", "0"],
     ["--weight-shards", ">= 1"]),
    ("fractional weight shards", ["sessions", "qwen3-8b", "--gpu", "H100", "--context", "1000",
                                  "--weight-shards", "1.5"], ["--weight-shards"]),
    ("hit rate above 1", ["sessions", "qwen3-8b", "--gpu", "H100", "--context", "1000", "--prefix-hit-rate", "1.5"],
     ["--prefix-hit-rate", "[0, 1]"]),
    ("negative hit rate", ["sessions", "qwen3-8b", "--gpu", "H100", "--context", "1000", "--prefix-hit-rate",
                           "-0.1"], ["--prefix-hit-rate"]),
    ("NaN hit rate", ["sessions", "qwen3-8b", "--gpu", "H100", "--context", "1000", "--prefix-hit-rate", "nan"],
     ["--prefix-hit-rate", "finite"]),
    ("NaN replay probability", ["sessions", "deepseek-v4.1-flash", "--gpu", "H100", "--context", "1000",
                                "--replay-probability", "nan"], ["--replay-probability", "finite"]),
    ("replay probability 2", ["sessions", "deepseek-v4.1-flash", "--gpu", "H100", "--context", "1000",
                              "--replay-probability", "2"], ["--replay-probability"]),
    ("zero utilization", ["sessions", "qwen3-8b", "--gpu", "H100", "--context", "1000", "--utilization", "0"],
     ["--utilization", "(0, 1]"]),
    ("utilization 1.5", ["sessions", "qwen3-8b", "--gpu", "H100", "--context", "1000", "--utilization", "1.5"],
     ["--utilization"]),
    ("NaN utilization", ["sessions", "qwen3-8b", "--gpu", "H100", "--context", "1000", "--utilization", "nan"],
     ["--utilization"]),
    ("negative weights", ["sessions", "qwen3-8b", "--gpu", "H100", "--context", "1000", "--weight-gb", "-1"],
     ["--weight-gb"]),
    ("weights as a word", ["sessions", "qwen3-8b", "--gpu", "H100", "--context", "1000", "--weight-gb", "lots"],
     ["--weight-gb", "a number", "'lots'"]),
    ("NaN activations", ["sessions", "qwen3-8b", "--gpu", "H100", "--context", "1000", "--activation-gb", "nan"],
     ["--activation-gb"]),
    ("unknown GPU", ["sessions", "qwen3-8b", "--gpu", "H9000", "--context", "1000"], ["'H9000'", "H100"]),
    ("unknown layout", ["bytes", "qwen3-8b", "--layout", "paged"], ["'paged'", "storage"]),
    ("unknown format", ["bytes", "qwen3-8b", "--kv-format", "nvfp5"], ["'nvfp5'", "nvfp4"]),
    ("block size 0", ["bytes", "qwen3-8b", "--kv-format", "int4_g0"], ["'int4_g0'", ">= 1"]),
    ("scale-only format", ["bytes", "qwen3-8b", "--kv-format", "e8m0"], ["'e8m0'"]),
    ("no vLLM layout for V4.1", ["bytes", "deepseek-v4.1-flash", "--layout", "vllm"], ["'vllm'", "storage"]),
    ("unknown model", ["bytes", "gpt-7"], ["'gpt-7'", "qwen3-8b"]),
    ("empty model name", ["bytes", ""], ["empty"]),
    ("model name too long", ["bytes", "a" * 5000], ["not a usable path"]),
    ("model name with a NUL", ["bytes", "a\0b"], ["unknown model"]),
    ("model folder without config", ["bytes", str(ROOT / "kvlab")], ["holds no config.json"]),
    ("model file not JSON", ["bytes", str(ROOT / "README.md")], ["not a readable JSON config"]),
    ("model file binary", ["bytes", sys.executable], ["not a readable JSON config"]),
    ("no weights known", ["sessions", "gemma-3-27b", "--gpu", "H100", "--context", "1000"],
     ["no weight estimate", "--weight-gb"]),
    ("weights fill the GPU", ["sessions", "qwen3-8b", "--gpu", "L40S", "--context", "1000", "--weight-gb", "500",
                              "--weight-shards", "1"], ["no memory left for KV", "weight_shards"]),
    ("unknown notebook", ["run", "99_nothing"], ["'99_nothing'", "01_kv_bytes_per_token"]),
    ("ambiguous notebook", ["run", "0"], ["no single notebook matches '0'"]),
    ("undeclared parameter", ["run", "01", "-p", "no_such_parameter", "3"], ["'no_such_parameter'", "not declared"]),
    ("a notebook selected twice", ["run", "01", "01_kv_bytes_per_token"], ["selected twice"]),
    ("no command", [], ["command"]),
    ("unknown command", ["bites"], ["'bites'"]),
    ("missing model", ["bytes"], ["model"]),
    ("unknown option", ["models", "--fast"], ["--fast"]),
    ("TP 0", ["bytes", "qwen3-8b", "--tp", "0"], ["--tp", ">= 1", "'0'"]),
    ("DCP as a word", ["bytes", "deepseek-v3", "--tp", "8", "--dcp", "all"], ["--dcp", "'all'"]),
    ("DCP not dividing TP", ["bytes", "deepseek-v3", "--tp", "8", "--dcp", "3"], ["DCP 3 must divide TP 8"]),
    ("DCP beyond TP / KV heads", ["bytes", "qwen3-8b", "--tp", "8", "--dcp", "2"],
     ["DCP 2 exceeds TP / KV heads = 8 / 8 = 1"]),
    ("heads not split by TP", ["bytes", "qwen3-8b", "--tp", "3"], ["32 attention heads", "TP 3"]),
    ("more stages than layers", ["bytes", "qwen3-8b", "--pp", "37"], ["PP 37", "36 layers"]),
    ("DP attention with DCP", ["sessions", "deepseek-v3", "--gpu", "H200", "--context", "1000", "--tp", "8", "--dcp",
                               "8", "--dp-attention"], ["data-parallel attention", "DCP 8"]),
    ("unknown engine", ["bytes", "qwen3-8b", "--engine", "tgi"], ["--engine", "'tgi'", "sglang"]),
    ("a KV dtype the engine lacks", ["bytes", "qwen3-8b", "--engine", "sglang", "--kv-format", "nvfp4"],
     ["sglang does not store KV as nvfp4", "fp4_e2m1"]),
    ("no SGLang layout for V4", ["bytes", "deepseek-v4-flash", "--engine", "sglang"], ["no published sglang layout"]),
    ("page size 0", ["bytes", "qwen3-8b", "--engine", "sglang", "--page-size", "0"], ["--page-size", ">= 1"]),
    ("kv and k formats both", ["bytes", "qwen3-8b", "--kv-format", "fp8", "--k-format", "nvfp4"], ["not both"]),
    ("unknown key format", ["bytes", "qwen3-8b", "--k-format", "fp9"], ["'fp9'", "nvfp4"]),
    ("K / V formats on V4", ["bytes", "deepseek-v4-flash", "--k-format", "fp8_e4m3", "--v-format", "nvfp4"],
     ["one kv_format"]),
    ("memory fraction 0", ["sessions", "qwen3-8b", "--gpu", "H100", "--context", "1000", "--memory-fraction", "0"],
     ["--memory-fraction", "(0, 1]"]),
    ("Hub-style id with a path in it", ["bytes", "org/name/config.json"], ["unknown model", "Hub id"]),
    ("infinite HBM budget", ["simulate", "--model", "qwen3-8b", "--hbm-gb", "inf"], ["--hbm-gb", "finite"]),
    ("HBM budget 1e300", ["simulate", "--model", "qwen3-8b", "--hbm-gb", "1e300"], ["--hbm-gb"]),
]


@pytest.mark.parametrize("desc,argv,words", CLI_ARGS, ids=[c[0] for c in CLI_ARGS])
def test_cli_arguments(desc, argv, words, capsys):
    _one_line_error(*_cli(argv, capsys)[::2], words)


@pytest.mark.parametrize("text,value", [("1000000", 1_000_000), ("1,000,000", 1_000_000), ("1_000_000", 1_000_000),
                                        ("1e6", 1_000_000), ("0", 0), ("999", 999), ("12,345", 12_345)])
def test_counts_people_write_are_read(text, value):
    from kvlab.cli.args import count
    assert count("--tokens")(text) == value


@pytest.mark.parametrize("text,value", [("1,000,000", 1_000_000), ("1_000", 1000), ("[1, 2]", [1, 2]),
                                        ("nvfp4", "nvfp4"), ("1,5", (1, 5))])
def test_run_parameters_read_counts_as_people_write_them(text, value):
    """-p context_tokens 1,000,000 is a count, not the tuple (1, 0, 0); other text is a literal or a string."""
    from kvlab.cli.run import _param_value
    assert _param_value(text) == value


def test_run_api_refuses_a_single_name_and_a_non_dict():
    _raises(lambda: runner.run_notebooks("01", {}), WrongTypeError, ["names", "str"])
    _raises(lambda: runner.run_notebooks(["01"], [("x", 1)]), WrongTypeError, ["parameters", "list"])


# --- 2. configs that describe no real model --------------------------------------------------------------------
DELETE = object()


def _edited(base: str, **changes) -> dict:
    """A catalog config with fields changed (in text_config when it has one); DELETE removes a field."""
    _, cfg = read_config(base)
    cfg = copy.deepcopy(cfg)
    target = cfg["text_config"] if isinstance(cfg.get("text_config"), dict) else cfg
    for k, v in changes.items():
        if v is DELETE:
            target.pop(k, None)
        else:
            target[k] = v
    return cfg


V4_LAYERS = 43
CONFIGS = [
    ("head_dim 0", _edited("qwen3-8b", head_dim=0), ["'head_dim'", ">= 1", "got 0"]),
    ("negative head_dim", _edited("qwen3-8b", head_dim=-1), ["'head_dim'", "-1"]),
    ("head_dim as text", _edited("qwen3-8b", head_dim="128"), ["'head_dim'", "'128'"]),
    ("fractional head_dim", _edited("qwen3-8b", head_dim=1.5), ["'head_dim'", "1.5"]),
    ("huge head_dim", _edited("qwen3-8b", head_dim=10**30), ["'head_dim'", "<= 2,147,483,647"]),
    ("more KV heads than query heads", _edited("qwen3-8b", num_key_value_heads=64),
     ["'num_attention_heads' (32)", "'num_key_value_heads' (64)", "multiple"]),
    ("query heads not a multiple of KV heads", _edited("qwen3-8b", num_key_value_heads=5),
     ["(32)", "(5)", "multiple"]),
    ("zero KV heads", _edited("qwen3-8b", num_key_value_heads=0), ["'num_key_value_heads'", ">= 1"]),
    ("zero query heads", _edited("qwen3-8b", num_attention_heads=0), ["'num_attention_heads'", ">= 1"]),
    ("hidden_size not divisible by the heads", _edited("qwen3-8b", head_dim=DELETE, hidden_size=4097),
     ["'hidden_size' (4097)", "not divisible", "(32)", "head_dim"]),
    ("hidden_size as text", _edited("qwen3-8b", hidden_size="4096"), ["'hidden_size'", "'4096'"]),
    ("hidden_size 0", _edited("qwen3-8b", head_dim=DELETE, hidden_size=0), ["'hidden_size'", ">= 1"]),
    ("neither head_dim nor hidden_size", _edited("qwen3-8b", head_dim=DELETE, hidden_size=DELETE), ["'head_dim'"]),
    ("1e30 layers", _edited("qwen3-8b", num_hidden_layers=1e30), ["'num_hidden_layers'", "1e+30"]),
    ("10**30 layers", _edited("qwen3-8b", num_hidden_layers=10**30), ["'num_hidden_layers'", "<= 100,000"]),
    ("zero layers", _edited("qwen3-8b", num_hidden_layers=0), ["'num_hidden_layers'", ">= 1"]),
    ("layers as a boolean", _edited("qwen3-8b", num_hidden_layers=True), ["'num_hidden_layers'", "True"]),
    ("layers as text", _edited("qwen3-8b", num_hidden_layers="36"), ["'num_hidden_layers'", "'36'"]),
    ("no layer count", _edited("qwen3-8b", num_hidden_layers=DELETE), ["missing 'num_hidden_layers'"]),
    ("integer torch_dtype", _edited("qwen3-8b", torch_dtype="int8"), ["torch_dtype", "'int8'", "bfloat16"]),
    ("FP8 torch_dtype", _edited("qwen3-8b", torch_dtype="float8_e4m3fn"), ["torch_dtype", "'float8_e4m3fn'",
                                                                           "kv_format"]),
    ("a format name as torch_dtype", _edited("qwen3-8b", torch_dtype="nvfp4"), ["torch_dtype", "'nvfp4'"]),
    ("complex torch_dtype", _edited("qwen3-8b", torch_dtype="complex64"), ["torch_dtype", "'complex64'"]),
    ("numeric torch_dtype", _edited("qwen3-8b", torch_dtype=3), ["'torch_dtype'", "3"]),
    ("window pattern as text", _edited("gemma-3-27b", sliding_window_pattern="6"),
     ["'sliding_window_pattern'", "'6'"]),
    ("window pattern 0", _edited("gemma-3-27b", sliding_window_pattern=-1), ["'sliding_window_pattern'", ">= 1"]),
    ("fractional window pattern", _edited("gemma-3-27b", sliding_window_pattern=1.5), ["'sliding_window_pattern'"]),
    ("window 0", _edited("gemma-3-27b", sliding_window=0), ["'sliding_window'", ">= 2"]),
    ("window 1", _edited("gemma-3-27b", sliding_window=1), ["'sliding_window'", ">= 2", "got 1"]),
    ("window as text", _edited("gemma-3-27b", sliding_window="1024"), ["'sliding_window'", "'1024'"]),
    ("unknown layer type", _edited("gpt-oss-20b", layer_types=["sliding_attention", "chunked_attention"] * 12),
     ["'layer_types'", "layer 1", "'chunked_attention'", "full_attention"]),
    ("layer types as text", _edited("gpt-oss-20b", layer_types="sliding_attention"), ["'layer_types'", "(24)"]),
    ("too few layer types", _edited("gpt-oss-20b", layer_types=["full_attention"]), ["'layer_types'", "(24)"]),
    ("sliding layers without a window", _edited("gpt-oss-20b", sliding_window=DELETE), ["'sliding_window'"]),
    ("V4 RoPE part wider than the entry", _edited("deepseek-v4-flash", qk_rope_head_dim=577),
     ["'qk_rope_head_dim' (577)", "'head_dim' (512)", "NoPE"]),
    ("V4 RoPE part as wide as the entry", _edited("deepseek-v4-flash", qk_rope_head_dim=512),
     ["'qk_rope_head_dim' (512)"]),
    ("V4 with two KV heads", _edited("deepseek-v4-flash", num_key_value_heads=2),
     ["'num_key_value_heads' is 2", "one shared K=V head"]),
    ("V4 negative ratios", _edited("deepseek-v4-flash", compress_ratios=[-1] * V4_LAYERS), ["'compress_ratios'"]),
    ("V4 huge ratio", _edited("deepseek-v4-flash", compress_ratios=[10**30] * V4_LAYERS), ["'compress_ratios'"]),
    ("V4 ratios as text", _edited("deepseek-v4-flash", compress_ratios="4"), ["'compress_ratios'", "4"]),
    ("V4 too few ratios", _edited("deepseek-v4-flash", compress_ratios=[4, 4, 4]),
     ["'compress_ratios' has 3 entries for 43 layers"]),
    ("V4 without a window", _edited("deepseek-v4-flash", sliding_window=DELETE), ["'sliding_window'"]),
    ("V4.1 KV source beyond the last layer", _edited("deepseek-v4.1-flash", kv_source_layer_ids=[2, 99]),
     ["'kv_source_layer_ids'", "layer 99", "40 layers"]),
    ("V4.1 index source beyond the last layer", _edited("deepseek-v4.1-flash", index_source_layer_ids=[2, 40]),
     ["'index_source_layer_ids'", "layer 40", "40 layers"]),
    ("V4.1 KV source on a window-only layer", _edited("deepseek-v4.1-flash", kv_source_layer_ids=[0, 2]),
     ["'kv_source_layer_ids'", "layer 0", "ratio is 0"]),
    ("V4.1 compressing layer before any source", _edited("deepseek-v4.1-flash", kv_source_layer_ids=[5]),
     ["layer 2", "before the first", "(5)"]),
    ("MLA latent rank 0", _edited("deepseek-v3", kv_lora_rank=0), ["'kv_lora_rank'", ">= 1"]),
    ("MLA latent rank as text", _edited("deepseek-v3", kv_lora_rank="512"), ["'kv_lora_rank'", "'512'"]),
    ("MLA without a RoPE key", _edited("deepseek-v3", qk_rope_head_dim=DELETE), ["'qk_rope_head_dim'"]),
    ("text_config not an object", _edited("qwen3-8b", text_config="qwen"), ["'text_config'", "str"]),
    ("no architecture fields", {"model_type": "mystery", "num_hidden_layers": 4}, ["unknown architecture",
                                                                                  "'mystery'"]),
    ("hybrid pattern with an unknown layer", {"model_type": "nemotron_h", "hybrid_override_pattern": "MX*",
                                              "num_attention_heads": 4, "head_dim": 16}, ["'hybrid_override_pattern'",
                                                                                          "M, *, -, E"]),
    ("Jamba attention offset past its period", {"model_type": "jamba", "num_hidden_layers": 4, "attn_layer_period": 2,
                                                "attn_layer_offset": 2, "num_attention_heads": 4, "hidden_size": 64},
     ["'attn_layer_offset' (2)", "'attn_layer_period' (2)"]),
    ("Qwen3-Next without its linear heads", {"model_type": "qwen3_next", "num_hidden_layers": 4,
                                             "num_attention_heads": 4, "head_dim": 16}, ["'linear_num_key_heads'"]),
    ("MiniMax without a layer pattern", {"model_type": "minimax", "num_hidden_layers": 2, "num_attention_heads": 4,
                                         "head_dim": 16}, ["'attn_type_list'"]),
    ("Kimi Linear layer out of range", {"model_type": "kimi_linear", "num_hidden_layers": 2, "num_attention_heads": 4,
                                        "head_dim": 16, "kv_lora_rank": 8, "qk_rope_head_dim": 8,
                                        "linear_attn_config": {"full_attn_layers": [2], "kda_layers": [3]}},
     ["linear_attn_config names layer 3", "1-2"]),
    ("hybrid layer_types with an unknown kind", {"model_type": "lfm2", "num_hidden_layers": 2, "num_attention_heads": 4,
                                                 "hidden_size": 64, "layer_types": ["conv", "ssm"]},
     ["'layer_types'", "layer 1", "'ssm'"]),
]


@pytest.mark.parametrize("desc,cfg,words", CONFIGS, ids=[c[0] for c in CONFIGS])
def test_configs_that_describe_no_real_model(desc, cfg, words, tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    _raises(lambda: build_layout(str(path)).bytes_per_token, ConfigError, words)
    _one_line_error(*_cli(["bytes", path], capsys)[::2], words)


RAW_CONFIGS = [
    ("a JSON list", "[]", ConfigError, ["JSON object"]),
    ("not JSON", "{not json", ConfigError, ["not a readable JSON config"]),
    ("binary garbage", b"\xff\xfe\x00garbage", ConfigError, ["not a readable JSON config"]),
    ("an integer of 5000 digits", '{"num_hidden_layers": ' + "1" * 5000 + "}", ConfigError,
     ["not a readable JSON config"]),
    ("nested 100000 deep", "[" * 100_000 + "]" * 100_000, ConfigError, ["not a readable JSON config"]),
]


@pytest.mark.parametrize("desc,text,exc,words", RAW_CONFIGS, ids=[c[0] for c in RAW_CONFIGS])
def test_config_files_that_are_not_configs(desc, text, exc, words, tmp_path, capsys):
    path = tmp_path / "config.json"
    (path.write_bytes if isinstance(text, bytes) else path.write_text)(text)
    _raises(lambda: build_layout(str(path)), exc, words)
    _one_line_error(*_cli(["bytes", path], capsys)[::2], words)


def test_config_checks_keep_every_catalog_model():
    """The checks refuse no published model: every catalog entry still lays out (147,456 and 890 unchanged)."""
    from kvlab.models import catalog
    for m in catalog():
        assert build_layout(m).bytes_per_token > 0
    assert build_layout("qwen3-8b").bytes_per_token == 147_456
    assert build_layout("deepseek-v4.1-flash").bytes_per_token == 890


# --- 3. degenerate plans reported as answers ------------------------------------------------------------------
def _plan(**kw):
    args = dict(model="qwen3-8b", gpu="H100", context_tokens=1000)
    args.update(kw)
    return lambda: capacity.plan(args.pop("model"), args.pop("gpu"), args.pop("context_tokens"), **args)


DEGENERATE = [
    ("0-token session", _plan(context_tokens=0), ParameterError, ["context_tokens", ">= 1", "got 0"]),
    ("every token a prefix hit", _plan(prefix_hit_rate=1.0), ParameterError,
     ["prefix_hit_rate 1.0", "0 bytes of its own", "below 1"]),
    ("NaN prefix hit rate", _plan(prefix_hit_rate=math.nan), ParameterError, ["prefix_hit_rate", "nan"]),
    ("prefix hit rate above 1", _plan(prefix_hit_rate=1.5), ParameterError, ["prefix_hit_rate", "[0, 1]"]),
    ("NaN replay probability", _plan(model="deepseek-v4.1-flash", replay_probability=math.nan), ParameterError,
     ["replay_probability", "nan"]),
    ("zero utilization", _plan(utilization=0.0), ParameterError, ["utilization", "(0, 1]"]),
    ("NaN utilization", _plan(utilization=math.nan), ParameterError, ["utilization", "nan"]),
    ("negative activations", _plan(activation_gb=-1), ParameterError, ["activation_gb", "-1"]),
    ("infinite activations", _plan(activation_gb=math.inf), ParameterError, ["activation_gb", "inf"]),
    ("negative weights", _plan(weights=-1), ParameterError, ["weights", ">= 0", "-1"]),
    ("weights as text", _plan(weights="16e9"), WrongTypeError, ["weights", "'16e9'"]),
    ("zero weight shards", _plan(weight_shards=0), ParameterError, ["weight_shards", ">= 1"]),
    ("negative request rate", lambda: capacity.request_rate(-1.0, 100, 10, 20), ParameterError,
     ["decode_tokens_per_s", "-1.0"]),
    ("NaN request rate", lambda: capacity.request_rate(math.nan, 100, 10, 20), ParameterError,
     ["decode_tokens_per_s", "nan"]),
    ("infinite request rate", lambda: capacity.request_rate(math.inf, 100, 10, 20), ParameterError,
     ["decode_tokens_per_s", "inf"]),
    ("zero tokens per request", lambda: capacity.request_rate(1000, 0, 10, 20), ParameterError,
     ["tokens_per_request"]),
    ("negative sessions", lambda: capacity.request_rate(1000, 100, -1, 20), ParameterError, ["sessions", ">= 0"]),
    ("sessions as text", lambda: capacity.request_rate(1000, 100, "ten", 20), WrongTypeError, ["sessions", "'ten'"]),
    ("vLLM plan of length 0", lambda: vllm_plan("qwen3-8b", 10**9, 0), ParameterError,
     ["max_model_len", ">= 1"]),
    ("vLLM plan of negative memory", lambda: vllm_plan("qwen3-8b", -1, 1000), ParameterError,
     ["kv_cache_memory_bytes", ">= 1"]),
    ("vLLM plan above the model's length", lambda: vllm_plan("qwen3-8b", 10**10, 40_961), ParameterError,
     ["max_model_len 40,961 exceeds the model's 40,960 tokens"]),
    ("vLLM plan under one block", lambda: vllm_plan("qwen3-8b", 10**6, 1000), ParameterError,
     ["vLLM refuses 1,000,000 B", "not even one block of every group fits"]),
    ("vLLM plan window above max_model_len", lambda: vllm_plan("gpt-oss-20b", 10**10, 100), ParameterError,
     ["sliding window (128 tokens) is larger than max_model_len 100"]),
    ("vLLM plan with DCP over a window", lambda: vllm_plan("gpt-oss-20b", 10**10, 1000, tp=16, dcp=2),
     ParameterError, ["DCP 2", "sliding window"]),
    ("vLLM plan of a V4 cache", lambda: vllm_plan("deepseek-v4-flash", 10**10, 1000), NoEngineLayout,
     ["not checked against it"]),
    ("vLLM batches in flight 0", lambda: vllm_plan("qwen3-8b", 10**10, 1000, batches_in_flight=0), ParameterError,
     ["batches_in_flight", ">= 1"]),
    ("vLLM prefix caching as text", lambda: vllm_plan("qwen3-8b", 10**10, 1000, prefix_caching="no"),
     WrongTypeError, ["prefix_caching"]),
    ("session of -1 tokens", lambda: build_layout("qwen3-8b").session(-1), ParameterError, ["tokens", "-1"]),
    ("TP 0", lambda: Parallelism(tp=0), ParameterError, ["tp", ">= 1", "0"]),
    ("DP attention as text", lambda: Parallelism(tp=8, dp_attention="yes"), WrongTypeError, ["dp_attention", "'yes'"]),
    ("a deployment as a number", lambda: per_gpu("qwen3-8b", 8), WrongTypeError, ["parallel", "Parallelism"]),
    ("a stage beyond the pipeline", lambda: Shard(pp=2, stage=2), ParameterError, ["stage", "<= 1"]),
    ("a shard as text", lambda: build_layout("qwen3-8b", shard="TP 8"), ParameterError, ["shard", "Shard"]),
    ("unknown engine for a plan", _plan(engine="tgi"), ParameterError, ["engine", "'tgi'", "sglang"]),
    ("memory fraction above 1", lambda: kv_budget("sglang", hardware.get_gpu("H200"), 0, 0, fraction=1.5),
     ParameterError, ["memory fraction", "(0, 1]"]),
    ("a plan of an allocation with TP", lambda: capacity.plan(allocate("qwen3-8b"), "H200", 1000,
                                                              parallel=Parallelism(tp=2)),
     ParameterError, ["model name or spec", "Allocation"]),
    ("session of NaN tokens", lambda: build_layout("qwen3-8b").session(math.nan), ParameterError, ["tokens", "nan"]),
    ("session of 1.5 tokens", lambda: build_layout("qwen3-8b").session(1.5), ParameterError, ["tokens", "1.5"]),
    ("session cost at a NaN hit rate", lambda: capacity.session_cost("qwen3-8b", 1000, math.nan), ParameterError,
     ["prefix_hit_rate"]),
]


@pytest.mark.parametrize("desc,fn,exc,words", DEGENERATE, ids=[c[0] for c in DEGENERATE])
def test_degenerate_plans_refused(desc, fn, exc, words):
    _raises(fn, exc, words)


def test_cli_plans_refuse_degenerate_sessions(capsys):
    argv = ["sessions", "qwen3-8b", "--gpu", "H100", "--context", "1000", "--prefix-hit-rate", "1"]
    _one_line_error(*_cli(argv, capsys)[::2], ["0 bytes of its own"])


def test_cli_max_model_len_is_not_replaced(capsys):
    """An explicit --max-model-len is used as given; without it, --context."""
    base = ["sessions", "qwen3-8b", "--gpu", "H100", "--context", "1000", "--json"]
    assert main(base + ["--max-model-len", "16"]) == 0
    assert json.loads(capsys.readouterr().out)["vllm"]["max_model_len"] == 16
    assert main(base) == 0
    assert json.loads(capsys.readouterr().out)["vllm"]["max_model_len"] == 1000


def test_cli_says_why_no_session_fits(capsys):
    assert main(["sessions", "qwen3-8b", "--gpu", "L40S", "--context", "10,000,000"]) == 0
    out = capsys.readouterr().out
    assert "sessions per GPU, held while decoding: 0" in out and "more than the" in out and "usable" in out


# --- 4. numbers too large for their type -------------------------------------------------------------------
def _catalog_file(tmp_path: Path, gpus) -> Path:
    p = tmp_path / "hw.json"
    p.write_text(gpus if isinstance(gpus, str) else json.dumps({"gpus": gpus}))
    return p


GPU_FIELDS = dict(hbm_gb=80, hbm_tb_s=3.35, host_link_gb_s=64, host_dram_gb=256, ssd_gb_s=7)
OVERFLOW = [
    ("HBM of 1e300 GB", lambda tmp: hardware.get_gpu("H100", hbm_gb=1e300).hbm_bytes, ["hbm_gb", "1e+300"]),
    ("infinite HBM", lambda tmp: hardware.get_gpu("H100", hbm_gb=math.inf), ["hbm_gb", "inf"]),
    ("NaN host link", lambda tmp: hardware.get_gpu("H100", host_link_gb_s=math.nan), ["host_link_gb_s", "nan"]),
    ("host DRAM of 1e20 GB", lambda tmp: hardware.get_gpu("H100", host_dram_gb=1e20), ["host_dram_gb"]),
    ("HBM as text", lambda tmp: hardware.get_gpu("H100", hbm_gb="80"), ["hbm_gb", "'80'"]),
    ("zero HBM", lambda tmp: hardware.get_gpu("H100", hbm_gb=0), ["hbm_gb", "(0,"]),
    ("catalog with Infinity", lambda tmp: hardware.load_catalog(
        _catalog_file(tmp, '{"gpus": {"X": {"hbm_gb": Infinity, "hbm_tb_s": 1, "host_link_gb_s": 1, '
                           '"host_dram_gb": 1, "ssd_gb_s": 1}}}')), ["hbm_gb", "inf"]),
    ("catalog with 1e400", lambda tmp: hardware.load_catalog(
        _catalog_file(tmp, {"X": {**GPU_FIELDS, "ssd_gb_s": "1e400"}})), ["ssd_gb_s", "'1e400'"]),
    ("weights of 10**30 bytes", lambda tmp: capacity.plan("qwen3-8b", "H100", 1000, weights=10**30),
     ["no memory left for KV"]),
]


@pytest.mark.parametrize("desc,fn,words", OVERFLOW, ids=[c[0] for c in OVERFLOW])
def test_numbers_too_large_for_their_type(desc, fn, words, tmp_path):
    _raises(lambda: fn(tmp_path), ParameterError, words)


@pytest.mark.parametrize("argv", [
    ["sessions", "qwen3-8b", "--gpu", "H100", "--context", "1000", "--weight-gb", "inf"],
    ["sessions", "qwen3-8b", "--gpu", "H100", "--context", "1000", "--weight-gb", "1e300"],
    ["sessions", "qwen3-8b", "--gpu", "H100", "--context", "1000", "--activation-gb", "1e300"],
    ["sessions", "qwen3-8b", "--gpu", "H100", "--context", "1e400"],
    ["bytes", "qwen3-8b", "--tokens", "1" + "0" * 30],
], ids=["weight-gb inf", "weight-gb 1e300", "activation-gb 1e300", "context 1e400", "tokens 1e30"])
def test_cli_numbers_too_large(argv, capsys):
    _one_line_error(*_cli(argv, capsys)[::2], [argv[-2]])


# --- 5. API errors of the right kind -------------------------------------------------------------------------
def _qt(fmt="nvfp4", shape=(4, 64)):
    return quantize(torch.randn(shape, generator=torch.Generator().manual_seed(0)), fmt)


def _replace_qt(**fields):
    import dataclasses
    return lambda: dataclasses.replace(_qt("int4" if fields.pop("_int", False) else "nvfp4"), **fields)


X = torch.randn(4, 64, generator=torch.Generator().manual_seed(1))
WRONG_KIND = [
    ("model as a number", lambda: build_layout(3), WrongTypeError, ["model", "int", "catalog name"]),
    ("model as None", lambda: build_layout(None), WrongTypeError, ["model", "NoneType"]),
    ("model as a list", lambda: build_layout(["qwen3-8b"]), WrongTypeError, ["model", "list"]),
    ("unknown scheme", lambda: build_layout("qwen3-8b", "paged"), ParameterError, ["'paged'", "storage, vllm, bf16"]),
    ("format as a number", lambda: build_layout("qwen3-8b", kv_format=4), UnknownFormatError, ["int", "4"]),
    ("format as None", lambda: get_format(None), UnknownFormatError, ["NoneType"]),
    ("engine as an unknown name", lambda: allocate("qwen3-8b", engine="paged"), ParameterError,
     ["engine", "'paged'", "vllm, sglang, trtllm", "paged(block_tokens)"]),
    ("engine as a number", lambda: allocate("qwen3-8b", engine=16), WrongTypeError, ["engine", "16"]),
    ("engine of 0-token pages", lambda: paged(0), ParameterError, ["block_tokens", ">= 1", "0"]),
    ("engine page alignment 0", lambda: paged(16, 0), ParameterError, ["page_align", ">= 1"]),
    ("engine pages of 1.5 tokens", lambda: paged(1.5), WrongTypeError, ["block_tokens", "1.5"]),
    ("engine built directly with 0-token pages", lambda: Engine("x", 0), ParameterError, ["block_tokens"]),
    ("bytes of -1 elements", lambda: get_format("int4").nbytes(-1), ParameterError, ["n", ">= 0", "-1"]),
    ("bytes of 1.5 elements", lambda: get_format("int4").data_bytes(1.5), WrongTypeError, ["n", "1.5"]),
    ("bits per element over 0", lambda: get_format("int4").bits_per_element(0), ParameterError, ["n", ">= 1"]),
    ("describe -5 elements", lambda: get_format("nvfp4").describe(-5), ParameterError, ["n", "-5"]),
    ("an integer dtype as KV storage", lambda: dtype_format("int8"), UnknownFormatError, ["torch_dtype", "'int8'"]),
    ("config as a list", lambda: spec_from_config([], "x"), ConfigError, ["JSON object", "list"]),
    ("GPU as a number", lambda: hardware.get_gpu(3), ParameterError, ["unknown GPU 3", "H100"]),
    ("unknown GPU field", lambda: hardware.get_gpu("H100", hbm=80), ParameterError, ["'hbm'", "hbm_gb"]),
    ("hardware catalog is a folder", lambda: hardware.load_catalog(ROOT), ParameterError,
     ["not a readable hardware catalog"]),
    ("hardware catalog is binary", lambda: hardware.load_catalog(sys.executable), ParameterError,
     ["not a readable hardware catalog"]),
    ("hardware catalog of a list", lambda: hardware.load_catalog(ROOT / "pyproject.toml"), ParameterError,
     ["hardware catalog"]),
    ("quantize a list", lambda: quantize([[1.0] * 16], "nvfp4"), WrongTypeError, ["x", "torch.Tensor", "list"]),
    ("quantize a numpy array", lambda: quantize(np.ones((1, 16), np.float32), "nvfp4"), WrongTypeError,
     ["x", "ndarray"]),
    ("quantize a complex tensor", lambda: quantize(torch.ones(1, 16, dtype=torch.complex64), "nvfp4"),
     WrongTypeError, ["complex", "imaginary", "x.real"]),
    ("quantize an integer tensor", lambda: quantize(torch.ones(1, 16, dtype=torch.int32), "nvfp4"),
     WrongTypeError, ["torch.int32", "float32"]),
    ("quantize a float64 tensor", lambda: quantize(torch.ones(1, 16, dtype=torch.float64), "int4"),
     WrongTypeError, ["torch.float64", "x.float()"]),
    ("quantize a meta tensor", lambda: quantize(torch.empty(4, 64, device="meta"), "nvfp4"), QuantizeError,
     ["meta", "no values"]),
    ("quantize a meta tensor to bf16", lambda: quantize(torch.empty(4, 64, device="meta"), "bf16"), QuantizeError,
     ["meta"]),
    ("quantize a scalar", lambda: quantize(torch.tensor(1.0), "nvfp4"), QuantizeError, ["0-dim"]),
    ("quantize to no format", lambda: quantize(X, None), UnknownFormatError, ["NoneType"]),
    ("quantize to a scale-only format", lambda: quantize(X, "e8m0"), UnknownFormatError, ["'e8m0'"]),
    ("quantize with an odd block", lambda: quantize(X, "int4_g7"), QuantizeError, ["64", "block of 7", "pad=True"]),
    ("quantize with an unknown recipe", lambda: quantize(X, "nvfp4", recipe="fast"), ParameterError,
     ["'fast'", "torchao"]),
    ("quantize with an unknown axis", lambda: quantize(X, "int4", axis="row"), ParameterError, ["axis", "'row'"]),
    ("quantize with pad as text", lambda: quantize(X, "nvfp4", pad="no"), WrongTypeError, ["pad", "'no'"]),
    ("quantize with a text scale", lambda: quantize(X, "fp8_e4m3", scale="1"), WrongTypeError, ["scale", "'1'"]),
    ("quantize with a NaN scale", lambda: quantize(X, "fp8_e4m3", scale=math.nan), ParameterError, ["scale", "nan"]),
    ("quantize with two scales", lambda: quantize(X, "fp8_e4m3", scale=torch.ones(2)), WrongTypeError,
     ["scale", "(2,)"]),
    ("quantize with a complex global scale", lambda: quantize(X, "nvfp4_2level", global_scale=1j), WrongTypeError,
     ["global_scale", "complex"]),
    ("quantize with a negative global scale", lambda: quantize(X, "nvfp4_2level", global_scale=-1.0),
     ParameterError, ["global_scale", "-1.0"]),
    ("per-tensor scale on a block format", lambda: quantize(X, "nvfp4", scale=1.0), ParameterError,
     ["scale=", "nvfp4"]),
    ("global scale on a single-level format", lambda: quantize(X, "nvfp4", global_scale=1.0), ParameterError,
     ["global_scale=", "nvfp4_2level"]),
    ("unknown scale rule", lambda: quantize(X, "mxfp4", scale_rule="round"), ParameterError, ["'round'", "floor"]),
    ("channel axis on floats", lambda: quantize(X, "nvfp4", axis="channel"), ParameterError, ["axis", "'channel'"]),
    ("dequantize to a dtype name", lambda: _qt().dequantize("bfloat16"), WrongTypeError,
     ["dtype", "'bfloat16'", "torch.bfloat16"]),
    ("dequantize to an integer dtype", lambda: _qt().dequantize(torch.int32), ParameterError,
     ["dtype", "torch.int32", "floating"]),
    ("dequantize to a number", lambda: _qt().dequantize(3), WrongTypeError, ["dtype", "int 3"]),
    ("truncated codes", _replace_qt(codes=torch.zeros(4, 5, dtype=torch.uint8)), ShapeError,
     ["codes holds 20 bytes [4, 5]", "shape [4, 64] in nvfp4 needs 128 [4, 32]"]),
    ("truncated scales", _replace_qt(scales=torch.zeros(4, 1, dtype=torch.uint8)), ShapeError,
     ["scales holds 4 bytes [4, 1]", "needs 16 [4, 4]"]),
    ("float codes", _replace_qt(codes=torch.zeros(4, 32)), WrongTypeError, ["codes", "uint8", "float32"]),
    ("truncated integer codes", _replace_qt(_int=True, codes=torch.zeros(4, 3, dtype=torch.uint8)), ShapeError,
     ["codes", "int4"]),
    ("a global scale on single-level NVFP4", _replace_qt(global_scale=torch.zeros(4, dtype=torch.uint8)),
     ParameterError, ["global_scale", "None"]),
    ("an unknown axis", _replace_qt(axis="rows"), ParameterError, ["axis", "'rows'"]),
    ("a shape that is not a tuple", _replace_qt(shape=64), WrongTypeError, ["shape", "int"]),
    ("a format that does not exist", _replace_qt(fmt="nvfp5"), UnknownFormatError, ["'nvfp5'"]),
    ("formats as one name", lambda: compare.catalog_table("nvfp4"), WrongTypeError, ["formats", "str 'nvfp4'"]),
    ("models as one name", lambda: compare.catalog_table(["nvfp4"], "qwen3-8b"), WrongTypeError, ["models", "str"]),
    ("session lengths as one number", lambda: compare.session_table("qwen3-8b", 1000), WrongTypeError,
     ["lengths", "int 1000"]),
    ("countings of no model", lambda: compare.countings(3), WrongTypeError, ["model", "int"]),
    ("layer summary of a name", lambda: compare.layer_summary("qwen3-8b"), WrongTypeError,
     ["layout", "build_layout"]),
    ("KIVI with 3 bits", lambda: kivi_quantize(torch.randn(64, 8), torch.randn(64, 8), bits=3), ParameterError,
     ["bits", "2, 4, 8", "3"]),
    ("KIVI with groups of 0", lambda: kivi_quantize(torch.randn(64, 8), torch.randn(64, 8), group=0),
     ParameterError, ["group", ">= 1"]),
    ("KIVI with a negative residual", lambda: kivi_quantize(torch.randn(64, 8), torch.randn(64, 8), residual=-1),
     ParameterError, ["residual", "-1"]),
    ("KIVI of lists", lambda: kivi_quantize([[1.0]], [[1.0]]), WrongTypeError, ["k", "list"]),
    ("KIVI of mismatched K and V", lambda: kivi_quantize(torch.randn(64, 8), torch.randn(32, 8)), ParameterError,
     ["(64, 8)", "(32, 8)"]),
]


@pytest.mark.parametrize("desc,fn,exc,words", WRONG_KIND, ids=[c[0] for c in WRONG_KIND])
def test_api_errors_are_kvlab_errors(desc, fn, exc, words):
    _raises(fn, exc, words)


def test_wrong_type_is_a_type_error_too():
    """WrongTypeError is a ParameterError (the CLI's exit 2) and a TypeError (what Python code expects)."""
    with pytest.raises(TypeError):
        quantize([1.0], "nvfp4")
    assert issubclass(WrongTypeError, ParameterError) and issubclass(WrongTypeError, TypeError)


def _quantized(fmt: str, axis: str):
    """A seeded QuantizedTensor of `fmt` (integer keys per channel: 32 tokens of 16 channels, two heads)."""
    x = torch.randn((2, 32, 16) if axis == "channel" else (2, 128), generator=torch.Generator().manual_seed(0))
    return quantize(x, fmt, axis=axis)


def _cut(t):
    return t[..., :-1]


def _grow(t):
    return torch.cat([t, torch.zeros((*t.shape[:-1], 1), dtype=t.dtype, device=t.device)], -1)


def _part_cases():
    """(format, axis, part, edit) for every format the quantizers support: codes and scales truncated and
    extended, the two-level NVFP4 global scale too (an unscaled format's empty scales can only grow)."""
    out = []
    for name, f in FORMATS.items():
        for axis in ("token", "channel") if f.element.kind == "int" else ("token",):
            parts = ["codes", "scales"] + (["global_scale"] if f.tensor_scale else [])
            for part in parts:
                for edit in ("truncated", "extended"):
                    if not (part == "scales" and f.scope == "none" and edit == "truncated"):
                        out.append((name, axis, part, edit))
    return out


PART_CASES = _part_cases()


@pytest.mark.parametrize("when", ["construction", "decode"])
@pytest.mark.parametrize("fmt,axis,part,edit", PART_CASES, ids=["-".join(c) for c in PART_CASES])
def test_quantized_tensor_parts_must_fit_its_shape(fmt, axis, part, edit, when):
    """Codes or scales that no longer match the shape (truncated, extended, replaced after construction) are
    refused naming the part, its bytes and the bytes the formats table says the shape needs, never a torch
    reshape error at dequantize."""
    q = _quantized(fmt, axis)
    good = getattr(q, part)
    bad = (_cut if edit == "truncated" else _grow)(good)
    words = [f"QuantizedTensor.{part} holds {bad.numel():,} bytes", f"shape {list(q.shape)} in {fmt}",
             f"needs {good.numel():,} {list(good.shape)}"]
    if when == "construction":
        import dataclasses
        _raises(lambda: dataclasses.replace(q, **{part: bad}), ShapeError, words)
    else:
        setattr(q, part, bad)  # the dataclass is not frozen: an edit after construction is checked at decode
        _raises(q.dequantize, ShapeError, words)
        _raises(q.element_scale, ShapeError, words)


SCALED = [n for n, f in FORMATS.items() if f.scope != "none"]


@pytest.mark.parametrize("fmt", SCALED)
def test_quantized_tensor_scales_must_stay_bytes(fmt):
    """Scales decoded to floats (or any non-uint8 tensor) where the packed bytes belong, caught at decode."""
    q = _quantized(fmt, "token")
    q.scales = q.scales.float()
    _raises(q.dequantize, WrongTypeError, ["QuantizedTensor.scales", "uint8", "torch.float32"])


def test_quantized_tensor_checks_arrays_resized_in_place_and_a_dropped_global_scale():
    q = _quantized("nvfp4", "token")
    q.codes = q.codes.clone()
    q.codes.resize_(2, 60)  # the array itself, mutated after construction
    _raises(q.dequantize, ShapeError, ["codes holds 120 bytes [2, 60]", "shape [2, 128] in nvfp4 needs 128 [2, 64]"])
    q = _quantized("nvfp4_2level", "token")
    q.global_scale = None
    _raises(q.dequantize, ParameterError, ["nvfp4_2level needs a global_scale", "uint8 [4]"])


def test_quantized_tensor_of_no_whole_token_group_decodes_empty():
    """Integer keys per channel over 0 tokens: empty codes and scales of the shape the check expects."""
    q = quantize(torch.zeros(2, 0, 16), "int4", axis="channel")
    assert q.dequantize().shape == (2, 0, 16) and q.nbytes == 0


# --- 6. silent numeric surprises ------------------------------------------------------------------------------
def _big(shape=(2, 32), top=3e5, seed=2):
    x = torch.randn(shape, generator=torch.Generator().manual_seed(seed))
    x[0, 0] = top
    return x


NUMERIC_REFUSED = [
    ("int4 group minimum beyond FP16", lambda: quantize(_big(top=-7e4), "int4"),
     ["minimum", "7e+04", "fp16", "65,504", "fp8_e4m3_b32"]),
    ("int4 group scale beyond FP16", lambda: quantize(torch.tensor([[-6e4, 6e4 * 16] + [0.0] * 30]), "int4"),
     ["scale", "fp16", "65,504", "int4_g32_fp32"]),
    ("int8 group scale beyond FP16", lambda: quantize(torch.tensor([[-6e4] + [2e7] + [0.0] * 30]), "int8"),
     ["int8_g32_fp32"]),
    ("int2 group beyond FP16", lambda: quantize(torch.tensor([[-6e4, 6e5] + [0.0] * 30]), "int2"), ["int2_g32_fp32"]),
    ("int4 keys per channel beyond FP16", lambda: quantize(_big((32, 8), top=-1e6), "int4", axis="channel"),
     ["minimum", "fp16"]),
    ("FP16 storage beyond its range", lambda: quantize(_big(top=1e6), "fp16"), ["1e+06", "fp16", "65,504", "bf16"]),
    ("FP8 with FP16 block scales beyond their range", lambda: quantize(_big((1, 128), top=1e9), "fp8_e4m3_b128_fp16"),
     ["scale", "fp16", "fp8_e4m3_b128_fp32"]),
    ("NaN in integer groups", lambda: quantize(torch.tensor([[math.nan] * 32]), "int4"), ["finite", "NaN"]),
    ("NVFP4 single level beyond 2,688", lambda: quantize(_big(top=1e4), "nvfp4"),
     ["|x| = 1e+04", "beyond the 2,688", "clipped", "nvfp4_2level", "nvfp4_b16_fp32"]),
    ("NVFP4 with E4M3 scales per 32 beyond 2,688", lambda: quantize(_big(top=-3e3), "nvfp4_b32"),
     ["|x| = 3000", "nvfp4_b32", "nvfp4_2level_b32", "nvfp4_b32_fp32"]),
]


@pytest.mark.parametrize("desc,fn,words", NUMERIC_REFUSED, ids=[c[0] for c in NUMERIC_REFUSED])
def test_values_a_format_cannot_hold_are_refused(desc, fn, words):
    _raises(fn, QuantizeError, words)


@pytest.mark.parametrize("recipe", ["torchao", "modelopt", "te"])
def test_nvfp4_single_level_beyond_its_range_is_refused_and_the_suggested_formats_fit(recipe):
    """Single-level NVFP4 holds |x| <= 6 x 448 = 2,688; torchao would dequantize 10,000 to 2,688 (a 73% loss)
    without a word: kvlab refuses, naming the largest |x|, the range and the formats that hold it."""
    x = _big((2, 16), top=1e4)
    _raises(lambda: quantize(x, "nvfp4", recipe=recipe), QuantizeError,
            ["1 of 2 blocks", "|x| = 1e+04", "2,688 (6 x 448)", "nvfp4_2level", "nvfp4_b16_fp32"])
    for fmt, kw in (("nvfp4_2level", dict(recipe=recipe)), ("nvfp4_b16_fp32", {})):
        fit = quantize(x, fmt, **kw).dequantize()
        assert float((fit[0, 0] - x[0, 0]).abs() / x[0, 0]) < 0.25, fmt  # the suggested format keeps the outlier


def test_nvfp4_single_level_keeps_its_whole_range():
    x = torch.zeros(2, 16)
    x[0, 0], x[1, 3] = 2688.0, -2688.0  # the edge itself is held exactly
    assert torch.equal(quantize(x, "nvfp4").dequantize(), x)


@pytest.mark.parametrize("fmt", ["int4_g32_fp32", "int4_g32_bf16"])
def test_suggested_wider_scales_hold_what_fp16_scales_cannot(fmt):
    x = torch.tensor([[-6e4, 6e4 * 16] + [0.0] * 30])
    err = (quantize(x, fmt).dequantize() - x).abs().max()
    assert torch.isfinite(err) and float(err) <= float(x.max() - x.min()) / 15  # within one step, never inf


@pytest.mark.parametrize("fmt", ["nvfp4", "nvfp4_2level", "mxfp4", "fp8_e4m3", "int4", "int2", "fp16", "bf16"])
def test_ordinary_data_raises_no_range_warning(fmt):
    x = torch.randn(8, 64, generator=torch.Generator().manual_seed(3)) * 3
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert torch.isfinite(quantize(x, fmt).dequantize()).all()


@pytest.mark.parametrize("fmt,largest", [("nvfp4", 2688.0), ("fp16", 65504.0), ("int4", 65504.0),
                                         ("fp8_e4m3_b128_fp16", 448.0 * 65504.0), ("nvfp4_2level", math.inf),
                                         ("mxfp4", math.inf), ("fp8_e4m3", math.inf), ("fp8_e4m3_b128", math.inf)])
def test_documented_ranges_are_computed_from_the_table(fmt, largest):
    """kvlab.quant.ranges' table states these; max_input derives them from kvlab.formats."""
    assert max_input(get_format(fmt)) == largest


# --- 7. lost user data ----------------------------------------------------------------------------------------
def _snapshot(root: Path) -> dict:
    """Every path under root with its bytes (files) or link target (links)."""
    out = {}
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        out[rel] = ("link", os.readlink(p)) if p.is_symlink() else ("file", p.read_bytes()) if p.is_file() else "dir"
    return out


def _user_latest_file(d: Path):
    (d / "latest").write_text("my notes: do not lose\n")


def _user_latest_folder(d: Path):
    (d / "latest").mkdir()
    (d / "latest" / "results.json").write_text('{"mine": true}\n')


def _user_latest_run_file(d: Path):  # a folder holding a RUN file that kvlab did not write
    (d / "latest").mkdir()
    (d / "latest" / "RUN").write_text("my run\n")


def _user_latest_link(d: Path):
    (d.parent / "elsewhere").mkdir()
    (d.parent / "elsewhere" / "data.txt").write_text("keep\n")
    (d / "latest").symlink_to(d.parent / "elsewhere", target_is_directory=True)


def _user_latest_dangling(d: Path):
    (d / "latest").symlink_to("my-target-that-is-gone")


LOST_DATA = [
    ("latest is the user's file", _user_latest_file, ["latest", "is a file", "not a pointer kvlab made"]),
    ("latest is the user's folder", _user_latest_folder, ["latest", "folder", "not a pointer kvlab made"]),
    ("latest holds a RUN file kvlab did not write", _user_latest_run_file, ["latest", "not a pointer kvlab made"]),
    ("latest links to the user's folder", _user_latest_link, ["latest", "a link to", "elsewhere"]),
    ("latest is a dangling link of the user's", _user_latest_dangling, ["'my-target-that-is-gone'"]),
]


@pytest.mark.parametrize("desc,setup,words", LOST_DATA, ids=[c[0] for c in LOST_DATA])
def test_run_never_replaces_a_latest_it_did_not_make(desc, setup, words, tmp_path, capsys):
    nb = tiny_notebook(tmp_path / "01_tiny.ipynb", "y = x")
    out = tmp_path / "runs"
    out.mkdir()
    setup(out)
    before, outside = _snapshot(out), _snapshot(tmp_path / "elsewhere") if (tmp_path / "elsewhere").exists() else {}
    _one_line_error(*_cli(["run", nb, "--out", out], capsys)[::2], words)
    assert _snapshot(out) == before  # byte-identical, and no run folder was made
    if outside:
        assert _snapshot(tmp_path / "elsewhere") == outside


def test_run_into_a_file_is_refused(tmp_path, capsys):
    nb = tiny_notebook(tmp_path / "01_tiny.ipynb", "y = x")
    f = tmp_path / "runs"
    f.write_bytes(b"\x00user data\xff")
    _one_line_error(*_cli(["run", nb, "--out", f], capsys)[::2], ["is a file", "--out"])
    assert f.read_bytes() == b"\x00user data\xff"


@pytest.mark.parametrize("text,words", [("{not json", ["not a readable notebook", "NotJSONError"]),
                                        (b"\xff\xfe\x00\x01", ["not a readable notebook"]),
                                        ('{"cells": 3}', ["not a readable notebook"])],
                         ids=["not JSON", "binary", "cells not a list"])
def test_run_of_a_broken_notebook_file(text, words, tmp_path, capsys):
    p = tmp_path / "01_broken.ipynb"
    (p.write_bytes if isinstance(text, bytes) else p.write_text)(text)
    _one_line_error(*_cli(["run", p, "--out", tmp_path / "runs"], capsys)[::2], words)


def test_latest_pointers_kvlab_made_are_replaced_and_others_kept(tmp_path):
    """_point_latest moves kvlab's own link or pointer folder, and logs instead of touching anything else."""
    root = tmp_path / "runs"
    for name in ("20250101-000000", "20250102-000000"):
        (root / name).mkdir(parents=True)
    (root / "latest").symlink_to("20250101-000000", target_is_directory=True)
    runner._point_latest(root, root / "20250102-000000")
    assert os.readlink(root / "latest") == "20250102-000000"
    (root / "latest").unlink()
    (root / "latest").mkdir()
    (root / "latest" / "RUN").write_text("20250101-000000\n")  # the no-symlink fallback kvlab writes
    runner._point_latest(root, root / "20250102-000000")
    assert os.readlink(root / "latest") == "20250102-000000"
    (root / "latest").unlink()
    (root / "latest").write_text("mine")
    logged = []
    runner._point_latest(root, root / "20250102-000000", log=logged.append)
    assert (root / "latest").read_text() == "mine" and "left" in logged[0]


# --- 8. interrupted runs ----------------------------------------------------------------------------------------
def _recorded(path: Path) -> dict:
    """Results recorded so far in a notebook papermill is writing ({} while absent or half written)."""
    try:
        return read_results(path, partial=True)
    except (OSError, ValueError):
        return {}


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def _fake_run(root: Path, name: str, status: str, pid: int | None = None) -> Path:
    import socket
    d = root / name
    d.mkdir(parents=True)
    (d / "run.json").write_text(json.dumps({"status": status, "pid": pid or os.getpid(),
                                            "host": socket.gethostname()}))
    (d / "results.json").write_text(json.dumps({"run": name, "status": status, "notebooks": {}}))
    return d


def test_a_run_whose_process_died_is_marked_interrupted(tmp_path):
    root = tmp_path / "runs"
    dead = _fake_run(root, "20250101-000000", "running", _dead_pid())
    alive = _fake_run(root, "20250101-000001", "running")  # this process: still going, left alone
    runner._mark_abandoned(root, log=lambda m: None)
    assert json.loads((dead / "run.json").read_text())["status"] == "interrupted"
    assert json.loads((alive / "run.json").read_text())["status"] == "running"
    for d in (dead, alive):
        _raises(lambda: runner.read_run(d), ParameterError, ["incomplete"])


def test_read_run_refuses_a_folder_without_status(tmp_path):
    _raises(lambda: runner.read_run(tmp_path), ParameterError, ["run.json"])


@pytest.mark.slow
@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_interrupted_run_says_so_and_fools_no_one(sig, tmp_path):
    """Ctrl-C / SIGTERM while a notebook runs: the notebook, results.json and run.json say "interrupted", latest
    stays on the last finished run, and the next run is a new, complete one."""
    slow = tiny_notebook(tmp_path / "01_slow.ipynb", "from kvlab.nb.record import record\nrecord('early', x)",
                          "import time\ntime.sleep(120)", "record('late', 2)")
    after = tiny_notebook(tmp_path / "02_after.ipynb", "print('after')")
    root = tmp_path / "runs"
    finished = _fake_run(root, "20250101-000000", "ok")
    (root / "latest").symlink_to(finished.name, target_is_directory=True)
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen([sys.executable, "-m", "kvlab", "run", str(slow), str(after), "--out", str(root)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 120
        out_nb = None
        while time.monotonic() < deadline:  # wait until the sleeping cell runs: 'early' is recorded by then
            runs = [d for d in root.iterdir() if d.is_dir() and d != finished and not d.is_symlink()]
            if runs and "early" in _recorded(runs[0] / slow.name):
                out_nb = runs[0] / slow.name
                break
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.2)
        assert out_nb is not None, "the notebook never started"
        time.sleep(0.5)
        proc.send_signal(getattr(signal, sig))
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130
    assert err.strip().splitlines()[-1].startswith(f"kvlab: interrupted ({sig})")
    run_dir = out_nb.parent
    run = json.loads((run_dir / "run.json").read_text())
    assert run["status"] == "interrupted" and sig in run["reason"]
    summary = json.loads((run_dir / "results.json").read_text())
    assert summary["status"] == "interrupted"
    assert summary["notebooks"]["01_slow"]["status"] == "interrupted"
    assert summary["notebooks"]["02_after"]["status"] == "not run"
    nb = nbformat.read(str(out_nb), as_version=4)
    assert nb.metadata["kvlab"]["status"] == "interrupted" and nb.metadata["papermill"]["end_time"] is None
    assert "kvlab-interrupted" in nb.cells[0].metadata["tags"] and "INTERRUPTED" in nb.cells[0].source
    statuses = [c.metadata["papermill"]["status"] for c in nb.cells[1:]]
    assert statuses == ["completed", "completed", "failed", "pending"]
    assert any(o.get("output_type") == "error" for o in nb.cells[3].outputs)
    assert not (run_dir / "02_after.ipynb").exists()
    _raises(lambda: read_results(out_nb), ParameterError, ["interrupted", "partial"])
    assert read_results(out_nb, partial=True) == {"early": 1}
    _raises(lambda: runner.read_run(run_dir), ParameterError, ["interrupted", "incomplete"])
    assert os.readlink(root / "latest") == finished.name  # still the last finished run
    if sig == "SIGINT":  # the next run: a new folder, complete, and latest moves to it
        nxt, runs = runner.run_notebooks([str(after)], {}, root, log=lambda m: None)
        assert nxt != run_dir and [r.status for r in runs] == ["ok"]
        assert runner.read_run(nxt)["status"] == "ok" and os.readlink(root / "latest") == nxt.name
        assert json.loads((run_dir / "run.json").read_text())["status"] == "interrupted"


# --- 9. the KV cache and the attention prototype ---------------------------------------------------------------
from kvlab import attention as A  # noqa: E402
from kvlab.attention import flops as attn_flops, rope as attn_rope  # noqa: E402
from kvlab.attention.checks import AttentionShapeError, SelectionError  # noqa: E402
from kvlab.attention.evaluate import accuracy_table, needle_sweep  # noqa: E402
from kvlab.attention.window import WindowState, window_positions  # noqa: E402
from kvlab.cache import KVCache, vector_store  # noqa: E402
from kvlab.cache.measurement import measure_cache  # noqa: E402
from kvlab.cache.memory import InsufficientMemoryError  # noqa: E402


def _inputs(change=None, layer=0, key="k", cache=None):
    """Seeded inputs for 2 tokens of a qwen3-8b cache, with inputs[layer][key] replaced by change(x)."""
    c = cache or KVCache("qwen3-8b")
    inp = c.random_inputs(2, torch.Generator().manual_seed(0))
    if change is not None:
        inp[layer][key] = change(inp[layer][key])
    return lambda: c.append(inp)


def _filled(tokens=2):
    c = KVCache("qwen3-8b")
    c.append_random(tokens)
    return c


CACHE = [
    ("a malformed device", lambda: KVCache("qwen3-8b", device="cpu:xyz"), ParameterError, ["'cpu:xyz'", "cuda:N"]),
    ("an unknown device", lambda: KVCache("qwen3-8b", device="gpu"), ParameterError, ["'gpu'", "auto, cpu, cuda"]),
    ("the meta device", lambda: KVCache("qwen3-8b", device="meta"), ParameterError, ["'meta'"]),
    ("a CUDA device this machine lacks", lambda: KVCache("qwen3-8b", device="cuda:99"), ParameterError,
     ["'cuda:99'"]),
    ("a device as a number", lambda: KVCache("qwen3-8b", device=3), WrongTypeError, ["device", "int 3"]),
    ("an engine by name", lambda: KVCache("qwen3-8b", engine="paged"), WrongTypeError,
     ["engine", "'paged'", "paged(block_tokens)"]),
    ("paged as text", lambda: KVCache.for_model("qwen3-8b", paged="yes"), WrongTypeError, ["paged", "'yes'"]),
    ("appending a tensor", lambda: KVCache("qwen3-8b").append(torch.randn(2, 8, 128)), WrongTypeError,
     ["inputs", "dict", "Tensor"]),
    ("appending a list", lambda: KVCache("qwen3-8b").append([1, 2]), WrongTypeError, ["inputs", "list"]),
    ("appending a list as a layer's keys", _inputs(lambda x: x.tolist()), WrongTypeError, ["inputs[0]['k']", "list"]),
    ("appending complex keys", _inputs(lambda x: x.to(torch.complex64)), WrongTypeError,
     ["inputs[0]['k']", "complex", "imaginary"]),
    ("appending boolean keys", _inputs(lambda x: x > 0), WrongTypeError, ["bool"]),
    ("appending keys of the wrong width", _inputs(lambda x: x[..., :64]), ParameterError, ["layer 0 k", "[n, 8, 128]"]),
    ("appending to a layer that does not exist", lambda: KVCache("qwen3-8b").append(
        {**KVCache("qwen3-8b").random_inputs(1, torch.Generator().manual_seed(0)), 99: {}}), ParameterError,
     ["layer 99", "36 layers"]),
    ("append_random(-3)", lambda: KVCache("qwen3-8b").append_random(-3), ParameterError, ["n", ">= 0", "-3"]),
    ("append_random(1.5)", lambda: KVCache("qwen3-8b").append_random(1.5), WrongTypeError, ["n", "1.5"]),
    ("append_random('3')", lambda: KVCache("qwen3-8b").append_random("3"), WrongTypeError, ["n", "'3'"]),
    ("append_random with a negative seed", lambda: KVCache("qwen3-8b").append_random(2, seed=-1), ParameterError,
     ["seed", ">= 0"]),
    ("append_random beyond memory", lambda: KVCache("qwen3-8b").append_random(10**12), InsufficientMemoryError,
     ["appending 1,000,000,000,000 tokens", "available"]),
    ("fill(10**12)", lambda: KVCache("qwen3-8b").fill(10**12), InsufficientMemoryError,
     ["qwen3-8b at 1,000,000,000,000 tokens", "needs", "available"]),
    ("fill(-1)", lambda: KVCache("qwen3-8b").fill(-1), ParameterError, ["tokens", "-1"]),
    ("fill with a pool of 0", lambda: KVCache("qwen3-8b").fill(16, pool=0), ParameterError, ["pool", ">= 1"]),
    ("fill with a text seed", lambda: KVCache("qwen3-8b").fill(16, seed="a"), WrongTypeError, ["seed", "'a'"]),
    ("fill a cache that holds tokens", lambda: _filled().fill(16), ParameterError, ["from empty"]),
    ("reading layer 99", lambda: _filled().read(99, "k"), ParameterError, ["layer 99", "36 layers", "0 to 35"]),
    ("reading layer -1", lambda: _filled().read(-1, "k"), ParameterError, ["layer -1", "36 layers"]),
    ("reading layer '0'", lambda: _filled().read("0", "k"), WrongTypeError, ["layer", "'0'"]),
    ("reading a key the layer lacks", lambda: _filled().read(0, "latent"), ParameterError,
     ["'latent'", "'k', 'v'"]),
    ("input shapes of layer 36", lambda: KVCache("qwen3-8b").input_shapes(36), ParameterError, ["layer 36"]),
    ("FP16 cache values beyond its range", _inputs(lambda x: x * 1e6, cache=KVCache.for_model("qwen3-8b",
                                                                                              kv_format="fp16")),
     QuantizeError, ["fp16", "65,504", "bf16"]),
    ("NVFP4 cache values beyond 2,688", _inputs(lambda x: x * 1e4, cache=KVCache.for_model("qwen3-8b",
                                                                                           kv_format="nvfp4")),
     QuantizeError, ["nvfp4", "2,688", "nvfp4_2level"]),
    ("a store given a list", lambda: vector_store(8).append([[1.0] * 8]), WrongTypeError, ["values", "list"]),
    ("a store given complex values", lambda: vector_store(8).append(torch.ones(1, 1, 8, dtype=torch.complex64)),
     WrongTypeError, ["complex", "imaginary"]),
    ("measuring -1 tokens", lambda: measure_cache("qwen3-8b", -1, device="cpu"), ParameterError, ["tokens", "-1"]),
    ("measuring on cpu:xyz", lambda: measure_cache("qwen3-8b", 16, device="cpu:xyz"), ParameterError, ["'cpu:xyz'"]),
]


@pytest.mark.parametrize("desc,fn,exc,words", CACHE, ids=[c[0] for c in CACHE])
def test_cache_misuse(desc, fn, exc, words, one_thread):
    _raises(fn, exc, words)


@pytest.mark.parametrize("device,words", [("cpu:xyz", ["'cpu:xyz'"]), ("xyz", ["'xyz'"]), ("meta", ["'meta'"]),
                                          ("cuda:99", ["'cuda:99'"])])
def test_cli_measure_devices(device, words, capsys):
    _one_line_error(*_cli(["measure", "qwen3-8b", "--tokens", "16", "--device", device], capsys)[::2], words)


def _qkv(b=1, h=8, s=4, hkv=2, t=10, d=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(b, h, s, d, generator=g), torch.randn(b, hkv, t, d, generator=g),
            torch.randn(b, hkv, t, d, generator=g))


Q, K, V = _qkv()
IDX = torch.randint(0, 10, (1, 4, 3), generator=torch.Generator().manual_seed(1))
ATTENTION = [
    ("query heads not a multiple of KV heads", lambda: A.dense_attention(torch.randn(1, 7, 4, 16), K, V),
     AttentionShapeError, ["q heads = 7", "kv heads = 2"]),
    ("V shorter than K", lambda: A.dense_attention(Q, K, V[:, :, :9]), AttentionShapeError,
     ["k length = 10", "v length = 9"]),
    ("a mask of the wrong shape", lambda: A.dense_attention(Q, K, V, mask=torch.ones(3, 3, dtype=torch.bool)),
     AttentionShapeError, ["mask", "(3, 3)", "(1, 8, 4, 10)"]),
    ("a float mask", lambda: A.dense_attention(Q, K, V, mask=torch.ones(4, 10)), WrongTypeError,
     ["mask", "bool", "float32", "added to the logits"]),
    ("a mask as a list", lambda: A.dense_attention(Q, K, V, mask=[[True]]), WrongTypeError, ["mask", "list"]),
    ("a mask row with no key", lambda: A.dense_attention(Q, K, V, mask=torch.arange(10) < torch.tensor([[0], [1],
                                                                                                      [2], [3]])),
     SelectionError, ["query row(s) with no key", "(0, 0, 0)"]),
    ("causal with more queries than keys", lambda: A.dense_attention(torch.randn(1, 8, 12, 16), K, V, causal=True),
     SelectionError, ["12 queries over 10 keys", "first 2 would see no key"]),
    ("causal and a mask", lambda: A.dense_attention(Q, K, V, causal=True, mask=torch.ones(4, 10, dtype=torch.bool)),
     SelectionError, ["not both"]),
    ("causal as text", lambda: A.dense_attention(Q, K, V, causal="yes"), WrongTypeError, ["causal", "'yes'"]),
    ("query batch 2, key batch 1", lambda: A.dense_attention(torch.randn(2, 8, 4, 16), K, V), AttentionShapeError,
     ["q batch = 2", "k batch = 1"]),
    ("queries as a list", lambda: A.dense_attention([1.0], K, V), WrongTypeError, ["q", "list"]),
    ("complex queries", lambda: A.dense_attention(Q.to(torch.complex64), K, V), WrongTypeError,
     ["q", "complex64", "imaginary"]),
    ("sinks for 3 heads of 8", lambda: A.dense_attention(Q, K, V, sinks=torch.zeros(3)), AttentionShapeError,
     ["sinks = 3", "q heads = 8"]),
    ("a NaN scale", lambda: A.dense_attention(Q, K, V, scale=math.nan), ParameterError, ["scale", "nan"]),
    ("a text scale", lambda: A.dense_attention(Q, K, V, scale="x"), WrongTypeError, ["scale", "'x'"]),
    ("probabilities under a wrong mask", lambda: A.attention_probs(Q, K, mask=torch.ones(2, 2, dtype=torch.bool)),
     AttentionShapeError, ["mask", "(2, 2)"]),
    ("a causal mask of more queries than keys", lambda: A.causal_mask(12, 10), SelectionError, ["12 queries"]),
    ("a causal mask of -1 queries", lambda: A.causal_mask(-1, 10), ParameterError, ["s (queries)", "-1"]),
    ("a window of 0", lambda: A.causal_mask(4, 10, window=0), SelectionError, ["window", ">= 1"]),
    ("sparse: an index past the last key", lambda: A.sparse_attention(Q, K, V, torch.full((1, 4, 3), 10)),
     SelectionError, ["idx holds 10", "10 positions (0 to 9"]),
    ("sparse: an index below -1", lambda: A.sparse_attention(Q, K, V, torch.full((1, 4, 3), -5)), SelectionError,
     ["idx holds -5", "-1 marks none"]),
    ("sparse: float indices", lambda: A.sparse_attention(Q, K, V, IDX.float()), WrongTypeError,
     ["idx", "integer", "float32"]),
    ("sparse: query batch 2 over key batch 1", lambda: A.sparse_attention(torch.randn(2, 8, 4, 16), K, V,
                                                                          IDX.expand(2, -1, -1)),
     AttentionShapeError, ["q batch = 2", "k batch = 1"]),
    ("sparse: index batch 2 for query batch 1", lambda: A.sparse_attention(Q, K, V, IDX.expand(2, -1, -1)),
     AttentionShapeError, ["idx batch = 2", "q batch = 1"]),
    ("sparse: heads not a multiple", lambda: A.sparse_attention(torch.randn(1, 7, 4, 16), K, V, IDX),
     AttentionShapeError, ["q heads = 7"]),
    ("sparse: V shorter than K", lambda: A.sparse_attention(Q, K, V[:, :, :5], IDX), AttentionShapeError,
     ["k length = 10", "v length = 5"]),
    ("sparse: V with other heads", lambda: A.sparse_attention(Q, K, torch.randn(1, 4, 10, 16), IDX),
     AttentionShapeError, ["k heads = 2", "v heads = 4"]),
    ("sparse: V of 3 dims", lambda: A.sparse_attention(Q, K, torch.randn(2, 10, 16), IDX), AttentionShapeError,
     ["v must be [B, Hkv, N, Dv]"]),
    ("sparse: a window mask of the wrong shape", lambda: A.sparse_attention(
        Q, K, V, IDX, extra=(K, V, torch.ones(2, 2, dtype=torch.bool))), AttentionShapeError, ["extra mask", "(2, 2)"]),
    ("sparse: window keys of other width", lambda: A.sparse_attention(
        Q, K, V, IDX, extra=(torch.randn(1, 2, 10, 8), V, None)), AttentionShapeError, ["extra keys head_dim = 8"]),
    ("sparse: extra not a triple", lambda: A.sparse_attention(Q, K, V, IDX, extra=(K, V)), WrongTypeError,
     ["extra", "(k2, v2, mask or None)"]),
    ("sparse: sinks for 3 heads", lambda: A.sparse_attention(Q, K, V, IDX, sinks=torch.zeros(3)), AttentionShapeError,
     ["sinks = 3"]),
    ("sparse: queries that select nothing", lambda: A.sparse_attention(Q, K, V, torch.full((1, 4, 3), -1)),
     SelectionError, ["4 query row(s) with no key"]),
    ("top-k larger than the pool", lambda: A.select_topk(torch.randn(2, 5), 6), SelectionError, ["top-k = 6"]),
    ("top-k validity of the wrong shape", lambda: A.select_topk(torch.randn(2, 5), 2,
                                                                valid=torch.ones(3, dtype=torch.bool)),
     AttentionShapeError, ["valid", "(3,)"]),
    ("top-k validity as floats", lambda: A.select_topk(torch.randn(2, 5), 2, valid=torch.ones(2, 5)), WrongTypeError,
     ["valid", "bool"]),
    ("top-k over a list", lambda: A.select_topk([1.0, 2.0], 1), WrongTypeError, ["scores", "list"]),
    ("candidate pool over a list", lambda: A.candidate_pool([1.0, 2.0], 1, 1), WrongTypeError, ["scores", "list"]),
    ("index keys of another batch", lambda: A.index_scores(torch.randn(2, 4, 3, 8), torch.randn(2, 4, 3),
                                                          torch.randn(1, 10, 8)),
     AttentionShapeError, ["index keys batch = 1", "index queries batch = 2"]),
    ("index weights for other queries", lambda: A.index_scores(torch.randn(1, 4, 3, 8), torch.randn(1, 5, 3),
                                                              torch.randn(1, 10, 8)),
     AttentionShapeError, ["index weights queries = 5"]),
    ("KL of different shapes", lambda: A.kl(torch.rand(3), torch.rand(4)), AttentionShapeError, ["(3,)", "(4,)"]),
    ("logit KL of different vocabularies", lambda: A.logits_kl(torch.rand(2, 3), torch.rand(2, 4)),
     AttentionShapeError, ["(2, 3)", "(2, 4)"]),
    ("recall at 0", lambda: A.recall_at_k(torch.randint(0, 5, (1, 2)), torch.rand(1, 5), 0), ParameterError,
     ["k", ">= 1"]),
    ("mass of a position past the end", lambda: A.mass_covered(torch.tensor([[7]]), torch.rand(1, 5)),
     SelectionError, ["selected holds 7", "5 positions"]),
    ("selection rows that do not match", lambda: A.recall_at_k(torch.randint(0, 5, (2, 3)), torch.rand(1, 5), 2),
     AttentionShapeError, ["selected leading dims"]),
    ("an odd RoPE width", lambda: attn_rope.apply_rope(torch.randn(1, 2, 4, 8), torch.arange(4), 3),
     AttentionShapeError, ["rope_dim", "even", "3"]),
    ("RoPE wider than the head", lambda: attn_rope.apply_rope(torch.randn(1, 2, 4, 8), torch.arange(4), 16),
     AttentionShapeError, ["rope_dim", "16", "8"]),
    ("RoPE positions for other queries", lambda: attn_rope.apply_rope(torch.randn(1, 2, 4, 8), torch.arange(5), 4),
     AttentionShapeError, ["positions (5,)"]),
    ("RMSNorm with a negative eps", lambda: attn_rope.rms_norm(torch.randn(2, 4), eps=-1), ParameterError, ["eps"]),
    ("decode FLOPs of text tokens", lambda: attn_flops.decode_flops("qwen3-8b", "1000"), SelectionError,
     ["tokens", "'1000'"]),
    ("a FLOPs table of one length", lambda: attn_flops.flops_table(1000), WrongTypeError, ["lengths", "int"]),
    ("an unknown FLOPs part", lambda: attn_flops.growth("deepseek-v4.1-flash", part="attn"), SelectionError,
     ["part", "'attn'"]),
    ("a needle sweep of one length", lambda: needle_sweep("dense", "bf16", 256, [0.5]), WrongTypeError,
     ["lengths", "int 256"]),
    ("an accuracy table of one mechanism", lambda: accuracy_table("dense", ["bf16"], 256), WrongTypeError,
     ["mechanisms", "str"]),
    ("a window state with a text TTL", lambda: WindowState(128, "x"), SelectionError, ["ttl", "'x'"]),
    ("window positions of -1 tokens", lambda: window_positions(-1, 4), SelectionError, ["tokens", "-1"]),
    ("MLA with no heads", lambda: A.MLAWeights.random(0, 8, 4, 2, 4), ParameterError, ["heads", ">= 1"]),
    ("MLA causal with more queries than latents", lambda: A.mla_absorbed(
        A.MLAWeights.random(2, 8, 4, 2, 4), torch.randn(1, 2, 5, 4), torch.randn(1, 2, 5, 2), torch.randn(1, 3, 8),
        torch.randn(1, 3, 2)), SelectionError, ["5 queries over 3 keys"]),
    ("pooling keys of 2 dims", lambda: A.pool_keys(torch.randn(10, 8), 2), AttentionShapeError, ["[B, (H,) T, d]"]),
]


@pytest.mark.parametrize("desc,fn,exc,words", ATTENTION, ids=[c[0] for c in ATTENTION])
def test_attention_misuse(desc, fn, exc, words, one_thread):
    _raises(fn, exc, words)


def test_sparse_attention_over_matching_batches_is_per_sequence(one_thread):
    """The batch checks refuse only mismatches: batch 2 with its own keys equals each sequence on its own."""
    q, k, v = _qkv(b=2, seed=4)
    idx = torch.randint(0, 10, (2, 4, 3), generator=torch.Generator().manual_seed(5))
    both = A.sparse_attention(q, k, v, idx)
    for i in range(2):
        one = A.sparse_attention(q[i:i + 1], k[i:i + 1], v[i:i + 1], idx[i:i + 1])
        assert torch.allclose(both[i:i + 1], one, rtol=1e-5, atol=1e-6)


def test_causal_attention_with_keys_enough_still_runs(one_thread):
    out = A.dense_attention(Q, K, V, causal=True)  # 4 queries over 10 keys: decode-style, every query sees keys
    assert out.shape == (1, 8, 4, 16) and torch.isfinite(out).all()


def test_a_sink_lets_a_query_see_no_key(one_thread):
    """With a sink logit the mass goes to the sink: a query with no key is legitimate and gives 0, not NaN."""
    mask = torch.ones(4, 10, dtype=torch.bool)
    mask[0] = False
    out = A.dense_attention(Q, K, V, mask=mask, sinks=torch.zeros(8))
    assert torch.isfinite(out).all() and float(out[0, :, 0].abs().max()) == 0.0


# --- 10. counts given as floats or bools -------------------------------------------------------------------------
from kvlab.attention import evaluate as attn_eval, stack as attn_stack  # noqa: E402
from kvlab.hf import evaluate as hf_eval, make_cache, quality as hf_quality  # noqa: E402
from kvlab import layout  # noqa: E402
from kvlab.serving import budget, checklist, parallel  # noqa: E402
from kvlab.sim import analyze as sim_analyze, curves, tiering, traces  # noqa: E402
from kvlab.toy import data as train_data, tasks  # noqa: E402
from kvlab.train import loop as train_loop, models as train_models  # noqa: E402


def _hf_config():
    from transformers import AutoConfig
    return AutoConfig.for_model("llama", vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                num_attention_heads=4, num_key_value_heads=2, head_dim=32)


S2 = torch.randn(2, 8, generator=torch.Generator().manual_seed(0))
X4 = torch.randn(1, 2, 8, 8, generator=torch.Generator().manual_seed(0))
KV64 = torch.randn(64, 32, generator=torch.Generator().manual_seed(0))
TIER_RATES = (1e9, 1e9, 1e9)
# (entry point, the name its message gives the count, call with the count replaced by v)
COUNTS = [
    ("select_topk", "top-k", lambda v: A.select_topk(S2, v)),
    ("candidate_pool blocks", "candidate blocks", lambda v: A.candidate_pool(S2, v, 2)),
    ("candidate_pool block_size", "candidate block size", lambda v: A.candidate_pool(S2, 2, v)),
    ("pool_keys", "compression ratio m", lambda v: A.pool_keys(X4, v)),
    ("gated_pool", "compression ratio m", lambda v: A.gated_pool(X4[0], torch.zeros_like(X4[0]), v, False)),
    ("Compressor.random ratio", "compression ratio m", lambda v: A.Compressor.random(16, 8, v, False)),
    ("Compressor.random hidden", "hidden", lambda v: A.Compressor.random(v, 8, 2, False)),
    ("Compressor.random dim", "dim", lambda v: A.Compressor.random(16, v, 2, False)),
    ("Compressor.random rope_dim", "rope_dim", lambda v: A.Compressor.random(16, 8, 2, False, rope_dim=v)),
    ("window_attention window", "window", lambda v: A.window_attention(X4, X4, X4, v)),
    ("window_attention sink_tokens", "sink_tokens", lambda v: A.window_attention(X4, X4, X4, 4, v)),
    ("window_positions", "tokens", lambda v: window_positions(v, 4)),
    ("WindowState", "window", lambda v: WindowState(v, 1.0)),
    ("causal_mask queries", "s (queries)", lambda v: A.causal_mask(v, 8)),
    ("causal_mask window", "window", lambda v: A.causal_mask(4, 8, window=v)),
    ("causal_mask sink_tokens", "sink_tokens", lambda v: A.causal_mask(4, 8, 2, v)),
    ("recall_at_k", "k", lambda v: A.recall_at_k(torch.tensor([[0, 1]]), torch.rand(1, 5), v)),
    ("scaled_plan", "layers", lambda v: A.scaled_plan("deepseek-v4.1-flash", v)),
    ("MLAWeights.random heads", "heads", lambda v: A.MLAWeights.random(v, 8, 4, 2, 4)),
    ("MLAWeights.random rank", "rank", lambda v: A.MLAWeights.random(2, v, 4, 2, 4)),
    ("MLAWeights.random d_nope", "d_nope", lambda v: A.MLAWeights.random(2, 8, v, 2, 4)),
    ("MLAWeights.random d_rope", "d_rope", lambda v: A.MLAWeights.random(2, 8, 4, v, 4)),
    ("MLAWeights.random d_v", "d_v", lambda v: A.MLAWeights.random(2, 8, 4, 2, v)),
    ("apply_rope", "rope_dim", lambda v: attn_rope.apply_rope(X4, torch.arange(8), v)),
    ("rope_angles", "rope_dim", lambda v: attn_rope.rope_angles(torch.arange(8), v, 1e4)),
    ("EvalSetup topk", "topk", lambda v: attn_eval.EvalSetup(topk=v)),
    ("EvalSetup hot", "hot", lambda v: attn_eval.EvalSetup(hot=v)),
    ("EvalSetup sink_tokens", "sink_tokens", lambda v: attn_eval.EvalSetup(sink_tokens=v)),
    ("problem", "tokens", lambda v: attn_eval.problem(attn_eval.EvalSetup(), v)),
    ("run_mla rank", "rank", lambda v: attn_eval.run_mla(attn_eval.EvalSetup(), 64, rank=v)),
    ("run_mla d_rope", "d_rope", lambda v: attn_eval.run_mla(attn_eval.EvalSetup(), 64, d_rope=v)),
    ("accuracy_table", "tokens", lambda v: accuracy_table(["dense"], ["bf16"], v)),
    ("StackConfig window", "window", lambda v: A.StackConfig(window=v)),
    ("StackConfig rope_dim", "rope_dim", lambda v: A.StackConfig(rope_dim=v)),
    ("StackConfig candidate_blocks", "candidate_blocks", lambda v: A.StackConfig(candidate_blocks=v)),
    ("StackConfig index_topk", "index_topk", lambda v: A.StackConfig(index_topk=v)),
    ("StackConfig layers", "layers", lambda v: A.StackConfig(layers=v)),
    ("compare_decoding prompt", "prompt", lambda v: attn_stack.compare_decoding(A.StackConfig(), v, 1)),
    ("compare_decoding steps", "steps", lambda v: attn_stack.compare_decoding(A.StackConfig(), 8, v)),
    ("replay_experiment", "prompt", lambda v: attn_stack.replay_experiment(A.StackConfig(), v, 1.0, 2.0)),
    ("decode_flops", "tokens", lambda v: attn_flops.decode_flops("deepseek-v4.1-flash", v)),
    ("FLOPs growth lo", "lo", lambda v: attn_flops.growth("deepseek-v4.1-flash", lo=v)),
    ("FLOPs growth hi", "hi", lambda v: attn_flops.growth("deepseek-v4.1-flash", hi=v)),
    ("kivi_quantize bits", "kivi_quantize: bits", lambda v: kivi_quantize(KV64, KV64, bits=v)),
    ("kivi_quantize group", "kivi_quantize: group", lambda v: kivi_quantize(KV64, KV64, group=v)),
    ("kivi_quantize residual", "kivi_quantize: residual", lambda v: kivi_quantize(KV64, KV64, residual=v)),
    ("KVCache.append_random", "n", lambda v: KVCache("qwen3-8b").append_random(v)),
    ("KVCache.fill tokens", "tokens", lambda v: KVCache("qwen3-8b").fill(v)),
    ("KVCache.fill pool", "pool", lambda v: KVCache("qwen3-8b").fill(4, pool=v)),
    ("KVCache.input_shapes", "layer", lambda v: KVCache("qwen3-8b").input_shapes(v)),
    ("KVCache.read", "layer", lambda v: _filled(1).read(v, "k")),
    ("vector_store width", "width", lambda v: vector_store(v)),
    ("vector_store window", "window", lambda v: vector_store(8, window=v)),
    ("vector_store copies", "copies", lambda v: vector_store(8, copies=v)),
    ("measure_cache", "tokens", lambda v: measure_cache("qwen3-8b", v, device="cpu", profile=False)),
    ("make_cache residual", "residual", lambda v: make_cache(_hf_config(), "int4", residual=v)),
    ("make_cache block", "block", lambda v: make_cache(_hf_config(), "int4", residual=4, block=v)),
    ("hf evaluate task_tokens", "task_tokens", lambda v: hf_eval.evaluate("qwen3-tiny", task_tokens=v)),
    ("hf evaluate chunk", "chunk", lambda v: hf_eval.evaluate("qwen3-tiny", chunk=v)),
    ("hf decode_rate prompt", "prompt", lambda v: hf_eval.decode_rate(None, None, torch.zeros(1, 8), v, 1)),
    ("hf decode_rate repeats", "repeats", lambda v: hf_eval.decode_rate(None, None, torch.zeros(1, 8), 2, 1, v)),
    ("hf text_windows", "n", lambda v: hf_quality.text_windows(None, 8, v, 0)),
    ("hf sweep contexts", "contexts", lambda v: hf_quality.sweep({}, [], [v], None, 1, 1, 1)),
    ("hf sweep chunk", "chunk", lambda v: hf_quality.sweep({}, [], [16], None, 1, 1, v)),
    ("hf decode_speeds", "rounds", lambda v: hf_quality.decode_speeds(None, [], None, 1, 1, v)),
    ("build_layout residual", "residual", lambda v: build_layout("qwen3-8b", residual=v)),
    ("build_layout block", "block", lambda v: build_layout("qwen3-8b", residual=4, block=v)),
    ("Layout.session tokens", "tokens", lambda v: build_layout("qwen3-8b").session(v)),
    ("Layout.session batch", "batch", lambda v: build_layout("qwen3-8b").session(8, batch=v)),
    ("Shard", "tp", lambda v: Shard(tp=v)),
    ("allocate", "page_size", lambda v: allocate("qwen3-8b", engine="sglang", page_size=v)),
    ("Allocation.session", "tokens", lambda v: allocate("qwen3-8b").session(v)),
    ("paged", "block_tokens", lambda v: paged(v)),
    ("plan context_tokens", "context_tokens", lambda v: capacity.plan("qwen3-8b", "H100", v)),
    ("plan weight_shards", "weight_shards", lambda v: capacity.plan("qwen3-8b", "H100", 1000, weight_shards=v)),
    ("plan weights", "weights", lambda v: capacity.plan("qwen3-8b", "H100", 1000, weights=v)),
    ("plan page_size", "page_size", lambda v: capacity.plan("qwen3-8b", "H100", 1000, engine="sglang", page_size=v)),
    ("session_cost", "tokens", lambda v: capacity.session_cost("qwen3-8b", v)),
    ("vllm_plan kv_cache_memory_bytes", "kv_cache_memory_bytes", lambda v: vllm_plan("qwen3-8b", v, 1000)),
    ("vllm_plan max_model_len", "max_model_len", lambda v: vllm_plan("qwen3-8b", 10**10, v)),
    ("vllm_plan max_num_batched_tokens", "max_num_batched_tokens",
     lambda v: vllm_plan("qwen3-8b", 10**10, 1000, max_num_batched_tokens=v)),
    ("vllm_plan tp", "tp", lambda v: vllm_plan("qwen3-8b", 10**10, 1000, tp=v)),
    ("plan kv_cache_memory_bytes", "kv_cache_memory_bytes",
     lambda v: capacity.plan("qwen3-8b", "H100", 1000, kv_cache_memory_bytes=v)),
    ("kv_budget tp", "tp", lambda v: budget.kv_budget("vllm", hardware.get_gpu("H100"), 10**9, 10**9, tp=v)),
    ("kv_budget pp", "pp", lambda v: budget.kv_budget("vllm", hardware.get_gpu("H100"), 10**9, 10**9, pp=v)),
    ("kv_budget weight_share", "weight_share", lambda v: budget.kv_budget("vllm", hardware.get_gpu("H100"), v, 0)),
    ("kv_budget activation_bytes", "activation_bytes",
     lambda v: budget.kv_budget("vllm", hardware.get_gpu("H100"), 10**9, v)),
    ("Parallelism tp", "tp", lambda v: Parallelism(tp=v)),
    ("Parallelism pp", "pp", lambda v: Parallelism(pp=v)),
    ("Parallelism dcp", "dcp", lambda v: Parallelism(tp=2, dcp=v)),
    ("stage_layers num_layers", "num_layers", lambda v: layout.stage_layers(v, 1, 0)),
    ("stage_layers stage", "stage", lambda v: layout.stage_layers(4, 2, v)),
    ("per_gpu", "page_size", lambda v: per_gpu("qwen3-8b", engine="sglang", page_size=v)),
    ("PerGpu.session_bytes", "tokens", lambda v: per_gpu("qwen3-8b").session_bytes(v)),
    ("checklist_row", "tokens", lambda v: checklist.checklist_row("qwen3-8b", "H100", Parallelism(), v, 0.0, 1.0,
                                                                  1e4, 50.0, 500, 20.0)),
    ("Tiers block_tokens", "block_tokens", lambda v: tiering.Tiers(v, 1024, (4, 4, 4), TIER_RATES)),
    ("Tiers block_bytes", "block_bytes", lambda v: tiering.Tiers(16, v, (4, 4, 4), TIER_RATES)),
    ("Tiers capacity_blocks", "hbm capacity (blocks)", lambda v: tiering.Tiers(16, 1024, (v, 4, 4), TIER_RATES)),
    ("block_bytes", "block_tokens", lambda v: tiering.block_bytes("qwen3-8b", v)),
    ("load_trace limit", "limit", lambda v: traces.load_trace("synthetic", limit=v)),
    ("load_trace sessions", "synthetic workload sessions", lambda v: traces.load_trace("synthetic", sessions=v)),
    ("AgentWorkload max_context", "synthetic workload max_context", lambda v: traces.AgentWorkload(max_context=v)),
    ("AgentWorkload block_tokens", "synthetic workload block_tokens",
     lambda v: traces.AgentWorkload(block_tokens=v)),
    ("capacity grid n_blocks", "n_blocks", lambda v: curves.grid(v)),
    ("capacity grid points", "points", lambda v: curves.grid(100, v)),
    ("capacity grid lo", "lo", lambda v: curves.grid(100, 10, v)),
    ("reference_hits", "LRU capacity (blocks)",
     lambda v: curves.reference_hits(traces.load_trace("synthetic", limit=50, sessions=2), "lru", v)),
    ("analyze", "points", lambda v: sim_analyze.analyze(traces.load_trace("synthetic", limit=50, sessions=2),
                                                        points=v)),
    ("needle length", "length", lambda v: tasks.needle(0, v)),
    ("needle needles", "needles", lambda v: tasks.needle(0, 128, needles=v)),
    ("needle key_len", "key_len", lambda v: tasks.needle(0, 128, key_len=v)),
    ("needle value_len", "value_len", lambda v: tasks.needle(0, 128, value_len=v)),
    ("mqar pairs", "pairs", lambda v: tasks.mqar(0, 64, pairs=v)),
    ("mqar key_len", "key_len", lambda v: tasks.mqar(0, 64, key_len=v)),
    ("vartrack hops", "hops", lambda v: tasks.vartrack(0, 256, hops=v)),
    ("vartrack chains", "chains", lambda v: tasks.vartrack(0, 256, chains=v)),
    ("vartrack name_len", "name_len", lambda v: tasks.vartrack(0, 256, name_len=v)),
    ("vartrack value_len", "value_len", lambda v: tasks.vartrack(0, 256, value_len=v)),
    ("Task.samples n", "n", lambda v: tasks.get_task("mqar").samples(0, v, 64)),
    ("Task.samples length", "length", lambda v: tasks.get_task("mqar").samples(0, 2, v)),
    ("Corpus.text", "max_bytes", lambda v: train_data.load_corpus().text(max_bytes=v)),
    ("train evaluate windows", "windows", lambda v: train_loop.evaluate(None, None, windows=v)),
    ("train evaluate batch", "batch", lambda v: train_loop.evaluate(None, None, batch=v)),
    ("retrain", "steps", lambda v: train_loop.retrain(ROOT / "no-such-checkpoint", v)),
    ("make_config", "vocab", lambda v: train_models.make_config("dense", vocab=v)),
    ("TrainConfig steps", "steps", lambda v: train_loop.TrainConfig(steps=v)),
    ("TrainConfig warmup", "warmup", lambda v: train_loop.TrainConfig(warmup=v)),
    ("TrainConfig batch_tokens", "batch_tokens", lambda v: train_loop.TrainConfig(batch_tokens=v)),
]


@pytest.mark.parametrize("value", [2.0, True], ids=["float 2.0", "bool True"])
@pytest.mark.parametrize("desc,name,fn", COUNTS, ids=[c[0] for c in COUNTS])
def test_counts_refuse_floats_and_bools(desc, name, fn, value, one_thread):
    """A count is an int (numpy integers too): 2.0 or True where one belongs is refused naming the argument,
    before any work, rather than taken as 2 (or 1) or failing later inside torch."""
    _raises(lambda: fn(value), KvlabError, [f"{name} must be an integer", f"got {value!r}"])


@pytest.mark.parametrize("value", [np.int64(2), np.int32(2), torch.tensor(2)], ids=["int64", "int32", "tensor"])
def test_counts_take_numpy_and_torch_integers(value):
    assert A.select_topk(S2, value).shape == (2, 2)
    assert build_layout("qwen3-8b").session(value).tokens == 2
