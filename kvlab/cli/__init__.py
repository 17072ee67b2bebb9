"""The `kvlab` command: one module per command group, each with `register(subparsers)`.

Bad arguments print one line naming the problem and exit 2.
"""
from __future__ import annotations

import importlib
import sys

from ..errors import KvlabError
from .args import ArgError, Parser

COMMANDS = ["core", "run", "sweep", "measure", "serving", "steptime", "servesim", "sim", "analyze", "traces",
            "pretrained", "train", "eval"]  # modules of this package, in help order


def build_parser() -> Parser:
    p = Parser(prog="kvlab", description="KV-cache memory: exact bytes, quantizers, measurement, capacity.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=Parser)
    for mod in COMMANDS:
        importlib.import_module(f"{__name__}.{mod}").register(sub)
    return p


# Third-party loggers whose import-time warnings are not the user's business: torchao's note that its CUDA kernels
# do not load on this machine, torch's deprecation of pytree-registered Enums (torchao registers some).
QUIET_LOGGERS = ("torchao", "torch.utils._pytree")


def main(argv=None) -> int:
    import logging
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
    try:
        args = build_parser().parse_args(argv)
        return args.func(args)
    except ArgError as e:
        print(f"kvlab: error: {e}", file=sys.stderr)
        return 2
    except KvlabError as e:
        print(f"kvlab: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0
    except KeyboardInterrupt:  # Ctrl-C outside a batch run (which reports its own partial folder)
        print("kvlab: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
