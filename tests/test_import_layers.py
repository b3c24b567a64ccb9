"""The ``cudabridge`` package's modules import each other without a circle, and no module imports
one of a higher layer (issue 25, item 5).

Read statically: each module under ``python/cudabridge`` is parsed with :mod:`ast`; nothing is
imported, so a circle is found whether or not it happens to break an import today.

What counts as an import of module B by module A (an edge A -> B):

* every ``import`` / ``from ... import`` statement of A that names B, relative or absolute; for
  ``from P import n``, B is the module ``P.n`` where there is one, else ``P``;
* and, for an import of ``P.Q.B``, the packages ``P.Q`` and ``P`` too (Python runs a package's
  ``__init__`` before any module in it), except the packages A itself is inside (already
  running when A is imported);
* of three kinds, told apart in every message:

  - ``module``: at A's module level (class bodies, ``try``, a plain ``if`` included): runs when A
    is imported;
  - ``typing``: under ``if TYPE_CHECKING:``: never runs, but A's annotations name B's types;
  - ``function``: inside a function of A: runs at the first call.

  (The review in issue 25 counted the same: its two-module circles are closed only by
  ``typing`` and ``function`` imports.)

The rules:

1. **No circle at import time**: the ``module`` edges alone have no cycle (one would make the
   order in which modules are first imported decide whether a name exists yet).
2. **No circle in the design**: all three kinds together have no cycle. An import moved into a
   function or under ``TYPE_CHECKING`` breaks a circle for the interpreter, not for the reader:
   the lower module still knows the higher one's names. A lower module that needs something of
   a higher one takes it as a parameter (typed by a ``Protocol`` of its own where it needs one),
   or the thing moves down to where both can import it.
3. **Layers**: :data:`LAYERS` lists the package's layers from the bottom up; a module may
   import modules of its own layer and of the layers below, never of one above (any kind of
   edge). Every module belongs to exactly one layer.

The only exceptions are the imports listed in :data:`PENDING`, each with its reason, and each
checked to be still there.

A failure names each circle (its modules and the edges between them, with file and line) or
each import of a higher layer.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

PACKAGE = "cudabridge"
PACKAGE_DIR = Path(__file__).resolve().parent.parent / "python" / PACKAGE

# The layers, bottom first (docs/architecture.md, "The layers"). An entry names a module, or a
# package with every module under it; the root package alone (its __init__, the public front
# that re-exports the service) is named exactly.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    # errors, the settings table, the mode enums' base: imported by everything
    ("foundation", ("cudabridge.errors", "cudabridge.modes", "cudabridge.config")),
    # the backends, their interface and its launch vocabulary (launch_config.py, params.py)
    ("device", ("cudabridge.device",)),
    # what the service keeps per GPU: the memory pool, the stream pool, Spark's GPU addresses
    ("GPU resources", ("cudabridge.memory", "cudabridge.stream_pool", "cudabridge.gpu_addresses")),
    # modules, kernels, globals, host kernels: what the registry launches; what acts for a task
    # takes the registry as a parameter (module_globals.Tasks)
    ("kernels", ("cudabridge.kernels",)),
    # task attempt -> GPU and stream, leases, launches, release
    ("tasks", ("cudabridge.task_registry",)),
    # memory pressure: waits registered where they happen, the breaker, admission; over the
    # registry's leases and the pools' out-of-memory hook
    ("memory pressure", ("cudabridge.pressure",)),
    # Python GPU libraries' allocations through the pools and the registry; the service installs
    # them (the allocators setting) and is reached through allocators.library_allocator.Service
    ("library allocators", ("cudabridge.allocators",)),
    # Python functions called for a task: its lease, stream and memory (the registry, the pools,
    # the CuPy plug-in's hand-over); reached through functions.function_calls.Service
    ("python functions", ("cudabridge.functions",)),
    ("service", ("cudabridge.service",)),
    # what drives the service: the JVM bridge's Python side, Spark's jars, the CLI
    ("fronts", ("cudabridge.jvm", "cudabridge.spark", "cudabridge.doctor", "cudabridge.demo",
                "cudabridge.__main__", "=cudabridge")),
]

KINDS = ("module", "typing", "function")

# Imports left to their file's owner, each (importing module, or a prefix ending in "*"; the
# module it names) with its reason in a comment. None now: the rules hold with no exception. An
# entry is deleted once its import is gone (test_pending_imports_are_still_there says when).
PENDING: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    kind: str        # one of KINDS
    path: Path
    line: int
    via: str = ""    # the module named, where ``target`` is a package run before it

    def __str__(self) -> str:
        via = f", running {self.target}'s __init__ for {self.via}" if self.via else ""
        return f"{self.source} -> {self.target} ({self.kind}, {self.path.relative_to(PACKAGE_DIR.parent.parent)}:{self.line}{via})"


def modules() -> dict[str, Path]:
    """Every module of the package: dotted name -> file (a package by its ``__init__.py``)."""
    out = {}
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        parts = path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST) -> list[tuple[ast.stmt, str]]:
    """Each import statement with its kind."""
    found: list[tuple[ast.stmt, str]] = []

    def walk(node: ast.AST, kind: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                found.append((child, kind))
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                walk(child, "typing" if kind == "typing" else "function")
            elif isinstance(child, ast.If) and _is_type_checking(child.test):
                for stmt in child.body:
                    walk(ast.Module(body=[stmt], type_ignores=[]), "typing")
                for stmt in child.orelse:
                    walk(ast.Module(body=[stmt], type_ignores=[]), kind)
            else:
                walk(child, kind)

    walk(tree, "module")
    return found


def _targets(stmt: ast.Import | ast.ImportFrom, source: str, is_package: bool, known: set[str]) -> list[str]:
    """The package's modules a statement names."""
    if isinstance(stmt, ast.Import):
        names = [a.name for a in stmt.names]
        out = []
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name:
                out.append(name)
        return out
    if stmt.level:
        base = source.split(".") if is_package else source.split(".")[:-1]
        base = base[:len(base) - (stmt.level - 1)]
        base_name = ".".join(base + ([stmt.module] if stmt.module else []))
    else:
        base_name = stmt.module or ""
    if base_name != PACKAGE and not base_name.startswith(PACKAGE + "."):
        return []
    return [f"{base_name}.{a.name}" if f"{base_name}.{a.name}" in known else base_name for a in stmt.names]


