"""The library's import graph: no cycle, no import up a layer, algorithms apart from experiments.

The graph is read from the ``import`` statements of every file under ``lecture_lib/`` (those
inside functions too; relative ones resolved), as Python runs them: ``import X`` is an edge to
X; ``from X import name`` one to ``X.name`` when that is a module (Python imports it; X, its
parent, is imported before any module in it anyway), and one to X otherwise (the name is
defined in X). So a module that takes a name from its own package's ``__init__``, which imports
the module back, forms a cycle: siblings import each other (``from .sibling import name``,
``from . import sibling``), never their package.

Layers, bottom to top; a module imports its own layer and the ones below, never one above:

    0  tolerance, comm, models, metrics, progress, costmodel, dims
    1  collectives, bandwidth, mesh, runtime
    2  emulate
    3  data_parallel, zero, tensor_parallel, pipeline, context_parallel, expert_parallel,
       precision
    4  hybrid
    5  calibration, profiling, debugging, capstone
    6  figures, study, grading

``lecture_lib/__init__.py`` (the package itself, ``run`` re-exported) is in no layer: every
module's parent, it is imported before any of them anyway.

In the parallelism packages (layer 3), the algorithms never import the experiments, the
drawing or the emulation: a module that is not an experiment (``experiments.py``,
``*_experiments.py``, ``emulated.py``), the package's ``__init__`` among them (it runs
whenever any module of the package is imported), imports neither :mod:`lecture_lib.emulate`,
nor :mod:`lecture_lib.figures`, nor any experiment module; and importing a package does not
import matplotlib.
"""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

LIBRARY = Path(__file__).resolve().parents[1] / "lecture_lib"
ROOT_PACKAGE = "lecture_lib"

LAYERS = [
    ("tolerance", "comm", "models", "metrics", "observe", "progress", "costmodel", "dims"),
    ("collectives", "bandwidth", "mesh", "runtime"),
    ("emulate",),
    ("data_parallel", "zero", "tensor_parallel", "pipeline", "context_parallel",
     "expert_parallel", "precision"),
    ("hybrid",),
    ("calibration", "profiling", "debugging", "capstone"),
    ("figures", "study", "grading"),
]
LAYER = {name: number for number, names in enumerate(LAYERS) for name in names}
ALGORITHM_PACKAGES = LAYERS[3]


def module_name(path: Path, library: Path) -> str:
    """'lecture_lib.zero.sharded' for lecture_lib/zero/sharded.py; a package is its folder."""
    parts = list(path.relative_to(library.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported_modules(tree: ast.AST, package: str, modules) -> list[str]:
    """The modules the import statements of ``tree`` need (relative ones resolved against
    ``package``): X for ``import X``; for ``from X import name``, ``X.name`` when that is one
    of ``modules``, else X. A name that is no module is cut to its longest module."""
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            names += [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                      for a in node.names]
    found = []
    for name in names:
        while name not in modules and "." in name:
            name = name.rpartition(".")[0]
        if name in modules:
            found.append(name)
    return found


def import_graph(library: Path = LIBRARY) -> dict[str, set[str]]:
    """Module -> the library's modules it imports."""
    files = {module_name(p, library): p for p in sorted(library.rglob("*.py"))}
    graph = {}
    for module, path in files.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        needed = _imported_modules(ast.parse(path.read_text()), package, files)
        graph[module] = set(needed) - {module}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while not component or component[-1] != v:
                component.append(stack.pop())
                on_stack.discard(component[-1])
            if len(component) > 1:
                found.append(sorted(component))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10 * len(graph) + 100))
    try:
        for v in sorted(graph):
            if v not in index:
                visit(v)
    finally:
        sys.setrecursionlimit(limit)
    return sorted(found)


def layer(module: str) -> int | None:
    """The layer of a module of the library (by its top-level name); None for the package
    itself and for a name in no layer."""
    parts = module.split(".")
    return LAYER.get(parts[1]) if len(parts) > 1 else None


def unplaced(graph: dict[str, set[str]]) -> list[str]:
    """Top-level modules and packages of the library that are in no layer."""
    return sorted({m.split(".")[1] for m in graph if "." in m and layer(m) is None})


