"""Golden release trees of every shipped profile (tests/golden/render/<profile>/...).

A change to any rendered byte fails here with a diff; accept it with ``pytest --update-golden`` and
review the golden diff like code. Modes are pinned through manifest.json.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.validate.helpers import REPO, render_path, shipped_profiles

GOLDEN = REPO / "tests" / "golden" / "render"


@pytest.mark.parametrize("path", shipped_profiles(), ids=lambda p: p.stem)
def test_golden_tree(path: Path, golden) -> None:  # type: ignore[no-untyped-def]
    _, _, tree = render_path(path)
    files = tree.all_files()
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
