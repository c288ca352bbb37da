"""The layering of ``orchestrator``, read from its imports: no module imports a layer above its own.

The order (design.md, developer guide): ``cli -> apply -> planner -> render/release ->
monitoring/health/probes/remote -> deployment/facts -> profile/catalog -> paths/errors``. Modules
outside those packages are placed where their imports and importers put them (said below). The
test parses every module with :mod:`ast` (top-level and function-local imports alike: a lazy import
is still a dependency) and fails naming the file, the line and the two layers. Within a layer it
checks file to file: no import cycle between modules, where a function-level import counts as
much as a top-level one (a lazy import never hides a cycle). It also checks the core stays free
of the heavy adapters: click only in ``cli``, fabric/paramiko only in ``remote``, aiohttp only in
``probes``, torch/triton nowhere.
"""

from __future__ import annotations

import ast
from pathlib import Path

import orchestrator

ROOT = Path(orchestrator.__file__).parent

# rank: higher may import lower or equal, never higher
LAYERS: dict[str, int] = {
    "cli": 8, "terminal": 8,  # terminal: the CLI's output escaping, imported only by cli
    "apply": 7,
    "planner": 6,
    "render": 5, "release": 5,
    "planner_model": 5,  # the Plan value that render, release and apply share
    "monitoring": 4, "health": 4, "probes": 4, "remote": 4,
    "deployment": 3, "facts": 3,
    "kernel_paths": 3,  # each role's kernel path, from the deployment, the facts and the catalog
    "kernel_qualification": 3,  # the stored kernel measurement: facts for remote's probe
    "calibration": 3,  # parses the measured pool (facts) for remote's probe and the planner
    "profile": 2, "catalog": 2,
    "kernels_package": 2,  # the shipped kernels' digest, from paths only
    "paths": 1, "errors": 1,
    "exposure": 1,  # the classification of a listen address: the planner and status both read it
    "localfs": 1,  # the controller's file writes: explicit modes, no link followed
    "host_data": 1,  # the bounded readers of what comes back from a host (records, journals...)
    "release_ids": 1,  # the release id format: the store and remote's probe both read it
    "__init__": 0,  # the package's version
}

# Known upward imports, each with its reason. Keep this list short; a new entry needs a reason.
ALLOWED_UPWARD: dict[tuple[str, str], str] = {}

# third-party packages and the only top-level units allowed to import them
HEAVY: dict[str, frozenset[str]] = {
    "click": frozenset({"cli"}),
    "fabric": frozenset({"remote"}),
    "paramiko": frozenset({"remote"}),
    "invoke": frozenset({"remote"}),
    "aiohttp": frozenset({"probes"}),
    "torch": frozenset(),
    "triton": frozenset(),
}


