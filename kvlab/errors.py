"""Exceptions: every bad input raises one of these, with a message that names the problem."""


class KvlabError(ValueError):
    """Base class: bad input to kvlab (the CLI prints the message and exits 2)."""


class UnknownModelError(KvlabError):
    """A catalog name that is not in data/models/ and is not a path to a config.json."""


class ConfigError(KvlabError):
    """A config.json that is malformed, incomplete, or of an architecture kvlab cannot lay out."""


class UnknownFormatError(KvlabError):
    """A number-format name that the formats table does not know."""


class ParameterError(KvlabError):
    """A bad parameter value (negative token count, unknown layout, ...)."""


class NoEngineLayout(ParameterError):
    """A model family with no published layout for a scheme or engine (V4.1-Flash under vLLM's paging, say):
    a caller that can count the model's own storage instead may catch this one and say so."""


class WrongTypeError(ParameterError, TypeError):
    """An argument of the wrong type (a list where a tensor belongs, a string where a number does); a TypeError
    too, so `except TypeError` still catches it."""


class ShapeError(KvlabError):
    """Tensors whose shapes do not fit together, or do not fit the cache they are written to."""


class CacheFormatError(KvlabError):
    """A cache (KV store) in a different number format or width than the caller expects."""


class SampleError(ParameterError):
    """An evaluation sample kvlab cannot use, or a task file (JSONL of samples) that cannot be read: a missing
    column, an empty answer, a wrong type, a file that is not JSONL; the message names the file, the line and the
    field."""
