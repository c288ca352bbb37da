"""The host side of `dsv4ctl qualify kernels`, run against this machine's shell.

The engine env's python is a script that records how it was called and prints what the runner
would: the kernels package of this dsv4ctl arrives unpacked in a scratch directory, the runner runs
with that on PYTHONPATH, on the role's GPU, with the role's shapes; the scratch is removed after;
its JSON is merged into the host's file; a runner failure is a clear error.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.apply import qualify_kernels as Q
from orchestrator.errors import DsvError
from tests.unit.test_release import LocalShell

DATA = Path(__file__).resolve().parents[1] / "data" / "qualify"
FAKE_PYTHON = """#!/bin/sh
d="$(dirname "$0")/.."
echo "CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES PYTHONPATH=$PYTHONPATH $*" >> "$d/calls.log"
ls "$PYTHONPATH/dsv4_kernels/qualify.py" >> "$d/calls.log" || exit 3
cat "$d/out.json"
exit "$(cat "$d/rc")"
"""


def _host(tmp_path: Path, rc: int = 0) -> tuple[Path, Path]:
    env, root = tmp_path / "env", tmp_path / "root"
    (env / "bin").mkdir(parents=True)
    root.mkdir()
    (env / "bin" / "python").write_text(FAKE_PYTHON)
    (env / "bin" / "python").chmod(0o755)
    (env / "out.json").write_text((DATA / "h200-proxy-decode.json").read_text())
    (env / "rc").write_text(str(rc))
    return env, root


def test_a_role_is_measured_in_the_engine_env_and_stored(tmp_path: Path) -> None:
    env, root = _host(tmp_path)
    shape = {"heads_per_attn_rank": 16, "attn_tp": 4}
    m = Q.run_role(LocalShell(), "h", str(root), str(env), 5, "decode", shape)
    assert m.gpu == "NVIDIA H200"
    call = (env / "calls.log").read_text()
    assert call.startswith("CUDA_VISIBLE_DEVICES=5 PYTHONPATH=" + str(root / ".incoming"))
    assert ("-m dsv4_kernels.qualify --role decode --host h --shape "
            '{"attn_tp":4,"heads_per_attn_rank":16}') in call
    assert "/kernels/dsv4_kernels/qualify.py" in call  # the package arrived unpacked
    assert list((root / ".incoming").iterdir()) == []  # scratch and tarball removed
    Q.write_host(LocalShell(), str(root), [m])
    Q.write_host(LocalShell(), str(root), [m.model_copy(update={"role": "prefill"})])
    doc = json.loads((root / "kernels-qualification.json").read_text())
    assert [x["role"] for x in doc["measurements"]] == ["decode", "prefill"]
    assert Q.read_host(LocalShell(), str(root))[0] == m
    assert Q.reset_host(LocalShell(), str(root)) and not Q.reset_host(LocalShell(), str(root))


def test_a_failed_run_is_a_clear_error_and_leaves_no_scratch(tmp_path: Path) -> None:
    env, root = _host(tmp_path, rc=2)
    (env / "out.json").write_text('{"error": "no CUDA device visible"}')
    with pytest.raises(DsvError, match=r"measurement of role decode failed on host 'h' \(exit 2\)"
                       r".*no CUDA device visible"):
        Q.run_role(LocalShell(), "h", str(root), str(env), 0, "decode", {})
    assert list((root / ".incoming").iterdir()) == []
    assert not (root / "kernels-qualification.json").exists()
