"""`pip install .` (a wheel, not the checkout) must find profiles/, templates/ and playbooks/ at run time."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_wheel_carries_its_data_and_plans_from_anywhere(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "-w", str(wheels), str(REPO)], check=True, capture_output=True, text=True)
    (wheel,) = wheels.glob("dsv4ctl-*.whl")
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(site)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    code = (
        "import orchestrator, sys\n"
        "from orchestrator.paths import data_dir\n"
        "from orchestrator.apply.playbook import load_playbook\n"
        "assert orchestrator.__file__.startswith(sys.argv[1]), orchestrator.__file__\n"
        "for d in ('profiles', 'templates', 'playbooks'):\n"
        "    assert str(data_dir(d)).startswith(sys.argv[1]), data_dir(d)\n"
        "load_playbook('apply'); load_playbook('rollback')\n"
        "from orchestrator.apply.steps import kernels_source\n"
        "assert str(kernels_source()).startswith(sys.argv[1]), kernels_source()\n"
        "from orchestrator.cli import main\n"
        "sys.exit(main(['plan']))\n"
    )
    # PYTHONPATH puts the unpacked wheel ahead of the editable checkout on sys.path.
    out = subprocess.run([sys.executable, "-c", code, str(site)], cwd=elsewhere, text=True,
                         capture_output=True, env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    assert "Plan: 14 to add" in out.stdout