def _unit(module: str) -> str:
    """The layer unit of a dotted module name under ``orchestrator``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _imports(path: Path, root: Path = ROOT) -> list[tuple[str, int]]:
    """(absolute module name, line) of every import in one file, relative ones resolved."""
    rel = path.relative_to(root.parent).with_suffix("")
    package = list(rel.parts) if path.name == "__init__.py" else list(rel.parts[:-1])
    if path.name == "__init__.py":
        package = package[:-1]
    out: list[tuple[str, int]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                name = ".".join(base + ([node.module] if node.module else []))
                out.append((name, node.lineno))
                if not node.module:  # from . import x: x may be a module of that package
                    out += [(f"{name}.{a.name}", node.lineno) for a in node.names]
            elif node.module:
                out.append((node.module, node.lineno))
                if node.module == "orchestrator":  # from orchestrator import calibration
                    out += [(f"orchestrator.{a.name}", node.lineno) for a in node.names]
    return out


def _modules() -> list[tuple[Path, str]]:
    files = sorted(ROOT.rglob("*.py"))
    assert len(files) > 50, f"found only {len(files)} modules under {ROOT}"
    return [(p, _unit("orchestrator." + ".".join(p.relative_to(ROOT).with_suffix("").parts)))
            for p in files]


def test_every_unit_has_a_layer() -> None:
    units = {u for _, u in _modules()}
    assert units - set(LAYERS) == set(), "place the new module or package in LAYERS"


def test_no_module_imports_a_layer_above_its_own() -> None:
    bad = []
    for path, unit in _modules():
        rel = str(path.relative_to(ROOT))
        for name, line in _imports(path):
            if not name.startswith("orchestrator."):
                continue
            target = _unit(name)
            if target not in LAYERS or LAYERS[target] <= LAYERS[unit]:
                continue
            if (rel, target) in ALLOWED_UPWARD:
                continue
            bad.append(f"orchestrator/{rel}:{line} ({unit}, layer {LAYERS[unit]}) imports {name} "
                       f"({target}, layer {LAYERS[target]})")
    assert bad == []


def test_allowed_upward_imports_still_exist() -> None:
    """An exception that is no longer needed is removed, so the list stays the truth."""
    for rel, target in ALLOWED_UPWARD:
        names = [_unit(n) for n, _ in _imports(ROOT / rel) if n.startswith("orchestrator.")]
        assert target in names, f"{rel} no longer imports {target}: drop it from ALLOWED_UPWARD"


def test_heavy_adapters_stay_in_their_layer() -> None:
    bad = []
    for path, unit in _modules():
        for name, line in _imports(path):
            top = name.split(".")[0]
            if top in HEAVY and unit not in HEAVY[top]:
                bad.append(f"orchestrator/{path.relative_to(ROOT)}:{line} imports {name}")
    assert bad == []


def test_the_checker_sees_an_upward_import(tmp_path: Path) -> None:
    """The parser resolves relative and ``from orchestrator import x`` imports (else it passes
    vacuously)."""
    (tmp_path / "orchestrator" / "facts").mkdir(parents=True)
    src = tmp_path / "orchestrator" / "facts" / "x.py"
    src.write_text("from ..planner import build\nfrom orchestrator import apply\n"
                   "def f():\n    from . import y\n", encoding="utf-8")
    names = [n for n, _ in _imports(src, tmp_path / "orchestrator")]
    assert names == ["orchestrator.planner", "orchestrator", "orchestrator.apply",
                     "orchestrator.facts", "orchestrator.facts.y"]


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _file_graph(root: Path = ROOT) -> dict[str, dict[str, int]]:
    """module -> {module it imports: line}, for the modules under ``root``, every import
    (top-level, function-level, under TYPE_CHECKING). ``from pkg import name`` is an edge to
    ``pkg.name`` when that is a module, else to ``pkg``."""
    files = sorted(root.rglob("*.py"))
    mods = {_module_name(p, root) for p in files}
    graph: dict[str, dict[str, int]] = {}
    for path in files:
        me = _module_name(path, root)
        edges: dict[str, int] = {}
        rel = path.relative_to(root.parent).with_suffix("")
        package = list(rel.parts[:-1])
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = ".".join(package[: len(package) - (node.level - 1)])
                    module = f"{base}.{node.module}" if node.module else base
                else:
                    module = node.module or ""
                subs = [f"{module}.{a.name}" for a in node.names]
                targets = [t for t in subs if t in mods] or [module]
                if len(targets) < len(subs):  # names that are not modules come from the package
                    targets.append(module)
            for t in targets:
                while t and t not in mods:  # import a.b.c: the deepest module that exists
                    t = t.rpartition(".")[0]
                if t and t != me:
                    edges.setdefault(t, node.lineno)
        graph[me] = edges
    return graph


def _cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The import cycles: each strongly connected group of modules (Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def _describe(graph: dict[str, dict[str, int]], group: list[str]) -> str:
    edges = [f"{a} -> {b} (line {graph[a][b]})" for a in group for b in group if b in graph[a]]
    return "; ".join(edges)


def test_no_import_cycle_between_files() -> None:
    """Files that import each other in a loop, directly or through others, top-level or inside a
    function: none. (Before: planner.build <-> fleet <-> static behind "import cycle kept lazy",
    capacity <-> outside for a type, transition <-> planner_model, cli.apply_cmd <-> fleet_cmd.)"""
    graph = _file_graph()
    assert [_describe(graph, g) for g in _cycles(graph)] == []


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "orchestrator"
    for rel, text in {"__init__.py": "", **files}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text, encoding="utf-8")
    for d in {(root / rel).parent for rel in files}:
        (d / "__init__.py").touch()
    return root


def test_the_checker_sees_a_planted_file_cycle(tmp_path: Path) -> None:
    root = _package(tmp_path, {
        "planner/a.py": "from orchestrator.planner import b\n",
        "planner/b.py": "from orchestrator.planner.c import X\n",
        "planner/c.py": "from .a import Y\nX = 1\n",
        "planner/d.py": "from orchestrator.planner import a\n"})
    assert _cycles(_file_graph(root)) == [
        ["orchestrator.planner.a", "orchestrator.planner.b", "orchestrator.planner.c"]]


def test_the_checker_sees_a_cycle_hidden_in_a_function(tmp_path: Path) -> None:
    """The pattern this replaced: a function-level import ("kept lazy") that closes a loop."""
    root = _package(tmp_path, {
        "planner/build.py": "from orchestrator.planner.static import check\n",
        "planner/static.py": "def check():\n    from orchestrator.planner.build import ctx\n"
                             "    return ctx\n"})
    graph = _file_graph(root)
    assert _cycles(graph) == [["orchestrator.planner.build", "orchestrator.planner.static"]]
    assert "orchestrator.planner.static -> orchestrator.planner.build (line 2)" in \
        _describe(graph, _cycles(graph)[0])

