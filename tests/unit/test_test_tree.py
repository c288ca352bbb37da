"""The test tree itself: what `pytest tests kernels` needs to collect every file.

The test folders have no `__init__.py`, so pytest imports each test module by its basename
(rootdir-relative "rootdir/conftest" import mode): two files of one name in different folders stop
the whole run at collection ("import file mismatch"). xdist workers can get past it by chance;
a plain run does not, so it is checked here, once, over every folder the suite collects.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
COLLECTED = ("tests", "kernels/tests", "kernels/experimental/tests")


def test_every_test_module_has_a_basename_of_its_own() -> None:
    seen: dict[str, list[str]] = defaultdict(list)
    for folder in COLLECTED:
        for path in sorted((ROOT / folder).rglob("test_*.py")):
            seen[path.name].append(str(path.relative_to(ROOT)))
    clashes = {name: paths for name, paths in seen.items() if len(paths) > 1}
    assert not clashes, (
        f"test modules sharing a basename stop pytest at collection: {clashes}; rename one")
