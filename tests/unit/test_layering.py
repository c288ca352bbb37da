"""The layering of ``orchestrator``, read from its imports: no module imports a layer above its own.

The order (design.md, developer guide): ``cli -> apply -> planner -> render/release ->
monitoring/health/probes/remote -> deployment/facts -> profile/catalog -> paths/errors``. Modules
outside those packages are placed where their imports and importers put them (said below). The
test parses every module with :mod:`ast` (top-level and function-local imports alike: a lazy import
is still a dependency) and fails naming the file, the line and the two layers. It also checks the
core stays free of the heavy adapters: click only in ``cli``, fabric/paramiko only in ``remote``,
aiohttp only in ``probes``, torch/triton nowhere.
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
ALLOWED_UPWARD: dict[tuple[str, str], str] = {
    # Plan.restarts reads the transition's own rule (one owner of "which roles restart"), lazily;
    # moving roles_restarted down into planner_model would end this exception.
    ("planner_model.py", "planner"): "Plan.restarts delegates to planner.transition.roles_restarted",
}

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
