"""The layering contract of ``src/knng``, checked statically with :mod:`ast`.

Packages depend downwards only, in this order (lowest first)::

    leaf helpers (_units) < io < _inputs < results < metrics < select < engine
        < distributed < api < cli

Every ``.py`` file under ``src/knng`` is parsed; every import of a knng module is collected,
at module level and inside functions, ``import x`` and ``from x import y``, relative imports
resolved. The rules:

(a) no module imports a module of a higher layer;
(b) no module imports an underscore-prefixed name from another knng module (importing a
    private *module*, ``from knng import _inputs`` or ``import knng._inputs``, is fine;
    ``from knng._inputs import _wrap_numpy`` is not);
(c) no import cycle between modules, counting every import: at module level, inside
    functions and under ``if TYPE_CHECKING:`` (an import deferred into a function hides a
    cycle, it does not remove it: the two modules still need each other). Importing
    ``knng.a.b`` also runs ``knng/a/__init__.py``; those implicit parent-package edges are
    left out, as the package's own ``__init__`` is what imports its submodules.

Rules (a) and (b) apply to every import, function-level and ``TYPE_CHECKING`` ones included.
Two more rules hold inside the package:

(f) no module reaches a private name of a module of another package by attribute
    (``from knng.engine import graph`` then ``graph._own_parts``, from ``knng.api``);
(g) inside the engine, parts (modules directly in ``knng/engine``, and subpackages) depend
    downwards in the order stated by :data:`ENGINE_ORDER`, and a subpackage's modules in the
    order of :data:`SUBPACKAGE_ORDER` (every import counts);
(h) the engine's subpackages (the kernel backend ``knng.engine.kernels``, the stores, the graph,
    the searches)
    are doors: every other knng module imports a package's exported names, never its modules
    (:data:`ENGINE_DOORS`).

A failure names the file, line and rule of every violation.

The command line is the package ``knng.cli``, one module per job, all in the top layer. Two more
rules keep its start-up cheap and the benchmarks outside the package honest:

(d) the modules that build the parser and dispatch (``knng.cli``, ``.entry``, ``.parser``,
    ``.texts``, ``.choices``, ``.argtypes``, ``.errors``) import, at module level, nothing that
    imports torch, scikit-learn or SciPy (``knng --help`` must not pay for them);
(e) ``bench/`` (the benchmark scripts, outside the installed package) imports no private knng
    name and no private knng module (an underscore in any part of the name); its k-selection
    harness, ``bench/select_harness.py``, imports only the names that ``knng``, ``knng.io`` and
    ``knng.select`` export in ``__all__``.

One rule is about the tests themselves:

(i) ``tests/`` mirrors the packages: every folder in it is named after a package of ``src/knng``
    (``tests/io``, ``tests/select``, ``tests/engine``, ``tests/distributed``, ``tests/cli``).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
PACKAGE = SRC / "knng"
BENCH = ROOT / "bench"

#: The layers, lowest first. A module may import only from its own layer or lower ones.
LAYERS: tuple[str, ...] = (
    "leaf", "io", "_inputs", "results", "metrics", "select", "engine", "distributed", "api", "cli",
)
RANK = {name: i for i, name in enumerate(LAYERS)}

#: Modules whose layer is not the one their name suggests, keyed by the first component after
#: ``knng`` ("" is the top-level package ``knng/__init__.py``). Every other module is in the
#: layer named by that first component (``knng.engine.plan`` → "engine").
PLACED: dict[str, str] = {
    "_units": "leaf",        # byte-size parsing, imports nothing of knng
    "_version": "leaf",      # the version string, named by checkpoint fingerprints in every layer
    "_interrupts": "leaf",   # SIGINT/SIGTERM as one exception: the command line and the launcher
    "_options": "leaf",      # the engine's options (knng.options / knng.get_options), read by every layer
    "_cuda": "leaf",         # compiling and launching CUDA C kernels through CuPy: select and the engine
    "results": "results",    # plain result classes: usable by every layer above _inputs
    "arguments": "engine",   # argument checks shared by api and distributed (imports select)
    "reports": "engine",     # last-report holder and report_as_dict, shared by api and distributed
    "estimators": "api",     # scikit-learn front ends over knng.search / knng.graph
    "manifold": "api",       # diffusion maps (DiffusionMap) over knng.graph / knng.search
    "": "api",               # the top-level package re-exports the public API (see EXEMPT)
    "cli": "cli",            # the package knng.cli, every module of it
    "demo": "cli",           # `knng demo`
    "demo_embed": "cli",     # `knng demo --embed`
    "plotting": "cli",       # embedding scatter plots of `knng embed` and the demo
    "__main__": "cli",       # `python -m knng`
}

#: The engine's parts, lowest tier first (rule (g)): each imports only parts of lower tiers. A
#: part is a module directly in ``knng/engine`` or a subpackage (all of its modules).
ENGINE_ORDER: tuple[tuple[str, ...], ...] = (
    ("stages",),                              # the pipeline's stage counters: read by every step
    ("kernels",),                             # the kernel backend: what runs here, launchers, kernels
    ("exact", "screen"),                      # exact values; the screen of a block
    ("duplicates", "thresholds"),             # folding identical rows; seeds and thresholds
    ("plan",),                                # the planner
    ("checkpoint", "store"),                  # checkpoints; the candidate stores and their homes
    ("common",),                              # the prepared corpus, devices, reports
    ("search",),                              # the search
    ("graph",),                               # the graph (by blocks, or by rows: a search)
)

#: The order inside each engine subpackage, lowest tier first (rule (g) again; the package's
#: ``__init__`` may import any of its modules).
SUBPACKAGE_ORDER: dict[str, tuple[tuple[str, ...], ...]] = {
    "kernels": (
        ("cuda_screen", "triton_pairs", "triton_preparation", "triton_radius", "triton_rows", "triton_screen",
         "triton_unfold", "compiling"),       # the kernels themselves (CUDA C, Triton); which are compiled
        ("capabilities",),                    # a device's facts
        ("pairs", "preparation", "radius", "row_kth", "row_order", "unfold"),  # launchers of one topic each
        ("runs",),                            # what runs here
        ("fused",),                           # the fused screen's launchers
    ),
    "store": (
        ("entries", "errors", "stats"),       # flat and padded entries, pairs' error radii, counters
        ("candidates",),                      # the store that takes its survivors in
        ("held", "lists"),                    # the store that holds them back; where stores live
    ),
    "graph": (("frames", "report"), ("blocks", "rows"), ("bands",), ("symmetric",)),  # centres; steps, rows; loops
    "search": (("direct",), ("knn", "radius")),  # the direct path; the k-NN search and radius queries
}

#: The engine's doors (rule (h)): a knng module outside one of these subpackages imports it as
#: the package (its exported names), never one of its modules.
ENGINE_DOORS: frozenset[str] = frozenset({"kernels", "store", "graph", "search"})

#: Importers exempt from the layer rule (a). ``knng/__init__.py`` re-exports the public API and
#: may import from any layer; it is still checked for private names and cycles.
EXEMPT_FROM_LAYERS: frozenset[str] = frozenset({"knng"})

#: Known violations tolerated for now, as (importer, imported module, imported name). Each is a
#: debt with an owner: remove the entry when it is fixed (a test below fails on stale entries).
ALLOWED: dict[tuple[str, str, str | None], str] = {
}


@dataclass(frozen=True)
class Import:
    """One import of a knng module (``name`` is None when a whole module is imported)."""

    importer: str
    path: str
    line: int
    target: str
    name: str | None
    runtime_top_level: bool

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"


def module_name(path: Path) -> tuple[str, bool]:
    """``(dotted name, is_package)`` of a file under ``src``."""
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    is_package = parts[-1] == "__init__"
    if is_package:
        parts.pop()
    return ".".join(parts), is_package


def all_modules() -> dict[str, Path]:
    """Every module of the package, by dotted name."""
    return {module_name(p)[0]: p for p in sorted(PACKAGE.rglob("*.py"))}


def layer_of(module: str) -> str:
    """The layer of a knng module: :data:`PLACED`, else its first component after ``knng``."""
    first = module.split(".")[1] if "." in module else ""
    layer = PLACED.get(first, first)
    if layer not in RANK:
        raise KeyError(f"{module} is in no layer: add {first!r} to PLACED in tests/test_layering.py")
    return layer


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _resolve(target: str, modules: set[str]) -> str:
    """The longest prefix of ``target`` that is a knng module (``knng`` itself at worst)."""
    parts = target.split(".")
    while len(parts) > 1 and ".".join(parts) not in modules:
        parts.pop()
    return ".".join(parts)


def imports_of(importer: str, is_package: bool, source: str, path: str, modules: set[str]) -> list[Import]:
    """Every import of a knng module in ``source`` (the text of module ``importer``)."""
    found: list[Import] = []
    package = importer if is_package else importer.rpartition(".")[0]

    def visit(node: ast.AST, top_level: bool) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            top_level = False
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.body:
                visit(child, False)  # never runs: checked for layers and names, not cycles
            for child in node.orelse:
                visit(child, top_level)
            return
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "knng" or alias.name.startswith("knng."):
                    found.append(Import(importer, path, node.lineno, _resolve(alias.name, modules), None,
                                        top_level))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = package.split(".")
                base_parts = base_parts[:len(base_parts) - (node.level - 1)]
                base = ".".join(base_parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            if base == "knng" or base.startswith("knng."):
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    if sub in modules:  # `from knng import distributed`: a module, not a name
                        found.append(Import(importer, path, node.lineno, sub, None, top_level))
                    else:
                        found.append(Import(importer, path, node.lineno, _resolve(base, modules), alias.name,
                                            top_level))
        for child in ast.iter_child_nodes(node):
            visit(child, top_level)

    visit(ast.parse(source, filename=path), True)
    return found


def _is_private(name: str | None) -> bool:
    return name is not None and name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def layer_violations(imports: list[Import]) -> list[str]:
    """Rule (a): imports of a higher layer."""
    out = []
    for imp in imports:
        if imp.importer in EXEMPT_FROM_LAYERS or (imp.importer, imp.target, imp.name) in ALLOWED:
            continue
        mine, theirs = layer_of(imp.importer), layer_of(imp.target)
        if RANK[theirs] > RANK[mine]:
            what = f"{imp.target}.{imp.name}" if imp.name else imp.target
            out.append(f"{imp.where}: rule (a) layers: {imp.importer} (layer {mine}) imports {what} "
                       f"(layer {theirs}, higher)")
    return out


def private_violations(imports: list[Import]) -> list[str]:
    """Rule (b): underscore-prefixed names imported from another knng module."""
    out = []
    for imp in imports:
        if not _is_private(imp.name) or imp.target == imp.importer:
            continue
        if (imp.importer, imp.target, imp.name) in ALLOWED:
            continue
        out.append(f"{imp.where}: rule (b) private name: {imp.importer} imports {imp.name} from {imp.target}")
    return out


def cycles(imports: list[Import]) -> list[str]:
    """Rule (c): cycles in the graph of all imports, deferred ones included, one line per cycle."""
    edges: dict[str, dict[str, Import]] = {}
    for imp in imports:
        if imp.target != imp.importer:
            edges.setdefault(imp.importer, {}).setdefault(imp.target, imp)
    # Tarjan's strongly connected components; every component of more than one module holds a cycle.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, {}):
            if w not in index:
                connect(w)
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
                components.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            connect(v)

    out = []
    for component in components:
        members = set(component)
        # One concrete cycle through the component's first module, by breadth-first search.
        start = component[0]
        previous: dict[str, str] = {}
        frontier = [start]
        while frontier and start not in previous:
            following = []
            for v in frontier:
                for w in sorted(edges.get(v, {})):
                    if w in members and w not in previous:
                        previous[w] = v
                        following.append(w)
            frontier = following
        path = [start]
        while True:
            path.append(previous[path[-1]])
            if path[-1] == start:
                break
        path.reverse()
        steps = " -> ".join(f"{b} ({edges[a][b].where})" for a, b in zip(path, path[1:]))
        out.append(f"rule (c) import cycle: {start} -> {steps}")
    return out


def engine_part(module: str) -> str | None:
    """The engine part of ``module`` (``knng.engine.kernels.fused`` → ``kernels``), or None."""
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[:2] == ["knng", "engine"] else None


def engine_order_violations(imports: list[Import]) -> list[str]:
    """Rule (g): engine parts importing engine parts of their own or a higher tier (and, inside a
    subpackage, its modules likewise); rule (h): a subpackage door passed by."""
    tier = {name: i for i, names in enumerate(ENGINE_ORDER) for name in names}
    out = []
    for imp in imports:
        mine, theirs = engine_part(imp.importer), engine_part(imp.target)
        if theirs in ENGINE_DOORS and mine != theirs and imp.target != f"knng.engine.{theirs}":
            out.append(f"{imp.where}: rule (h) door: {imp.importer} imports {imp.target}; import "
                       f"knng.engine.{theirs} (the package) instead")
        if mine is None or theirs is None or imp.target == imp.importer:
            continue
        for part in (mine, theirs):
            if part not in tier:
                out.append(f"{imp.where}: rule (g) engine order: knng.engine.{part} has no place in ENGINE_ORDER "
                           f"(tests/test_layering.py): state it")
        if mine != theirs:
            if mine in tier and theirs in tier and tier[theirs] >= tier[mine]:
                out.append(f"{imp.where}: rule (g) engine order: {imp.importer} (tier {tier[mine]}) "
                           f"imports {imp.target} (tier {tier[theirs]}, not lower)")
            continue
        inner = SUBPACKAGE_ORDER.get(mine)
        if inner is None or imp.importer == f"knng.engine.{mine}":
            continue
        inner_tier = {name: i for i, names in enumerate(inner) for name in names}
        a, b = imp.importer.split(".")[3], imp.target.split(".")[3] if imp.target.count(".") >= 3 else None
        if b is None:
            out.append(f"{imp.where}: rule (g) engine order: {imp.importer} imports its own package's __init__")
        elif a in inner_tier and b in inner_tier and inner_tier[b] >= inner_tier[a]:
            out.append(f"{imp.where}: rule (g) engine order: {imp.importer} (tier {inner_tier[a]} of {mine}) "
                       f"imports {imp.target} (tier {inner_tier[b]}, not lower)")
    return out


def private_attribute_violations(module: str, source: str, path: str, modules: set[str]) -> list[str]:
    """Rule (f): ``alias._name`` where ``alias`` is a knng module of another package."""
    def package(name: str) -> str:
        return name.split(".")[1] if "." in name else ""

    tree = ast.parse(source, filename=path)
    bound: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "knng" or alias.name.startswith("knng."):
                    bound[alias.asname or "knng"] = alias.name if alias.asname else "knng"
        elif isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").startswith("knng"):
            for alias in node.names:
                if f"{node.module}.{alias.name}" in modules:
                    bound[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    out = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Attribute) and _is_private(node.attr)):
            continue
        chain, value = [], node.value
        while isinstance(value, ast.Attribute):
            chain.append(value.attr)
            value = value.value
        if isinstance(value, ast.Name) and value.id in bound:
            owner = _resolve(".".join([bound[value.id], *reversed(chain)]), modules)
            if package(owner) != package(module):
                out.append(f"{path}:{node.lineno}: rule (f) private attribute: {module} reaches "
                           f"{owner}.{node.attr}")
    return out


def collect() -> list[Import]:
    modules = all_modules()
    names = set(modules)
    found: list[Import] = []
    for module, path in modules.items():
        is_package = path.name == "__init__.py"
        rel = str(path.relative_to(SRC.parent))
        found += imports_of(module, is_package, path.read_text(encoding="utf-8"), rel, names)
    return found


def _report(problems: list[str]) -> str:
    return f"{len(problems)} violation(s) of the layering contract:\n  " + "\n  ".join(problems)


# --------------------------------------------------------------------------------------
# The contract, on the real package
# --------------------------------------------------------------------------------------


def test_every_module_has_a_layer() -> None:
    unplaced = []
    for module in all_modules():
        try:
            layer_of(module)
        except KeyError as exc:
            unplaced.append(str(exc.args[0]))
    assert not unplaced, "\n".join(unplaced)


def test_no_import_of_a_higher_layer() -> None:
    problems = layer_violations(collect())
    assert not problems, _report(problems)


def test_no_private_name_imported_across_modules() -> None:
    problems = private_violations(collect())
    assert not problems, _report(problems)


def test_no_import_cycle() -> None:
    problems = cycles(collect())
    assert not problems, _report(problems)


def test_the_engine_depends_downwards_in_its_stated_order() -> None:
    problems = engine_order_violations(collect())
    modules = [m for m in all_modules() if engine_part(m)]
    engine = {engine_part(m) for m in modules}
    stated = {name for names in ENGINE_ORDER for name in names}
    problems += [f"rule (g): ENGINE_ORDER names {name}, which is no engine part" for name in sorted(stated - engine)]
    problems += [f"rule (g): knng.engine.{name} has no place in ENGINE_ORDER" for name in sorted(engine - stated)]
    for package, inner in SUBPACKAGE_ORDER.items():
        found = {m.split(".")[3] for m in modules if m.startswith(f"knng.engine.{package}.")}
        named = {name for names in inner for name in names}
        problems += [f"rule (g): knng.engine.{package}.{name} has no place in SUBPACKAGE_ORDER"
                     for name in sorted(found - named)]
        problems += [f"rule (g): SUBPACKAGE_ORDER names {package}.{name}, which is no module"
                     for name in sorted(named - found)]
    assert not problems, _report(problems)


def test_the_engine_has_few_parts() -> None:
    """At most 12 modules and subpackages directly in ``knng/engine`` (besides its ``__init__``):
    the engine's layout is read at a glance, the details live in subpackages with one job each."""
    engine = PACKAGE / "engine"
    parts = [p.name for p in engine.iterdir() if (p.suffix == ".py" and p.name != "__init__.py")
             or (p.is_dir() and (p / "__init__.py").exists())]
    assert len(parts) <= 12, sorted(parts)


