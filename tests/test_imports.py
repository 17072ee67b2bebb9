"""kvlab's import graph has no circle, and kvlab/ keeps few modules of its own (issue 19).

The graph is read with `ast` from every kvlab/**/*.py; nothing is imported. Every import statement counts, wherever
it stands (module level, inside a function, under a condition), and so does `importlib.import_module("kvlab.x")`
with a literal name (a name built at run time, as kvlab.cli builds its command modules', cannot be read). An import
is an edge to:
  import kvlab.a.b               -> kvlab.a.b (a package: its __init__.py)
  from kvlab.a import b          -> kvlab.a.b when b is a submodule, else kvlab.a (b is defined in its __init__.py)
  from . import x (in package p) -> p.x when x is a submodule, else p's __init__.py
  from .. import name            -> the parent package's __init__.py, where the name is defined
The parent packages Python runs on the way to a module are not edges (else every module would reach
kvlab/__init__.py, and through it everything): a package's __init__.py counts through its own import lines.
"""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "kvlab"
MAX_FLAT = 11  # modules directly in kvlab/ besides __init__.py and __main__.py
# The floors, lowest first: a module may import its own package and the packages below its own, never one above
# ("core" is the flat modules in kvlab/: errors, checks, formats, models, layout, engines, hardware, ...). Entry points
# (kvlab/__init__.py, which re-exports the API, and every __main__.py) may import anything.
# "toy" holds what the checkpoints trained here are (their corpus, tasks, sizes and the V4.1-like model), below both
# their evaluation (hf) and their training (train).
FLOORS = ["core", "stats", "quant", "cache", "attention", "families", "sim", "toy", "hf", "quality", "train", "serving",
          "report", "nb", "cli"]
KNOWN_UPWARD: set[tuple[str, str]] = set()  # (floor, floor above it) pairs still allowed: none


def module_names(root: Path = ROOT) -> dict[str, Path]:
    """Dotted name -> file of every module under kvlab/ (a package is named by its __init__.py)."""
    mods = {}
    for path in sorted(root.rglob("*.py")):
        parts = (root.name,) + path.relative_to(root).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = path
    return mods


def _package(name: str, path: Path) -> str:
    """The package a module's relative imports start from: itself for an __init__.py, else its parent."""
    return name if path.name == "__init__.py" else name.rpartition(".")[0]


def _base(name: str, path: Path, module: str | None, level: int) -> str:
    """The absolute module a `from ... import` names (relative levels resolved)."""
    if level == 0:
        return module or ""
    pkg = _package(name, path).split(".")
    pkg = pkg[:len(pkg) - (level - 1)]
    return ".".join(pkg + ([module] if module else []))


def imports_of(name: str, path: Path, mods: dict[str, Path]) -> set[str]:
    """The kvlab modules that module `name` imports, anywhere in its text."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = _base(name, path, node.module, node.level)
            for a in node.names:
                sub = f"{base}.{a.name}"
                out.add(sub if sub in mods else base)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr == "import_module" and node.args
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            out.add(node.args[0].value)
    return {m for m in out if m in mods}


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Module -> the kvlab modules it imports."""
    mods = module_names(root)
    return {name: imports_of(name, path, mods) for name, path in mods.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components that hold a circle (Tarjan), each as its sorted modules."""
    index, low, stack, on, comps = {}, {}, [], set(), []

    def visit(v):  # recursion depth is bounded by the module count (a few hundred)
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1 or v in graph[v]:
                comps.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return comps


def circle(graph: dict[str, set[str]], comp: set[str]) -> list[str]:
    """One shortest circle through the first module of a strongly connected component (breadth first)."""
    start = min(comp)
    prev, frontier = {start: None}, [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & comp):
                if w == start:
                    path = [v]
                    while prev[path[-1]] is not None:
                        path.append(prev[path[-1]])
                    return path[::-1] + [start]
                if w not in prev:
                    prev[w] = v
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"{start} is in no circle")  # unreachable for a strongly connected component


def test_graph_sees_function_level_and_relative_imports():
    g = import_graph()
    assert "kvlab.errors" in g["kvlab.checks"]  # from .errors import ... (module level)
    assert "kvlab.cli.args" in g["kvlab.cli"]  # from .args import ... in a package's __init__.py
    assert "kvlab.families.dense" in g["kvlab.families"]  # from . import dense: the submodule
    assert "kvlab.sim.tiering" in g["kvlab.report.claims"]  # from ..sim.tiering import ... inside a function
    assert "kvlab.toy.v41" in g["kvlab.hf.evaluate"]  # from ..toy import v41 inside a function
    assert g["kvlab.errors"] == set()


def test_graph_sees_import_module_with_a_literal_name(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("import importlib\n\ndef load():\n    return importlib.import_module('kvlab.errors')\n")
    assert imports_of("kvlab.m", f, module_names()) == {"kvlab.errors"}


def test_cycle_finder_reports_each_circle():
    g = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"d"}, "e": {"a"}}
    assert cycles(g) == [["a", "b", "c"], ["d"]]
    assert circle(g, {"a", "b", "c"}) == ["a", "b", "c", "a"] and circle(g, {"d"}) == ["d", "d"]


def test_no_import_cycle():
    g = import_graph()
    found = cycles(g)
    assert not found, "import circles in kvlab:\n" + "\n".join(
        f"  {len(c)} modules ({', '.join(c)}), e.g. {' -> '.join(circle(g, set(c)))}" for c in found)


def test_lower_modules_find_the_families_without_importing_them():
    """kvlab.models and kvlab.layout look families up in kvlab.registry; importing kvlab fills it (a fresh
    interpreter, so no other test has imported kvlab.families first)."""
    code = ("import sys; from kvlab.layout import build_layout; "
            "print(build_layout('qwen3-8b').bytes_per_token, 'kvlab.families' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=ROOT.parent).stdout.split()
    assert out == ["147456", "True"]


def floor_of(module: str) -> str:
    """The floor (a FLOORS entry) of a dotted kvlab module name (the package `kvlab` itself: core, its API)."""
    part = module.split(".")[1] if "." in module else ""
    return part if part and (ROOT / part).is_dir() else "core"


def test_no_module_imports_a_floor_above_its_own():
    g = import_graph()
    entry = {m for m, p in module_names().items() if p.name == "__main__.py" or m == "kvlab"}
    packages = {floor_of(m) for m in g if m not in entry}
    assert packages <= set(FLOORS), f"packages without a floor: {sorted(packages - set(FLOORS))}"
    up = sorted(f"{a} -> {b}" for a, bs in g.items() if a not in entry for b in bs
                if FLOORS.index(floor_of(b)) > FLOORS.index(floor_of(a))
                and (floor_of(a), floor_of(b)) not in KNOWN_UPWARD)
    assert not up, "imports that run upward:\n  " + "\n  ".join(up)


def test_few_flat_modules():
    flat = sorted(p.name for p in ROOT.glob("*.py") if p.name not in ("__init__.py", "__main__.py"))
    assert len(flat) <= MAX_FLAT, f"{len(flat)} flat modules in kvlab/ (at most {MAX_FLAT}): {', '.join(flat)}"
