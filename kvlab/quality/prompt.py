"""The prompt of a sample, split as kvpress's pipeline splits it: the context (prefilled and compressed), then the
question (read after the compressed context, positions continuing).

kvpress 0.5.5, kvpress/pipeline.py, `KVPressTextGenerationPipeline.preprocess`:
  * with a chat template, the template is applied (as text, `add_generation_prompt=True`, `enable_thinking=False`)
    to one user message, the context followed by a separator that cannot occur in it; the text before the
    separator is the context text, the text after it (the end of the user turn and the assistant's header, for
    SmolLM2 "<|im_end|>\\n<|im_start|>assistant\\n") is the question suffix;
  * without one, the context text is the tokenizer's BOS token (none: "") followed by the context, and the suffix
    is "\\n";
  * the question text is question + suffix + answer prefix;
  * both are encoded without special tokens (special tokens written in the text, as the template writes them, are
    still read as such).
kvpress splits at the separator's first occurrence; kvlab splits at its last, which differs only when the context
itself ends in '#' characters (kvpress then moves them into the suffix). kvpress truncates a context longer than
the tokenizer's `model_max_length`; kvlab builds the whole prompt and leaves the length check to the evaluation.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ..checks import need_choice, need_type
from ..errors import ParameterError

Protocol = Literal["question_agnostic", "question_aware"]
PROTOCOLS: tuple[str, ...] = ("question_agnostic", "question_aware")
PROTOCOL_HELP = {
    "question_agnostic": "the context alone is prefilled and compressed; the question, the template's suffix and the "
                         "answer prefix are read after it, uncompressed, positions continuing (kvpress's pipeline)",
    "question_aware": "the context followed by the question is prefilled and compressed; only the template's suffix "
                      "and the answer prefix are read after it (kvpress's evaluation with query_aware: its context "
                      "column + question column, question '')",
}


@dataclass(frozen=True)
class Prompt:
    """A sample's prompt in two parts, as text and as token ids."""
    protocol: str  # PROTOCOLS: which part the question is in
    context_text: str  # prefilled, then compressed: template's head + context (+ question when question-aware)
    question_text: str  # read after the compressed context: (question +) template's suffix + answer prefix
    context_ids: list[int]  # context_text encoded without special tokens
    question_ids: list[int]  # question_text encoded without special tokens


def template_parts(tokenizer, content: str) -> tuple[str, str]:
    """The text before and after `content` when the tokenizer's chat template wraps it as the one user message of a
    conversation, with the assistant's turn opened; without a chat template, (BOS token, "\\n")."""
    if getattr(tokenizer, "chat_template", None) is None:
        return (getattr(tokenizer, "bos_token", None) or "") + content, "\n"
    sep = "#" * (len(content) + 10)  # longer than any run of '#' in the content
    text = tokenizer.apply_chat_template([{"role": "user", "content": content + sep}], add_generation_prompt=True,
                                         tokenize=False, enable_thinking=False)
    need_type("the chat template's output", text, str, "a string")
    head, found, suffix = text.rpartition(sep)
    if not found:
        raise ParameterError("the tokenizer's chat template does not keep the user's message as written, so the "
                             "prompt cannot be split into context and question as kvpress splits it")
    return head, suffix


def prompt_texts(tokenizer, context: str, question: str, answer_prefix: str = "",
                 protocol: Protocol = "question_agnostic") -> tuple[str, str]:
    """(context text, question text) of a prompt under a protocol (see `PROTOCOL_HELP`):

    question_agnostic: context text = template head + context; question text = question + suffix + answer prefix.
    question_aware:    context text = template head + context + question; question text = suffix + answer prefix.
    The template head / suffix are `template_parts` of what is compressed; the question follows the context as
    written (no separator added: kvpress's evaluation concatenates the two columns).
    """
    need_choice("protocol", protocol, PROTOCOLS)
    for name, value in (("context", context), ("question", question), ("answer_prefix", answer_prefix)):
        need_type(name, value, str, "a string")
    if protocol == "question_aware":
        head, suffix = template_parts(tokenizer, context + question)
        return head, suffix + answer_prefix
    head, suffix = template_parts(tokenizer, context)
    return head, question + suffix + answer_prefix


def build_prompt(tokenizer, context: str, question: str, answer_prefix: str = "",
                 protocol: Protocol = "question_agnostic") -> Prompt:
    """The prompt of (context, question, answer prefix) under a protocol, as text and token ids."""
    ctx, q = prompt_texts(tokenizer, context, question, answer_prefix, protocol)
    return Prompt(protocol, ctx, q, list(tokenizer.encode(ctx, add_special_tokens=False)),
                  list(tokenizer.encode(q, add_special_tokens=False)))


def sample_prompt(tokenizer, sample, protocol: Protocol = "question_agnostic") -> Prompt:
    """`build_prompt` of a kvlab.quality.samples.Sample."""
    return build_prompt(tokenizer, sample.context, sample.question, sample.answer_prefix, protocol)