def test_no_private_name_reached_by_attribute_across_packages() -> None:
    modules = all_modules()
    problems = []
    for module, path in modules.items():
        problems += private_attribute_violations(module, path.read_text(encoding="utf-8"),
                                                 str(path.relative_to(SRC.parent)), set(modules))
    assert not problems, _report(problems)


def test_allow_list_has_no_stale_entries() -> None:
    seen = {(imp.importer, imp.target, imp.name) for imp in collect()}
    stale = [f"{key}: {why}" for key, why in ALLOWED.items() if key not in seen]
    assert not stale, ("these ALLOWED entries in tests/test_layering.py no longer match an import; "
                       "remove them:\n  " + "\n  ".join(stale))


def test_moved_helpers_are_reexported_as_the_same_objects() -> None:
    import knng.api
    import knng.reports

    assert knng.api._LAST_REPORT is knng.reports.LAST_REPORT
    assert knng.api.last_report is knng.reports.last_report
    assert knng.api.report_as_dict is knng.reports.report_as_dict


# --------------------------------------------------------------------------------------
# The checker itself, on small made-up modules
# --------------------------------------------------------------------------------------

_FAKE_MODULES = {"knng", "knng.io", "knng.io.writers", "knng._inputs", "knng.engine", "knng.engine.plan",
                 "knng.api", "knng.distributed", "knng.distributed.a", "knng.distributed.b"}


