"""What a cache costs in quality on a real model: perplexity, task accuracy, bytes held, decode speed.

Protocol. The text is fed in chunks of `chunk` tokens through one cache; each chunk's queries read the
cache as it stands after storing that chunk (a kvlab cache returns what it holds, decoded, so the
prefill attends to quantized keys too, as a serving engine's kernel does). Perplexity is exp(mean NLL)
of every next token; a task's accuracy is the share of answers whose every token the model predicts
greedily (teacher forced: kvlab.toy.tasks). chunk = 1 is token-by-token decoding; a chunk no longer than
the residual keeps a KIVI-style residual close to its decode-time behaviour. The reference is the same
model with transformers' BF16 `DynamicCache`. Bytes held are measured from the cache's tensors (storage
bytes, each storage once), never taken from a format's size. Decode speed: greedy steps after a prefill,
teacher forced on the same text so every cache does the same work; tokens/s, the median of repeats.

Peers (`peer_cache`): transformers' own `QuantizedCache` with its quanto backend (2 or 4 bits; group
64, residual 128 by default) and its FP8 backend (one scale per tensor, frozen at the first update).
Their held bytes are counted from every tensor inside them (quanto's packed data, scales and shifts).
"""
from __future__ import annotations

import logging
import math
import os
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import torch

from ..cache.memory import storage_bytes
from ..checks import need_int
from ..errors import KvlabError, ParameterError
from ..stats import accuracy_interval
from .kernelset import math_attention_if_forced


class ModelLoadError(KvlabError):
    """A model that cannot be loaded: no such directory, no network in offline mode, a gated repository."""


TEACHER_FORCED = "teacher_forced"  # a checkpoint task's protocol: all before the question compressed, answer scored

# --- loading -----------------------------------------------------------------------------------------
def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__


HUB_TIMEOUT_S = 3.0  # how long a Hub id waits for huggingface.co to answer before only the local cache is read


def hub_reachable(host: str = "huggingface.co", timeout: float = HUB_TIMEOUT_S) -> bool:
    """Whether the Hub answers a TCP connection within `timeout` (HF_ENDPOINT's host when set)."""
    import socket
    from urllib.parse import urlparse
    host = urlparse(os.environ.get("HF_ENDPOINT", "")).hostname or host
    try:
        socket.create_connection((host, 443), timeout=timeout).close()
        return True
    except OSError:
        return False


