"""Run every benchmarks/bench_*.py module's main() in turn and print its report."""
import importlib
import pkgutil
import sys
from pathlib import Path


def main() -> int:
    names = sorted(m.name for m in pkgutil.iter_modules([str(Path(__file__).parent)]) if m.name.startswith("bench_"))
    only = sys.argv[1:]
    if not names:
        print("no benchmarks yet")
    for n in names:
        if only and not any(o in n for o in only):
            continue
        print(f"== {n}")
        importlib.import_module(f"benchmarks.{n}").main()
    return 0


if __name__ == "__main__":
    sys.exit(main())