def _fake(importer: str, source: str, is_package: bool = False) -> list[Import]:
    return imports_of(importer, is_package, source, f"{importer}.py", _FAKE_MODULES)


def test_checker_sees_function_level_relative_and_type_checking_imports() -> None:
    source = (
        "from typing import TYPE_CHECKING\n"
        "import knng._inputs\n"                            # line 2: a private module is fine
        "from knng import _inputs\n"                       # line 3: so is this
        "from ..io.writers import _json_default\n"         # line 4: relative, private name
        "if TYPE_CHECKING:\n"
        "    from knng.api import Graph\n"                 # line 6: type-only, higher layer
        "def f():\n"
        "    from knng.api import _wrap\n"                 # line 8: in a function, higher + private
    )
    found = _fake("knng.distributed.a", source)
    assert [(i.line, i.target, i.name, i.runtime_top_level) for i in found] == [
        (2, "knng._inputs", None, True),
        (3, "knng._inputs", None, True),
        (4, "knng.io.writers", "_json_default", True),
        (6, "knng.api", "Graph", False),
        (8, "knng.api", "_wrap", False),
    ]
    layers = layer_violations(found)
    assert [p.split(":")[1] for p in layers] == ["6", "8"]
    assert "knng.distributed.a.py:6: rule (a)" in layers[0]
    private = private_violations(found)
    assert [p.split(":")[1] for p in private] == ["4", "8"]
    assert "imports _json_default from knng.io.writers" in private[0]