def load(name: str, dtype: torch.dtype = torch.bfloat16):
    """(model, tokenizer) from a local directory (save_pretrained output) or a Hugging Face Hub id.

    Hub ids go through `from_pretrained`, so HF_HUB_OFFLINE / HF_HOME and the local cache are honoured;
    no network, a missing repository or a gated one is one ModelLoadError line."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    if not isinstance(name, str) or not name.strip():
        raise ParameterError(f"model must be a directory or a Hub id, got {name!r}")
    p = Path(name).expanduser()
    local = p.is_dir()
    if not local and (name.startswith((".", "/", "~")) or name.count("/") > 1 or p.exists()):
        raise ModelLoadError(f"cannot load {name!r}: no such model directory")
    src = str(p) if local else name
    offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")
    unreachable = not local and not offline and not hub_reachable()
    cached_only = local or offline or unreachable  # no network: the local cache answers at once, no retries
    with quiet():  # kvlab's V4.1-like model imports torchao, whose import logs warnings about CUDA kernels
        _register_kvlab_models()
    try:
        with quiet():
            model = AutoModelForCausalLM.from_pretrained(src, dtype=dtype, local_files_only=cached_only)
            if _softcapped(model.config) and model.config._attn_implementation != "eager":
                model.set_attn_implementation("eager")  # SDPA cannot soft-cap logits (Gemma 2); kvlab.hf.sdpa can
    except (OSError, ValueError, ImportError) as e:
        where = ("a local directory" if local else "the Hub in offline mode (HF_HUB_OFFLINE=1) and not in the local "
                 "cache" if offline else f"the Hub, which did not answer within {HUB_TIMEOUT_S:g} s, and not in the "
                 "local cache" if unreachable else "the Hub")
        raise ModelLoadError(f"cannot load {name!r} from {where}: {_first_line(e)}") from None
    model.eval()
    try:
        with quiet():
            tok = AutoTokenizer.from_pretrained(src, local_files_only=cached_only)
    except (OSError, ValueError, TypeError):
        tok = None
    return model, tok


def _softcapped(config) -> bool:
    """A model whose attention soft-caps its logits (Gemma 2's attn_logit_softcapping)."""
    from .cache.family import text_config
    return bool(getattr(text_config(config), "attn_logit_softcapping", None))


@contextmanager
def quiet():
    """No progress bars or import-time log lines (torchao's, torch's, transformers') while loading."""
    from transformers.utils import logging as hf_logging
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    logging.disable(logging.WARNING)
    logging.getLogger("torch.utils._pytree").setLevel(logging.ERROR)
    try:
        yield
    finally:
        logging.disable(logging.NOTSET)
        if bars:
            hf_logging.enable_progress_bar()


def _register_kvlab_models() -> None:
    """Make kvlab's own architectures (the V4.1-like stack, when installed) loadable by AutoModel."""
    from ..toy import v41  # noqa: F401  (registers model_type "kvlab_v41")


def encoder(tokenizer, vocab_size: int) -> Callable[[str], list[int]]:
    """text -> ids: the model's tokenizer without special tokens, or bytes for a byte-level model."""
    if tokenizer is not None:
        return lambda s: tokenizer.encode(s, add_special_tokens=False)
    if vocab_size == 256:
        return lambda s: list(s.encode("utf-8"))
    raise ModelLoadError(f"the model has no tokenizer and a vocabulary of {vocab_size} (not bytes)")


# --- caches --------------------------------------------------------------------------------------------
PEERS = ("dynamic", "quanto2", "quanto4", "fp8")  # transformers' own caches, side by side


def peer_cache(model, name: str):
    """A transformers cache by name: 'dynamic' (DynamicCache), 'quanto2' / 'quanto4' (QuantizedCache,
    quanto backend, defaults otherwise), 'fp8' (QuantizedCache, FP8 backend)."""
    from transformers import DynamicCache, QuantizedCache
    if name == "dynamic":
        return DynamicCache(config=model.config)
    if name in ("quanto2", "quanto4"):
        return QuantizedCache("quanto", model.config, nbits=int(name[-1]))
    if name == "fp8":
        return QuantizedCache("fp8", model.config)
    raise ParameterError(f"unknown peer cache {name!r}; choose one of {', '.join(PEERS)}")


def _inner(t) -> list[torch.Tensor]:
    """The plain tensors inside a tensor (a quanto QTensor holds packed data, scales and shifts)."""
    if isinstance(t, (tuple, list)):
        return [x for y in t for x in _inner(y)]
    if not isinstance(t, torch.Tensor):
        return []
    if hasattr(t, "__tensor_flatten__"):
        names, _ = t.__tensor_flatten__()
        return [x for n in names for x in _inner(getattr(t, n))]
    return [t]


def held_bytes(cache) -> int:
    """Bytes a cache holds, measured from its tensors' storages: kvlab caches, DynamicCache, QuantizedCache."""
    if hasattr(cache, "tensors"):
        return storage_bytes(cache.tensors())
    held = []
    for layer in cache.layers:
        for a in ("keys", "values", "_quantized_keys", "_quantized_values"):
            held += _inner(getattr(layer, a, None))
    return storage_bytes(t for t in held if t.numel())


# --- measuring -----------------------------------------------------------------------------------------
@dataclass
class Pass:
    """One chunked pass of a sequence through a cache."""

    nll: float  # summed negative log-likelihood of the next tokens (nats)
    scored: int  # next tokens scored
    predictions: torch.Tensor  # [B, T] greedy next-token predictions
    held_bytes: int  # bytes the cache holds at the end
    predicted_bytes: int | None  # kvlab's prediction (kvlab caches only)
    row_nll: list = field(default_factory=list)  # nll of each row of the batch (nats; they sum to nll)


def run_pass(model, ids: torch.Tensor, cache, chunk: int, prefill: int | None = None) -> Pass:
    """Feed ids [B, T] through `cache` in chunks (the first `prefill` tokens in one forward: a press's context);
    score every next token."""
    need_int("chunk", chunk, 1)
    ids = ids.to(model.device)
    t = ids.shape[1]
    rows, preds = torch.zeros(ids.shape[0], dtype=torch.float64), []
    starts = ([0] + list(range(prefill, t, chunk))) if prefill else list(range(0, t, chunk))
    with torch.no_grad(), math_attention_if_forced():
        for a, b in zip(starts, starts[1:] + [t]):
            logits = model(ids[:, a:b], cache=cache, use_cache=True).logits.float()  # [B, c, V]
            preds.append(logits.argmax(-1))
            target = ids[:, a + 1:b + 1]  # [B, n]
            n = target.shape[1]
            if n:
                tok = torch.nn.functional.cross_entropy(logits[:, :n].transpose(1, 2), target, reduction="none")
                rows += tok.sum(1).double().cpu()  # [B]
    pred = cache.predicted_bytes() if hasattr(cache, "predicted_bytes") else None
    return Pass(float(rows.sum()), ids.shape[0] * (t - 1), torch.cat(preds, dim=1).cpu(), held_bytes(cache), pred,
                rows.tolist())


def question_start(sample, encode) -> int:
    """Tokens before a task sample's question (its last line before the answer): a press's context."""
    head = sample.segments[0][0]
    return len(encode(head[:head.rfind("\n") + 1])) if "\n" in head else len(encode(head))


def score_samples(run, samples: list, encode, batch: int) -> tuple[int, int, list, list, list]:
    """(answers right, answers, held bytes per pass, predicted bytes per pass, (right, answers) per sample in the
    given order) of task samples, `batch` samples of equal length per pass through a fresh cache; a press's
    context is everything before the batch's earliest question (`run(ids [B, T], prefill) -> Pass`)."""
    from ..toy.tasks import batch as render_batch
    from ..toy.tasks import score_predictions
    held, pred, per = [], [], {}
    by_len = {}
    for k, smp in enumerate(samples):
        by_len.setdefault(len(encode(smp.text)), []).append((k, smp))
    for group in by_len.values():
        for i in range(0, len(group), batch):
            part = group[i:i + batch]
            ids, labels = render_batch([smp for _, smp in part], encode)
            p = run(ids, min(question_start(smp, encode) for _, smp in part))
            for row, (k, _) in enumerate(part):
                per[k] = score_predictions(p.predictions[row:row + 1], labels[row:row + 1])
            held.append(p.held_bytes)
            pred.append(p.predicted_bytes)
    per = [per[k] for k in range(len(samples))]
    return sum(r for r, _ in per), sum(n for _, n in per), held, pred, per


@dataclass
class TaskCounts:
    """A task scored on a seeded sample stream (teacher forced)."""
    right: int  # answer tokens predicted right
    answers: int  # answer tokens scored
    samples: int  # samples drawn (the stream's first `samples`)
    held: list  # bytes held after each pass
    predicted: list  # kvlab's predicted bytes after each pass (None: a peer cache)
    per_sample: list  # (right, answers) per sample, in stream order (pairs settings on the same samples)


def task_rounds(run, task: str, seed: int, tokens: int, encode, samples: int, batch: int,
                halfwidth: float = 0.0, max_samples: int | None = None) -> TaskCounts:
    """A checkpoint task's seeded sample stream (Task.samples) of `tokens` tokens: `samples` of them, or with
    `halfwidth` more in rounds of `batch` until the accuracy's Wilson 95% interval is at most that wide on each
    side (or `max_samples` are drawn). The one sampling rule of notebook 08 (kvlab.hf.quality.measure) and
    `kvlab eval`, so a setting, seed and sample count give one accuracy in both."""
    from ..toy.tasks import get_task
    stream = get_task(task)
    cap = max(samples, max_samples or samples) if halfwidth else samples
    right = total = drawn = 0
    held, pred, per_sample = [], [], []
    while drawn < cap:
        k = min(batch, cap - drawn) if halfwidth else cap
        new = stream.samples(seed, k, tokens, start=drawn)
        r, n, h, q, per = score_samples(run, new, encode, batch)
        right, total, drawn = right + r, total + n, drawn + k
        per_sample += per
        held += h
        pred += q
        if not halfwidth or (drawn >= samples and total and accuracy_interval(right, total).halfwidth <= halfwidth):
            break
    return TaskCounts(right, total, drawn, held, pred, per_sample)


def perplexity(p: Pass) -> float:
    return math.exp(p.nll / p.scored)


def decode_rate(model, make: Callable[[], object], ids: torch.Tensor, prompt: int, steps: int,
                repeats: int = 3) -> list[float]:
    """Decode tokens/s of each repeat: prefill ids[:, :prompt], then `steps` one-token steps teacher forced on
    ids (so every cache does the same work)."""
    prompt, steps, repeats = need_int("prompt", prompt, 1), need_int("steps", steps, 1), need_int("repeats", repeats, 1)
    if ids.shape[1] < prompt + steps:
        raise ParameterError(f"decode timing needs {prompt + steps} tokens of text, got {ids.shape[1]}")
    rates = []
    ids = ids.to(model.device)
    sync = torch.cuda.synchronize if model.device.type == "cuda" else (lambda: None)
    with torch.no_grad(), math_attention_if_forced():
        for _ in range(repeats):
            cache = make()
            model(ids[:, :prompt], cache=cache, use_cache=True)
            sync()
            t0 = time.perf_counter()
            for i in range(prompt, prompt + steps):
                model(ids[:, i:i + 1], cache=cache, use_cache=True)
            sync()
            rates.append(steps / (time.perf_counter() - t0))
    return rates


@dataclass
class EvalResult:
    """`kvlab eval`'s record: the cache under test against the BF16 DynamicCache reference."""

    model: str  # directory or Hub id
    kv_format: str  # the kvlab cache's plan ('bf16', 'nvfp4', 'k=int4/channel v=int4 residual=32', ...)
    mechanism: str  # 'dense', 'window=64', ...
    tokens: int  # tokens of held-out text scored
    chunk: int  # tokens per forward
    perplexity: float  # with the kvlab cache
    reference_perplexity: float  # same model, same text, BF16 DynamicCache
    held_bytes: int  # measured from the kvlab cache's tensors after `tokens` tokens
    predicted_bytes: int  # kvlab.layout's prediction for the same config, plan and length
    reference_bytes: int  # measured from the DynamicCache
    decode_tokens_per_s: float  # kvlab cache, median of repeats
    reference_decode_tokens_per_s: float  # DynamicCache, median of repeats
    decode_tokens_per_s_range: tuple[float, float] = (0.0, 0.0)  # kvlab cache: slowest, fastest repeat
    task: str | None = None  # task name, if one was run
    accuracy: float | None = None  # task accuracy with the kvlab cache (answers right / answers)
    reference_accuracy: float | None = None  # with the DynamicCache
    text: str = ""  # where the text came from
    windows: int = 1  # held-out windows of `tokens` tokens, each through a fresh cache
    perplexity_ci: list | None = None  # [low, high]: bootstrap 95% interval over the windows
    reference_perplexity_ci: list | None = None  # the same for the reference
    perplexity_change: float | None = None  # perplexity / reference - 1 on the same windows
    perplexity_change_ci: list | None = None  # [low, high]: paired bootstrap 95% interval (seeded)
    within_noise: bool | None = None  # the change's interval covers zero
    held_equals_predicted: bool | None = None  # after every window (None: no prediction)
    samples: int | None = None  # task samples
    answers: int | None = None  # answers scored over them (the accuracies' n)
    accuracy_ci: list | None = None  # [low, high]: Wilson 95% interval
    reference_accuracy_ci: list | None = None  # the same for the reference
    notes: list[str] = field(default_factory=list)  # caveats
    press: str | None = None  # a press and its budget ('snapkv keep 0.25'), if any (kvlab.hf.presses)
    context: int | None = None  # with a press: the tokens of each window prefilled as its context
    protocol: str | None = None  # kvlab.quality.prompt's protocol (answers generated); TEACHER_FORCED: a checkpoint
    task_tokens: int | None = None  # a RULER task: context tokens per sample
    accuracy_change: float | None = None  # accuracy - reference accuracy on the same samples
    accuracy_change_ci: list | None = None  # [low, high]: its paired bootstrap 95% interval (seeded)
    task_held_bytes: int | None = None  # mean bytes the cache held once a sample's context was in it (measured)
    task_reference_bytes: int | None = None  # the same for the reference
    task_bytes_match: bool | None = None  # kvlab's prediction equal to the measured bytes on every sample
    compute_dtype: str = ""  # the model's compute dtype (K/V are held in the setting's format either way)

    def as_dict(self) -> dict:
        d = asdict(self)
        d["decode_tokens_per_s_range"] = list(self.decode_tokens_per_s_range)
        return d


def text_windows(encode, length: int, n: int, seed: int) -> torch.Tensor:
    """`n` windows of `length` tokens of kvlab's held-out text at seeded offsets: ids [n, length]."""
    length, n = need_int("length", length, 1), need_int("n", n, 1)
    from ..toy.data import load_corpus
    corpus = load_corpus()
    g = torch.Generator().manual_seed(seed)
    text = corpus.text("heldout")
    out = []
    for _ in range(n):
        start = int(torch.randint(0, max(1, len(text) - 8 * length), (1,), generator=g))
        ids = encode(text[start:start + 8 * length])
        if len(ids) < length:
            raise ParameterError(f"held-out text too short for windows of {length} tokens")
        out.append(torch.tensor(ids[:length]))
    return torch.stack(out)


def is_v41(model) -> bool:
    """kvlab's V4.1-like model (kvlab.toy.v41): its cache is its own Stack's, not a transformers cache."""
    return getattr(model.config, "model_type", None) == "kvlab_v41"


def stack_layout(model, kv_format: str):
    """kvlab.layout's layout of the V4.1-like checkpoint with every store (entries, index keys, window) in one
    format: what `kvlab bytes PATH` lays out, and what its Stack holds."""
    from ..layout import build_layout
    return build_layout(model.config.spec(), kv_format=kv_format)


def stack_pass(model, ids: torch.Tensor, formats: dict, chunk: int, stack=None) -> Pass:
    """`run_pass` for the V4.1-like model: its trained weights in a kvlab.attention Stack whose packed stores
    hold compressed entries, index keys and the window in `formats` (role -> format), fed in chunks. The
    prediction is kvlab.layout's when every role takes one format."""
    from ..toy.v41 import to_stack
    stack = stack or to_stack(model, formats)
    stack.reset()
    nll, preds = 0.0, []
    with torch.no_grad(), math_attention_if_forced():
        for a in range(0, ids.shape[1], chunk):
            logits = stack.forward(ids[:, a:a + chunk]).float()  # [1, c, V]
            preds.append(logits.argmax(-1))
            target = ids[:, a + 1:a + chunk + 1]
            n = target.shape[1]
            if n:
                nll += float(torch.nn.functional.cross_entropy(logits[0, :n], target[0], reduction="sum"))
    one = set(formats.values())
    pred = stack_layout(model, one.pop()).session(ids.shape[1]).total if len(one) == 1 else None
    return Pass(nll, ids.shape[1] - 1, torch.cat(preds, 1), stack.cache_bytes()["total"], pred, [nll])


def heldout_ids(encode, tokens: int) -> tuple[torch.Tensor, str]:
    """The first `tokens` tokens of kvlab's held-out text (standard library documents no trained model saw;
    kvlab.toy.data): (ids [1, tokens], where the text comes from)."""
    from ..toy.data import load_corpus
    c = load_corpus()
    ids = encode(c.text("heldout", max_bytes=8 * tokens + 4096))  # a few bytes per token is plenty
    if len(ids) < tokens:
        ids = encode(c.text("heldout"))
    if len(ids) < tokens:
        raise ParameterError(f"the held-out text gives {len(ids)} tokens, fewer than {tokens}")
    return torch.tensor(ids[:tokens])[None], f"held-out standard library text (Python {c.python}, {c.sha256[:12]})"


def stack_decode_rate(stack, ids: torch.Tensor, prompt: int, steps: int, repeats: int = 3) -> list[float]:
    """`decode_rate` for the V4.1-like model's Stack: prefill ids[:, :prompt], then `steps` one-token steps."""
    need_int("steps", steps, 1)
    if ids.shape[1] < prompt + steps:
        raise ParameterError(f"decode timing needs {prompt + steps} tokens of text, got {ids.shape[1]}")
    rates = []
    with torch.no_grad():
        for _ in range(repeats):
            stack.reset()
            stack.forward(ids[:, :prompt])
            t0 = time.perf_counter()
            for i in range(prompt, prompt + steps):
                stack.forward(ids[:, i:i + 1])
            rates.append(steps / (time.perf_counter() - t0))
    return rates


def evaluate(name: str, kv_format=None, k_format=None, v_format=None, residual: int = 0, mechanism=None,
             tokens: int = 512, task: str | None = None, samples: int = 8, task_tokens: int | None = None,
             chunk: int = 32, block: int = 1, decode_steps: int = 32, repeats: int = 3, seed: int = 0,
             device: str = "auto", windows: int = 8, model=None, tokenizer=None, press=None, keep=None,
             keep_bytes: int | None = None, press_mode: str = "prefill", context: int | None = None,
             batch: int = 32, halfwidth: float = 0.0, max_samples: int | None = None,
             dtype: torch.dtype = torch.bfloat16) -> EvalResult:
    """Perplexity, task accuracy, bytes and decode speed of a model with a kvlab cache, against BF16 DynamicCache
    (the V4.1-like model: its own Stack in the format, against the Stack in BF16), over `windows` held-out windows
    of `tokens` tokens and `samples` task samples, with 95% intervals (kvlab.stats): the perplexity's bootstrap over
    windows, the change's paired bootstrap, the accuracies' Wilson. Arguments are checked before the model loads,
    so a bad one costs nothing.

    press / keep / keep_bytes / press_mode: a token-eviction press (kvlab.hf.presses); each window's first
    `context` tokens (default: half of them) are prefilled in one forward, its context, then compressed (kvpress's
    protocol), and the rest is scored chunk by chunk against the compressed context; a task sample's context is
    everything before its question (kvlab.hf.evaluate.task_rounds, as notebook 08).

    task / samples / batch / halfwidth / max_samples: a checkpoint task, teacher forced, drawn and scored by
    task_rounds (the sampling rule of notebook 08); the reference is scored on the same samples, paired.
    dtype: the model's compute dtype when `model` is not given (notebook 08 computes its checkpoints in float32)."""
    from ..cache.memory import resolve_device
    from ..layout import kv_plan
    from ..stats import bootstrap_perplexity, paired_bootstrap
    from .cache import make_cache
    from .mechanisms import parse_mechanism
    kv_plan(kv_format, k_format, v_format, residual, block)
    mech = parse_mechanism(mechanism)
    plan = None
    if press is not None:
        from .presses import make_plan
        plan = make_plan(press, keep, keep_bytes, press_mode)
        context = need_int("context", context if context is not None else max(1, tokens // 2), 1, tokens - 1)
    elif keep is not None or keep_bytes is not None:
        raise ParameterError("--keep / --keep-bytes are a press's budget: give --press too")
    for k, v, lo in (("tokens", tokens, 2), ("samples", samples, 1), ("chunk", chunk, 1),
                     ("decode_steps", decode_steps, 1), ("repeats", repeats, 1), ("windows", windows, 1),
                     ("seed", seed, 0), ("batch", batch, 1)):
        need_int(k, v, lo)
    if not isinstance(halfwidth, (int, float)) or not 0 <= halfwidth < 0.5:
        raise ParameterError(f"halfwidth must be in [0, 0.5), got {halfwidth!r}")
    if max_samples is not None:
        need_int("max_samples", max_samples, 1)
    if task_tokens is not None:
        need_int("task_tokens", task_tokens, 2)
    if task is not None:
        from ..toy.tasks import get_task
        get_task(task)
    dev = resolve_device(device)
    if model is None:
        model, tokenizer = load(name, dtype)
    model.to(dev)
    encode = encoder(tokenizer, model.config.vocab_size)
    if is_v41(model):
        if not mech.dense or residual or k_format or v_format or block != 1:
            raise ParameterError("the V4.1-like model compresses and selects with its own trained modules: it takes "
                                 "one --kv-format for its stores, not mechanisms, residuals or separate K/V formats")
        from ..formats import get_format
        from ..toy.v41 import to_stack
        fmt = get_format(kv_format or "bf16").name
        stacks = {f: to_stack(model, {r: f for r in ("main", "index", "swa")}) for f in dict.fromkeys((fmt, "bf16"))}

        def run(ids, f, prefill=None):
            return stack_pass(model, ids, {r: f for r in ("main", "index", "swa")}, chunk, stacks[f])

        def rates(ids, f):
            return stack_decode_rate(stacks[f], ids.to(dev), ids.shape[1] - decode_steps, decode_steps, repeats)
        label, mlabel, ours, ref = fmt, "v41 (its own CSA / HCA and indexer)", fmt, "bf16"
    else:
        def kv():
            return make_cache(model, kv_format, k_format, v_format, residual, block=block, mechanism=mechanism,
                              press=press, keep=keep, keep_bytes=keep_bytes, press_mode=press_mode)

        def dyn():
            return peer_cache(model, "dynamic")
        makers = {"kv": kv, "ref": dyn}

        def run(ids, f, prefill=None):
            return run_pass(model, ids, makers[f](), chunk, (prefill or context) if f == "kv" else None)

        def rates(ids, f):
            return decode_rate(model, makers[f], ids, ids.shape[1] - decode_steps, decode_steps, repeats)
        probe = kv()  # a model the cache cannot hold fails here, before any work
        label, mlabel, ours, ref = probe.kv_format, probe.mech.label(), "kv", "ref"
    text = text_windows(encode, tokens, windows, seed)  # [windows, tokens]
    mine = [run(w[None], ours) for w in text]
    base = [run(w[None], ref) for w in text]
    scored = [p.scored for p in mine]
    nll, ref_nll = [p.nll for p in mine], [p.nll for p in base]
    ppl, ref_ppl = bootstrap_perplexity(nll, scored, seed=seed), bootstrap_perplexity(ref_nll, scored, seed=seed)
    change = paired_bootstrap(ref_nll, nll, scored, seed=seed)
    ids, where = heldout_ids(encode, decode_steps + (context if plan is not None else 16))  # a press: its context
    r_mine, r_ref = rates(ids, ours), rates(ids, ref)
    out = EvalResult(name, label, mlabel, tokens, chunk, ppl.value, ref_ppl.value, mine[-1].held_bytes,
                     mine[-1].predicted_bytes, base[-1].held_bytes, _median(r_mine), _median(r_ref),
                     (min(r_mine), max(r_mine)), text=where, windows=windows,
                     perplexity_ci=ppl.pair(), reference_perplexity_ci=ref_ppl.pair(),
                     perplexity_change=change.value, perplexity_change_ci=change.pair(),
                     within_noise=change.covers_zero,
                     held_equals_predicted=None if mine[-1].predicted_bytes is None else
                     all(p.held_bytes == p.predicted_bytes for p in mine),
                     press=plan.label() if plan is not None else None, context=context if plan else None,
                     compute_dtype=str(next(model.parameters()).dtype).removeprefix("torch."))
    if task:
        from ..stats import paired_accuracy_change
        tt = task_tokens or tokens
        mine_t = task_rounds(lambda ids, pre: run(ids, ours, pre), task, seed, tt, encode, samples, batch,
                             halfwidth, max_samples)
        ref_t = task_rounds(lambda ids, pre: run(ids, ref, pre), task, seed, tt, encode, mine_t.samples, batch)
        a, b = accuracy_interval(mine_t.right, mine_t.answers), accuracy_interval(ref_t.right, ref_t.answers)
        ch = paired_accuracy_change([r for r, _ in ref_t.per_sample], [r for r, _ in mine_t.per_sample],
                                    [n for _, n in mine_t.per_sample], seed=seed)
        out.task, out.samples, out.answers, out.task_tokens = task, mine_t.samples, a.n, tt
        out.accuracy, out.accuracy_ci = a.value, a.pair()
        out.reference_accuracy, out.reference_accuracy_ci = b.value, b.pair()
        out.accuracy_change, out.accuracy_change_ci = ch.value, ch.pair()
        out.protocol = TEACHER_FORCED
    return out


def _median(xs: list[float]) -> float:
    s = sorted(xs)
    return s[len(s) // 2]
