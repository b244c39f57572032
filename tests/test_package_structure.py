"""The package's shape, measured on the tree: no import cycle among the modules of tvmfuse and
schedules, no source file over 400 lines and no function over 80 (issue 32's "done when").

The import graph is read with ast, not by importing: every `import` and `from ... import` of a
module, at module level and inside functions alike (an import inside a function still ties the two
modules together; it only hides the tie). Relative imports are resolved against the importing
module. `from X import y` is an edge to X.y when X.y is a module of ours, else to X. Importing a
submodule adds no edge to its parent package: a package's __init__ re-exports its submodules, and
counting it would make every package a cycle with its own children."""
from __future__ import annotations

import ast
import os

import networkx as nx
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("tvmfuse", "schedules")
SIZED = ("tvmfuse", "schedules", "scripts")
MAX_FILE_LINES = 400
MAX_FUNCTION_LINES = 80


def _py_files(folder):
    for dirpath, dirnames, filenames in os.walk(os.path.join(ROOT, folder)):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for f in sorted(filenames):
            if f.endswith(".py"):
                yield os.path.join(dirpath, f)


def _module_name(path) -> str:
    rel = os.path.relpath(path, ROOT)[:-3].split(os.sep)
    return ".".join(rel[:-1] if rel[-1] == "__init__" else rel)


def modules() -> dict[str, str]:
    """{dotted module name: path} of every module of the packages."""
    return {_module_name(p): p for pkg in PACKAGES for p in _py_files(pkg)}


def _resolve(importer: str, is_package: bool, level: int, module: str | None) -> str:
    """The absolute name `from <level dots><module> import ...` refers to inside `importer`."""
    if level == 0:
        return module or ""
    parts = importer.split(".")
    base = parts if is_package else parts[:-1]
    base = base[:len(base) - (level - 1)]
    return ".".join(base + ([module] if module else []))


def imports_of(name: str, path: str, known) -> set[str]:
    """The modules of ours that module `name` imports anywhere in its body."""
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    is_package = os.path.basename(path) == "__init__.py"
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(name, is_package, node.level, node.module)
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in known:  # `import tvmfuse.fusion.api as x` of an attribute path
                t = t.rpartition(".")[0]
            if t and t != name:
                out.add(t)
    return out


def import_graph() -> nx.DiGraph:
    known = modules()
    g = nx.DiGraph()
    g.add_nodes_from(known)
    for name, path in known.items():
        g.add_edges_from((name, t) for t in imports_of(name, path, known))
    return g


def test_the_import_graph_is_read():
    """The reader sees what is there: a module-level import, one inside a function, a relative one
    and a `from package import submodule`."""
    g = import_graph()
    assert ("tvmfuse.build", "tvmfuse.pipeline") in g.edges  # from . import config, debug, pipeline
    assert ("tvmfuse.build", "tvmfuse.passes.shape_buckets") in g.edges  # inside build()
    assert ("tvmfuse.loader", "tvmfuse.zoo.models") in g.edges  # from .zoo import models
    assert ("tvmfuse.build", "tvmfuse") not in g.edges  # `from . import x` is an edge to x alone


def test_the_loader_sits_above_the_zoo_and_the_models():
    """load_model imports the zoo and the models; neither imports it (nor the frontends' package)."""
    g = import_graph()
    assert {"tvmfuse.zoo.models", "tvmfuse.zoo.workloads"} <= set(g.successors("tvmfuse.loader"))
    for low in ("tvmfuse.zoo.models", "tvmfuse.zoo.workloads", "tvmfuse.zoo.workload"):
        assert not {"tvmfuse.loader", "tvmfuse.frontends"} & nx.descendants(g, low), low


def test_no_import_cycles():
    g = import_graph()
    cycles = sorted(sorted(c) for c in nx.strongly_connected_components(g) if len(c) > 1)
    assert not cycles, "import cycles (each: the modules that import one another):\n" + "\n".join(
        " <-> ".join(c) for c in cycles)


def _sized_files():
    return [p for folder in SIZED for p in _py_files(folder)]


def test_no_file_over_the_limit():
    over = {}
    for p in _sized_files():
        with open(p) as f:
            n = sum(1 for _ in f)
        if n > MAX_FILE_LINES:
            over[os.path.relpath(p, ROOT)] = n
    assert not over, f"files over {MAX_FILE_LINES} lines: {over}"


def test_no_function_over_the_limit():
    over = {}
    for p in _sized_files():
        with open(p) as f:
            tree = ast.parse(f.read(), p)
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    over[f"{os.path.relpath(p, ROOT)}:{node.lineno} {node.name}"] = n
    assert not over, f"functions over {MAX_FUNCTION_LINES} lines: {over}"


@pytest.mark.parametrize("source,expected", [
    ("from .debug import Session", {"tvmfuse.debug"}),
    ("from . import debug, pipeline", {"tvmfuse.debug", "tvmfuse.pipeline"}),
    ("def f():\n    from .fusion.api import fuse", {"tvmfuse.fusion.api"}),
    ("import tvmfuse.fusion.api", {"tvmfuse.fusion.api"}),
    ("from schedules.targets import CUDA", {"schedules.targets"}),
    ("import numpy", set()),
])
def test_imports_of(tmp_path, source, expected):
    path = tmp_path / "m.py"
    path.write_text(source + "\n")
    known = {"tvmfuse", "tvmfuse.m", "tvmfuse.debug", "tvmfuse.pipeline", "tvmfuse.passes",
             "tvmfuse.fusion.api", "schedules", "schedules.targets"}
    assert imports_of("tvmfuse.m", str(path), known) == expected


def test_every_import_of_ours_names_a_module_that_exists():
    """`from ..runtime.roofline import x` after a move must name a module that is there: the cycle
    check above maps an unknown name to its nearest parent, so it cannot see a stale import."""
    known = modules()
    stale = []
    for name, path in known.items():
        with open(path) as f:
            tree = ast.parse(f.read(), path)
        is_package = os.path.basename(path) == "__init__.py"
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                base = _resolve(name, is_package, node.level, node.module)
            elif isinstance(node, ast.Import):
                base = next((a.name for a in node.names if a.name.split(".")[0] in PACKAGES), None)
            else:
                continue
            if base and base.split(".")[0] in PACKAGES and base not in known:
                stale.append(f"{path}:{node.lineno} {base}")
    assert not stale, "imports of modules that do not exist:\n" + "\n".join(stale)
