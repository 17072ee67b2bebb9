"""kvlab.train's data and tasks: the stdlib corpus, the byte tokenizer, task generators and the scorer."""
import random

import pytest
import torch

from kvlab.errors import ParameterError
from kvlab.toy import data as D
from kvlab.toy import tasks as T


@pytest.fixture(scope="module")
def corpus():
    return D.load_corpus()


def test_corpus_is_read_from_this_interpreter(corpus):
    import platform
    assert corpus.python == platform.python_version()
    assert corpus.train_docs > 300 and corpus.heldout_docs > 20
    assert len(corpus.train) > 1_000_000 and len(corpus.heldout) > 100_000
    r = corpus.record()
    assert r["sha256"] == corpus.sha256 and len(r["sha256"]) == 64


def test_split_is_by_document_seeded_and_stable(corpus):
    again = D.load_corpus.__wrapped__()  # a fresh read, not the cached one
    assert again.sha256 == corpus.sha256 and again.names == corpus.names
    other = D.load_corpus(seed=1)
    assert other.sha256 == corpus.sha256  # same text
    assert other.names != corpus.names  # another held-out set
    # a held-out document's text is not in the training split
    code = {d.name: d.text for d in D.code_documents()}
    text = max((code[n] for n in corpus.names if n in code), key=len)  # the longest held-out file
    assert text.encode() in corpus.heldout and text.encode() not in corpus.train


def test_docs_hold_reference_text_and_builtin_docstrings():
    docs = {d.name: d.text for d in D.docs_documents()}
    assert any(n.startswith("docs:topic:") for n in docs)
    math_doc = docs.get("docs:module:math") or docs.get("docs:module:sys")
    assert math_doc is not None and " at 0x" not in math_doc


def test_windows_are_seeded(corpus):
    a = corpus.windows("heldout", 4, 64, seed=3)
    assert a.shape == (4, 64) and a.dtype == torch.long and int(a.max()) < 256
    assert torch.equal(a, corpus.windows("heldout", 4, 64, seed=3))
    assert not torch.equal(a, corpus.windows("heldout", 4, 64, seed=4))
    with pytest.raises(ParameterError):
        corpus.windows("test", 1, 64, seed=0)


@pytest.mark.parametrize("text", ["plain ascii", "héllo wörld ☃ \t\n", "\x00\x7f bytes", ""])
def test_byte_tokenizer_round_trip(text, tmp_path):
    tok = D.ByteTokenizer()
    ids = tok.encode(text)
    assert ids == list(text.encode()) and tok.decode(ids) == text
    D.save_tokenizer(tmp_path)
    from transformers import AutoTokenizer
    hf = AutoTokenizer.from_pretrained(tmp_path)
    assert len(hf) == 256
    assert hf(text)["input_ids"] == ids and hf.decode(ids) == text


# --- tasks ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(T.TASKS))
@pytest.mark.parametrize("length", [128, 512, 1024])
def test_generator_determinism_and_length(name, length):
    gen = T.TASKS[name].generate
    a, b, c = gen(7, length), gen(7, length), gen(8, length)
    assert a == b and a != c
    ids, labels = T.render(a)
    assert ids.shape == labels.shape == (length,)
    assert all(ch.isascii() for ch in a.text)
    assert a.answers and all(ans.isdigit() for ans in a.answers)
    assert int((labels != T.IGNORE).sum()) == sum(map(len, a.answers))


def test_answers_are_recoverable_from_context():
    """The answer is in the text before the question (the task is solvable, not noise)."""
    s = T.mqar(1, 256)
    ctx = s.text.split("\n")[0]
    pairs = dict((p[0], p[1]) for p in ctx.split())
    asked = [(q[0], q[1]) for q in s.text.split("\n")[1].split()]
    assert [v for _, v in asked] == s.answers and all(pairs[k] == v for k, v in asked)
    n = T.needle(2, 512, needles=3)
    key = n.text.split("What is the code of ")[1][:4]
    assert f"The code of {key} is {n.answers[0]}." in n.text
    r = T.recall(4, 256)
    ctx = r.text.split("\n")[0].split()
    assert len({p[:2] for p in ctx}) == len(ctx)  # keys distinct within the sample
    pairs = {p[:2]: p[2:] for p in ctx}
    assert [pairs[q[:2]] for q in r.text.split("\n")[1].split()] == r.answers
    for depth in (0.0, 0.5, 1.0):
        h = T.niah(5, 1024, depth=depth)
        key = h.text.split("\nRecall ")[1][:4]
        fact = f"The code {key}={h.answers[0]}. "
        assert fact in h.text and h == T.niah(5, 1024, depth=depth)
        at = h.text.index(fact) / len(h.text)
        assert abs(at - depth) < 0.15, (depth, at)
    facts = [f.split("=")[0][-4:] + f.split("=")[1][:4] for f in h.text.split("The code ")[1:]]
    assert all(len({f[i] for f in facts}) == len(facts) for i in range(8))  # differ at every position
    v = T.vartrack(3, 512, hops=2, chains=2)
    env = {}
    for line in v.text.splitlines():
        parts = line.split(" = ")
        if len(parts) == 2 and parts[0].isalpha() and (parts[1].isdigit() or parts[1] in env):
            env[parts[0]] = env.get(parts[1], parts[1])
    asked = v.text.rsplit("print(", 1)[1].split(")")[0]
    assert env[asked] == v.answers[0]


def test_bad_task_arguments():
    with pytest.raises(ParameterError, match="mqar"):
        T.mqar(0, 64, pairs=20)
    with pytest.raises(ParameterError, match="needle"):
        T.needle(0, 60, needles=3)
    with pytest.raises(ParameterError, match="task"):
        T.get_task("copy")


def _oracle_logits(labels):
    """Logits that put each next answer token first (and byte 0 elsewhere)."""
    nxt = torch.roll(labels, -1, dims=1).clamp_min(0)
    return torch.nn.functional.one_hot(nxt, 256).float()


@pytest.mark.parametrize("name", list(T.TASKS))
def test_oracle_scores_one_and_guesser_scores_chance(name):
    task = T.get_task(name)
    ids, labels = T.batch(task.samples(0, 200, 256))
    assert T.score(_oracle_logits(labels), labels) == 1.0
    # a guesser uniform over the answer alphabet
    rng = random.Random(0)
    guess = torch.tensor([[ord(rng.choice(task.answer_alphabet)) for _ in range(labels.shape[1])]
                          for _ in range(labels.shape[0])])
    right, n = T.score_predictions(guess, labels)
    p = task.chance()
    sd = (p * (1 - p) / n) ** 0.5
    assert abs(right / n - p) < 4 * sd + 1e-9, (right, n, p)


def test_score_counts_whole_answers():
    labels = torch.full((1, 8), T.IGNORE)
    labels[0, 2:4] = torch.tensor([ord("1"), ord("2")])  # one two-token answer
    labels[0, 6] = ord("3")  # a one-token answer
    pred = torch.zeros(1, 8, dtype=torch.long)
    pred[0, 1], pred[0, 2], pred[0, 5] = ord("1"), ord("9"), ord("3")  # second token of the first answer wrong
    assert T.score_predictions(pred, labels) == (1, 2)
    assert T.answer_runs(labels).tolist() == [[-1, -1, 0, 0, -1, -1, 1, -1]]

