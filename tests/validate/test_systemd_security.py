"""`systemd-analyze security --offline=yes` on every rendered unit of every shipped profile (issue 19,
Deliver 2): the overall exposure score and the list of exposures are kept in a golden file per
profile and scope (tests/golden/security/), so a change that loosens the sandbox shows up in review,
and no unit of either scope may be rated UNSAFE or EXPOSED or score above 4.0.

User-scope units run as the user that runs `systemd --user` (the SSH user), which the analyzer
cannot see, so it counts them as running as root (0.4); their sandbox is the one a user manager can
apply (PrivateUsers=yes first; templates/sandbox.service.j2), checked live on the integration hosts
by tests/integration/test_unprivileged_host.py.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.validate.helpers import materialize, render_path, shipped_profiles

_OVERALL = re.compile(r"Overall exposure level for (\S+): ([0-9.]+) (\w+)")


def _analyze(unit: Path, scope: str, runtime_dir: Path) -> str:
    tool = shutil.which("systemd-analyze")
    if tool is None:
        pytest.fail("systemd-analyze is not installed; CI must install it (scripts/setup.sh full)")
    env = dict(os.environ)
    cmd = [tool, "security", "--offline=yes", "--no-pager"]
    if scope == "user":
        runtime_dir.mkdir(mode=0o700, exist_ok=True)
        env["XDG_RUNTIME_DIR"] = str(runtime_dir)
        cmd.append("--user")
    res = subprocess.run([*cmd, str(unit)], capture_output=True, text=True, env=env, timeout=60)
    assert res.returncode == 0 and not res.stderr.strip(), res.stderr
    return res.stdout


def summary(unit: Path, scope: str, runtime_dir: Path) -> tuple[str, float, str]:
    """The unit's score, rating and its exposures (sorted: the tool's own order is not stable)."""
    out = _analyze(unit, scope, runtime_dir)
    m = _OVERALL.search(out)
    assert m, out
    exposures = sorted(
        " ".join(line[1:].split()) for line in out.splitlines() if line.startswith("✗"))
    passed = sum(1 for line in out.splitlines() if line.startswith("✓"))
    text = (f"{unit.name}: {m.group(2)} {m.group(3)} ({len(exposures)} exposures, {passed} "
            "settings pass)\n" + "".join(f"  ✗ {e}\n" for e in exposures))
    return text, float(m.group(2)), m.group(3)


@pytest.mark.parametrize("scope", ["system", "user"])
@pytest.mark.parametrize("path", shipped_profiles(), ids=lambda p: p.stem)
def test_golden_security_exposure(path: Path, scope: str, tmp_path: Path, golden) -> None:
    root = tmp_path / "root"
    _, _, tree = render_path(path, install_root=str(root), scope=scope)
    current = materialize(tree, root)
    texts = []
    for unit in sorted((current / "units").glob("*.service")):
        text, score, rating = summary(unit, scope, tmp_path / "xdg")
        texts.append(text)
        assert rating not in ("UNSAFE", "EXPOSED"), text
        assert score <= 4.0, text
    golden.check(f"security/{path.stem}-{scope}.txt", "\n".join(texts))