def test_checker_finds_cycles_through_deferred_imports_too() -> None:
    found = _fake("knng.distributed.a", "from knng.distributed.b import x\n")
    assert cycles(found) == []
    deferred = found + _fake("knng.distributed.b", "def f():\n    from knng.distributed.a import y\n")
    (cycle,) = cycles(deferred)
    assert cycle == ("rule (c) import cycle: knng.distributed.a -> knng.distributed.b (knng.distributed.a.py:1)"
                     " -> knng.distributed.a (knng.distributed.b.py:2)")
    typing_only = found + _fake("knng.distributed.b", "if TYPE_CHECKING:\n    from . import a\n")
    assert len(cycles(typing_only)) == 1


def test_checker_sees_private_attributes_and_the_engine_order() -> None:
    modules = _FAKE_MODULES | {"knng.engine.graph", "knng.engine.plan", "knng.engine.search"}
    source = "from knng.engine import graph\nimport knng.engine.plan as plan\nx = graph._own\ny = plan._rule\n"
    found = private_attribute_violations("knng.api", source, "knng/api.py", modules)
    assert [p.split(": ", 1)[1] for p in found] == [
        "rule (f) private attribute: knng.api reaches knng.engine.graph._own",
        "rule (f) private attribute: knng.api reaches knng.engine.plan._rule"]
    assert private_attribute_violations("knng.engine.search", source, "s.py", modules) == []  # same package
    upward = imports_of("knng.engine.plan", False, "def f():\n    from knng.engine.search import run\n", "p.py",
                        modules)
    (problem,) = engine_order_violations(upward)
    assert "rule (g) engine order: knng.engine.plan (tier 4) imports knng.engine.search (tier 7" in problem


