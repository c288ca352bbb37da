"""Golden release trees of every shipped profile (tests/golden/render/<profile>/...).

A change to any rendered byte fails here with a diff; accept it with ``pytest --update-golden`` and
review the golden diff like code. Modes are pinned through manifest.json.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.profile.loader import load_profile
from tests.validate.helpers import REPO, render_fleet, render_path, shipped_profiles

GOLDEN = REPO / "tests" / "golden" / "render"


@pytest.mark.parametrize("path", shipped_profiles(), ids=lambda p: p.stem)
def test_golden_tree(path: Path, golden) -> None:  # type: ignore[no-untyped-def]
    """A fleet profile's tree per host: render/<profile>/<host>/..."""
    if load_profile(path).hosts is not None:
        files = {f"{host}/{rel}": f for host, tree in render_fleet(path).items()
                 for rel, f in tree.all_files().items()}
    else:
        files = render_path(path)[2].all_files()
    root = GOLDEN / path.stem
    for rel, f in files.items():
        golden.check(f"render/{path.stem}/{rel}", f.content)
    stale = sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()
                   and p.relative_to(root).as_posix() not in files)
    if golden.update:
        for rel in stale:
            (root / rel).unlink()
    else:
        assert not stale, f"golden files no longer rendered (run --update-golden): {stale}"