def _matches(e: Edge, entry: tuple[str, str]) -> bool:
    source, target = entry
    named = e.via or e.target     # an entry covers the packages its import runs too
    return named == target and (e.source == source or source.endswith("*") and e.source.startswith(source[:-1]))


def _pending(e: Edge) -> bool:
    return any(_matches(e, entry) for entry in PENDING)


def edges(pending: bool = False) -> list[Edge]:
    """Every edge of the package's import graph; those of :data:`PENDING` only with ``pending``."""
    mods = modules()
    known = set(mods)
    out: list[Edge] = []
    for source, path in mods.items():
        is_package = path.name == "__init__.py"
        tree = ast.parse(path.read_text(), str(path))
        inside = {".".join(source.split(".")[:i]) for i in range(1, source.count(".") + 2)}
        if not is_package:
            inside.discard(source)
        for stmt, kind in _imports(tree):
            for target in _targets(stmt, source, is_package, known):
                if target != source:
                    out.append(Edge(source, target, kind, path, stmt.lineno))
                parts = target.split(".")
                for i in range(1, len(parts)):
                    package = ".".join(parts[:i])
                    if package not in inside and package != source:
                        out.append(Edge(source, package, kind, path, stmt.lineno, via=target))
    return out if pending else [e for e in out if not _pending(e)]


def layer_of(module: str) -> int | None:
    best, at = -1, None
    for i, (_, entries) in enumerate(LAYERS):
        for entry in entries:
            if entry.startswith("="):
                if module == entry[1:]:
                    return i
            elif (module == entry or module.startswith(entry + ".")) and len(entry) > best:
                best, at = len(entry), i
    return at


def circles(graph_edges: list[Edge]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), largest first."""
    succ: dict[str, set[str]] = {}
    for e in graph_edges:
        succ.setdefault(e.source, set()).add(e.target)
        succ.setdefault(e.target, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:   # recursive: the package has about 100 modules
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(succ[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(succ):
        if v not in index:
            visit(v)
    return sorted(found, key=lambda c: (-len(c), c))


def _describe(components: list[list[str]], graph_edges: list[Edge]) -> str:
    lines = []
    for component in components:
        members = set(component)
        lines.append(f"a circle of {len(component)} modules: {', '.join(component)}")
        inner = sorted({str(e): e for e in graph_edges if e.source in members and e.target in members}.values(),
                       key=lambda e: (e.source, e.line, e.target))
        lines += [f"    {e}" for e in inner]
    return "\n".join(lines)


def test_the_package_is_read():
    mods = modules()
    assert "cudabridge.service" in mods and "cudabridge.kernels" in mods and len(mods) > 50
    kinds = {e.kind for e in edges()}
    assert kinds == set(KINDS), kinds


def test_no_import_circle_at_import_time():
    at_import = [e for e in edges() if e.kind == "module"]
    found = circles(at_import)
    assert not found, "module-level imports in a circle:\n" + _describe(found, at_import)


def test_no_import_circle_in_the_design():
    all_edges = edges()
    found = circles(all_edges)
    assert not found, ("imports in a circle (module-level, TYPE_CHECKING and function-level imports "
                       "together):\n" + _describe(found, all_edges))


def test_every_module_has_a_layer():
    missing = sorted(m for m in modules() if layer_of(m) is None)
    assert not missing, f"modules in no layer of LAYERS (tests/test_import_layers.py): {missing}"


def test_pending_imports_are_still_there():
    every = edges(pending=True)
    gone = [entry for entry in PENDING if not any(_matches(e, entry) for e in every)]
    assert not gone, f"no longer imported: delete {gone} from PENDING in tests/test_import_layers.py"


def test_no_module_imports_a_higher_layer():
    upward = []
    for e in edges():
        lo, hi = layer_of(e.source), layer_of(e.target)
        if lo is not None and hi is not None and hi > lo:
            upward.append(f"    {e}: {LAYERS[lo][0]} imports {LAYERS[hi][0]}")
    order = " < ".join(name for name, _ in LAYERS)
    assert not upward, f"imports of a higher layer (the layers: {order}):\n" + "\n".join(sorted(set(upward)))