def test_checker_sees_a_door_passed_by() -> None:
    modules = _FAKE_MODULES | {"knng.engine.kernels", "knng.engine.kernels.fused", "knng.engine.screen"}
    through = imports_of("knng.engine.screen", False, "from knng.engine.kernels import screen_block\n", "s.py", modules)
    assert engine_order_violations(through) == []
    past = imports_of("knng.api", False, "from knng.engine.kernels.fused import screen_block\n", "a.py", modules)
    (problem,) = engine_order_violations(past)
    assert "rule (h) door: knng.api imports knng.engine.kernels.fused" in problem
    inside = imports_of("knng.engine.kernels.fused", False, "from knng.engine.kernels import runs\n", "f.py",
                        modules | {"knng.engine.kernels.runs"})
    assert engine_order_violations(inside) == []


def test_checker_exempts_only_the_top_level_package() -> None:
    found = _fake("knng", "from knng.api import graph\n", is_package=True)
    found += _fake("knng.engine", "from knng import api\n", is_package=True)
    assert [p.split(":")[0] for p in layer_violations(found)] == ["knng.engine.py"]


@pytest.mark.parametrize("module, layer", [
    ("knng._units", "leaf"), ("knng.io.readers", "io"), ("knng._inputs", "_inputs"), ("knng.results", "results"),
    ("knng.select.cuda", "select"), ("knng.arguments", "engine"), ("knng.distributed.comm", "distributed"),
    ("knng", "api"), ("knng.estimators", "api"), ("knng.demo", "cli"), ("knng.cli.search", "cli"),
    ("knng.cli", "cli"),
])
def test_layer_of(module: str, layer: str) -> None:
    assert layer_of(module) == layer


