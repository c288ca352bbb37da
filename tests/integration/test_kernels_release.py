"""Issue 20 item 6 on the harness: the kernels ship inside each release and a rollback restores them.

r1 and r2 ship different kernels packages (different files, different digests); `rollback r1`
restarts the decode, and the restarted decode imports r1's kernels: the real .pth hook line in the
engine env activates in the simulator's process (the engine env carries SGLang 0.5.23's metadata),
imports dsv4_kernels from `<install_root>/current/kernels` (the PYTHONPATH of the role's env file)
and logs the resolved directory with its pid. `dsv4ctl status` reads that line for the unit's
MainPID and names the release and its kernels digest; the harness checks the same from the host,
and that `history` shows, for the current release, what each engine loaded when it was verified
healthy (the fault matrix's :func:`~tests.integration.test_apply_faults.agree`).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from orchestrator import kernels_package
from orchestrator.apply import steps
from tests.integration.test_apply import ROOT, Env, env  # noqa: F401  (the fixture)
from tests.integration.test_apply_faults import agree

pytestmark = pytest.mark.integration
DIGEST_1, DIGEST_2 = "1" * 64, "2" * 64


def _kernels_copy(dest: Path, mark: str) -> Path:
    real = steps.kernels_source()
    for rel in steps.kernels_package_files(real):
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(real / rel, dest / rel)
    with (dest / "dsv4_kernels" / "__init__.py").open("a") as f:
        f.write(f"RELEASE_MARK = {mark!r}\n")
    return dest


def _use(monkeypatch: pytest.MonkeyPatch, src: Path, digest: str) -> None:
    monkeypatch.setattr(steps, "kernels_source", lambda: src)
    monkeypatch.setattr(kernels_package, "digest", lambda: digest)


def _loaded_by_decode(env: Env) -> tuple[int, str]:  # noqa: F811
    """(MainPID of the decode unit, the kernels dir its process logged), seen from the host."""
    pid = int(env.fake.exec("systemctl --user show -p MainPID --value dsv4-itest-decode.service"
                            ).stdout.strip())
    log = env.fake.read(f"{ROOT}/logs/decode.log")
    lines = [ln for ln in log.splitlines()
             if ln.startswith(f"[dsv4_kernels] active (pid {pid}): kernels from ")]
    assert lines, f"decode pid {pid} logged no kernels activation:\n{log[-2000:]}"
    return pid, lines[-1].rsplit(" ", 1)[-1]


def test_rollback_restores_the_release_kernels(env: Env, tmp_path: Path,  # noqa: F811
                                               monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    kernels = {"attention": "bundled", "indexer": "bundled", "mhc_pre": "engine", "selftest": False}
    try:
        _use(monkeypatch, _kernels_copy(tmp_path / "k1", "1"), DIGEST_1)
        assert env.apply(env.profile(kernels=kernels)) == 0
        r1 = env.current()
        _use(monkeypatch, _kernels_copy(tmp_path / "k2", "2"), DIGEST_2)
        assert env.apply(env.profile(kernels=kernels), name="p2.json") == 0
        r2 = env.current()
        assert r1 and r2 and r1 != r2
        pid2, loaded = _loaded_by_decode(env)
        assert loaded == f"{ROOT}/releases/{r2}/kernels"
        assert "RELEASE_MARK = '2'" in env.fake.read(f"{loaded}/dsv4_kernels/__init__.py")
        agree(env, capsys)

        assert env.cli("rollback", r1, "--host", "h") == 0
        env.assert_recovered(r1)
        pid1, loaded = _loaded_by_decode(env)
        assert pid1 != pid2, "the rollback did not restart the decode"
        assert loaded == f"{ROOT}/releases/{r1}/kernels"  # r1's kernels, not the newest install
        assert "RELEASE_MARK = '1'" in env.fake.read(f"{loaded}/dsv4_kernels/__init__.py")

        capsys.readouterr()
        assert env.cli("status", "--host", "h") == 0
        c = capsys.readouterr()
        out = " ".join((c.out + c.err).split())  # undo the folding to the terminal's width
        want = f"kernels: release {r1}, sha256 {DIGEST_1[:12]}"
        decode = out[out.index(" decode: "):]
        assert f"pid {pid1}," in decode and want in decode.split("]")[0], out
        capsys.readouterr()
        assert env.cli("status", "--host", "h", "--format", "json") == 0
        units = {u["role"]: u for u in json.loads(capsys.readouterr().out)["units"]}
        assert units["decode"]["pid"] == pid1
        assert units["decode"]["kernels"] == want.removeprefix("kernels: ")
        agree(env, capsys)  # status and history against the harness, both engines
        capsys.readouterr()
        assert env.cli("history", "--host", "h") == 0
        c = capsys.readouterr()
        out = " ".join((c.out + c.err).split())
        shown = out[out.index(f"* {r1}"):]
        assert (f"kernels decode (pid {pid1}, when verified healthy): release {r1}, sha256 "
                f"{DIGEST_1[:12]}") in shown.split(f" {r2} ")[0], out
    finally:
        env.fake.exec("rm -f /opt/sglang-env/lib/python3*/site-packages/dsv4_kernels_sglang.pth")