def upward_imports(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """Every (importer, imported) where the imported module sits in a higher layer."""
    return sorted((m, t) for m, targets in graph.items() for t in targets
                  if None not in (layer(m), layer(t)) and layer(t) > layer(m))


def is_experiment(module: str) -> bool:
    last = module.rpartition(".")[2]
    return last in ("experiments", "emulated") or last.endswith("_experiments")


def algorithm_imports(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """Every (algorithm module, import) where a parallelism package's non-experiment module
    imports the emulation, the drawing, or an experiment module."""
    banned = (f"{ROOT_PACKAGE}.emulate", f"{ROOT_PACKAGE}.figures")
    bad = []
    for m, targets in graph.items():
        parts = m.split(".")
        if len(parts) < 2 or parts[1] not in ALGORITHM_PACKAGES or is_experiment(m):
            continue
        bad += [(m, t) for t in targets
                if is_experiment(t) or any(t == b or t.startswith(b + ".") for b in banned)]
    return sorted(bad)


def test_every_module_has_a_layer():
    assert unplaced(import_graph()) == [], "add each to LAYERS (and to this file's docstring)"


def _listed(found) -> str:
    return "\n".join(" -> ".join(item) if isinstance(item, tuple) else ", ".join(item)
                     for item in found)


def test_no_cycle():
    found = cycles(import_graph())
    assert found == [], "modules that import each other:\n" + _listed(found)


def test_no_import_up_a_layer():
    found = upward_imports(import_graph())
    assert found == [], "imports up a layer:\n" + _listed(found)


def test_algorithms_import_no_experiment_drawing_or_emulation():
    found = algorithm_imports(import_graph())
    assert found == [], "algorithm modules importing experiments, drawing or emulation:\n" \
        + _listed(found)


def test_algorithm_packages_do_not_import_matplotlib():
    """Each parallelism package, imported in turn in a fresh process: the first one that
    brings matplotlib in is named (the ones after it are not checked then)."""
    script = ("import importlib, sys\n"
              f"for name in {list(ALGORITHM_PACKAGES)!r}:\n"
              "    importlib.import_module('lecture_lib.' + name)\n"
              "    if 'matplotlib' in sys.modules:\n"
              "        print(name)\n"
              "        break\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300, check=True)
    assert done.stdout.strip() == "", f"importing lecture_lib.{done.stdout.strip()} " \
                                      "imports matplotlib"


def _write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / ROOT_PACKAGE / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root / ROOT_PACKAGE


def test_the_checks_flag_a_small_bad_tree(tmp_path):
    """A small tree with each kind of fault: every check finds exactly its own."""
    library = _write(tmp_path, {
        "__init__.py": "",
        "comm.py": "def f():\n    from .hybrid import g\n",               # layer 0 -> 4, late
        "hybrid.py": "from lecture_lib import comm\n",
        "zero/__init__.py": "from .sharded import Optimizer\n",
        "zero/sharded.py": "from . import experiments\n",                  # an experiment
        "zero/experiments.py": "from .. import emulate\nfrom ..zero import Optimizer\n",
        "zero/gather.py": "import lecture_lib.emulate.clock\nfrom ..figures import draw\n",
        "emulate/__init__.py": "import lecture_lib.emulate.clock\n",
        "emulate/clock.py": "",
        "figures/__init__.py": "",
        "mystery.py": "",
    })
    graph = import_graph(library)
    assert graph["lecture_lib.comm"] == {"lecture_lib.hybrid"}
    assert graph["lecture_lib.hybrid"] == {"lecture_lib.comm"}
    assert graph["lecture_lib.zero.sharded"] == {"lecture_lib.zero.experiments"}
    assert graph["lecture_lib.zero.experiments"] == {"lecture_lib.emulate", "lecture_lib.zero"}
    assert graph["lecture_lib.emulate"] == {"lecture_lib.emulate.clock"}
    assert cycles(graph) == [["lecture_lib.comm", "lecture_lib.hybrid"],
                             ["lecture_lib.zero", "lecture_lib.zero.experiments",
                              "lecture_lib.zero.sharded"]]
    assert upward_imports(graph) == [("lecture_lib.comm", "lecture_lib.hybrid"),
                                     ("lecture_lib.zero.gather", "lecture_lib.figures")]
    assert algorithm_imports(graph) == [
        ("lecture_lib.zero.gather", "lecture_lib.emulate.clock"),
        ("lecture_lib.zero.gather", "lecture_lib.figures"),
        ("lecture_lib.zero.sharded", "lecture_lib.zero.experiments")]
    assert unplaced(graph) == ["mystery"]


def test_a_clean_tree_passes(tmp_path):
    library = _write(tmp_path, {
        "__init__.py": "from .runtime import run\n",
        "runtime/__init__.py": "from .launch import run\n",
        "runtime/launch.py": "from .. import comm\nfrom ..comm import rank\n",
        "comm.py": "",
        "zero/__init__.py": "from .sharded import Optimizer\n",
        "zero/sharded.py": "from ..comm import rank\n",
        "zero/experiments.py": "from .. import emulate\nfrom .sharded import Optimizer\n",
        "emulate/__init__.py": "",
    })
    graph = import_graph(library)
    assert (cycles(graph), upward_imports(graph), algorithm_imports(graph),
            unplaced(graph)) == ([], [], [], [])