# --------------------------------------------------------------------------------------
# (d) the parser's start-up, (e) bench/ outside the package
# --------------------------------------------------------------------------------------

#: The modules ``knng --help`` runs: parsing and dispatch, before any command's module.
PARSER_MODULES = ("knng.cli", "knng.cli.entry", "knng.cli.parser", "knng.cli.texts", "knng.cli.choices",
                  "knng.cli.argtypes", "knng.cli.errors")
#: knng modules that may sit under them: they import no torch, scikit-learn or SciPy at module level.
LIGHT_MODULES = frozenset({"knng", "knng._version", "knng.io", "knng.io.readers", "knng.io.writers",
                           "knng.io.outputs", "knng.io.workarea", *PARSER_MODULES})
HEAVY_PACKAGES = ("torch", "sklearn", "scipy", "matplotlib", "triton")

#: bench/ scripts that time engine internals with no public entry, as (script, imported module, name):
#: each says why, and goes when the engine gives what it needs a public name.
BENCH_ALLOWED: dict[tuple[str, str, str | None], str] = {}


def _module_imports(path: Path) -> list[tuple[int, str, bool]]:
    """(line, imported top-level package or module, at module level) of every import in ``path``."""
    found: list[tuple[int, str, bool]] = []

    def visit(node: ast.AST, top: bool) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            top = False
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            return
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name, top) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.append((node.lineno, node.module, top))
        for child in ast.iter_child_nodes(node):
            visit(child, top)

    visit(ast.parse(path.read_text(encoding="utf-8"), filename=str(path)), True)
    return found


