"""kvlab: exact, measurable KV-cache memory."""
from .errors import ConfigError, KvlabError, ParameterError, UnknownFormatError, UnknownModelError
from .formats import Format, get_format, list_formats
from .models import ModelSpec, catalog_names, load_model
from .layout import Layout, build_layout, bytes_per_token
from .engines import Allocation, allocate
from . import families  # noqa: F401  (registers every model family in kvlab.registry before any lookup)
from .nb.record import record

__version__ = "0.1.0"
__all__ = ["ConfigError", "KvlabError", "ParameterError", "UnknownFormatError", "UnknownModelError", "Format",
           "get_format", "list_formats", "ModelSpec", "catalog_names", "load_model", "Layout", "build_layout",
           "bytes_per_token", "Allocation", "allocate", "record"]