def test_the_parser_imports_nothing_heavy_at_module_level() -> None:
    modules = all_modules()
    problems = []
    for module in PARSER_MODULES:
        for line, target, top in _module_imports(modules[module]):
            if not top:
                continue
            root = target.split(".")[0]
            if root in HEAVY_PACKAGES:
                problems.append(f"{modules[module].relative_to(ROOT)}:{line}: imports {target}")
            elif root == "knng" and _resolve(target, set(modules)) not in LIGHT_MODULES:
                problems.append(f"{modules[module].relative_to(ROOT)}:{line}: imports {target}, which is not "
                                "one of the light modules (LIGHT_MODULES)")
    assert not problems, "rule (d): `knng --help` would import too much:\n  " + "\n  ".join(problems)


def _bench_imports() -> list[Import]:
    modules = set(all_modules())
    found: list[Import] = []
    for path in sorted(BENCH.glob("*.py")):
        rel = str(path.relative_to(ROOT))
        found += imports_of(rel, False, path.read_text(encoding="utf-8"), rel, modules)
    return found


def _private_module(module: str) -> bool:
    return any(part.startswith("_") and not part.startswith("__") for part in module.split("."))


def test_bench_imports_no_private_knng_name() -> None:
    problems = []
    for imp in _bench_imports():
        if (imp.importer, imp.target, imp.name) in BENCH_ALLOWED:
            continue
        if _is_private(imp.name) or _private_module(imp.target):
            what = f"{imp.target}.{imp.name}" if imp.name else imp.target
            problems.append(f"{imp.where}: rule (e) bench imports the private {what}")
    assert not problems, _report(problems)


def test_bench_allow_list_has_no_stale_entries() -> None:
    seen = {(imp.importer, imp.target, imp.name) for imp in _bench_imports()}
    stale = [f"{key}: {why}" for key, why in BENCH_ALLOWED.items() if key not in seen]
    assert not stale, "these BENCH_ALLOWED entries no longer match an import; remove them:\n  " + "\n  ".join(stale)


def test_the_selection_harness_uses_exported_names_only() -> None:
    import knng
    import knng.io
    import knng.select

    exported = {"knng": set(knng.__all__), "knng.io": set(knng.io.__all__), "knng.select": set(knng.select.__all__)}
    problems = []
    for imp in _bench_imports():
        if imp.importer != "bench/select_harness.py":
            continue
        if imp.target not in exported or (imp.name is not None and imp.name not in exported[imp.target]):
            what = f"{imp.target}.{imp.name}" if imp.name else imp.target
            problems.append(f"{imp.where}: rule (e) the harness imports {what}, which is not exported by "
                            "knng, knng.io or knng.select")
    assert not problems, _report(problems)


def test_the_tests_mirror_the_packages() -> None:
    """Rule (i): every folder of ``tests/`` is named after a package of ``src/knng`` (``tests/engine/``
    tests ``knng.engine``); tests of top-level modules, of the whole project and the shared helpers
    (``oracle.py``, ``conftest.py``) stay in ``tests/`` itself. The folders have no ``__init__.py``
    (pytest's default import mode puts each on ``sys.path``), so every basename must be unique."""
    tests = ROOT / "tests"
    packages = {p.parent.name for p in PACKAGE.glob("*/__init__.py")}
    folders = {p.name for p in tests.iterdir() if p.is_dir() and not p.name.startswith((".", "_"))}
    assert folders <= packages, (f"tests/ folders {sorted(folders - packages)} are named after no package of "
                                 f"src/knng ({sorted(packages)}): rename or move them")
    files = sorted(p for p in tests.rglob("*.py") if "__pycache__" not in p.parts)
    assert not [p for p in files if p.name == "__init__.py"], "tests/ folders are not packages: no __init__.py"
    seen: dict[str, Path] = {}
    clashes = [f"{p.relative_to(ROOT)} and {seen[p.name].relative_to(ROOT)}" for p in files
               if seen.setdefault(p.name, p) != p]
    assert not clashes, "basenames under tests/ must be unique (no __init__.py):\n  " + "\n  ".join(clashes)
