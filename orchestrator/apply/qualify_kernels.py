"""``dsv4ctl qualify kernels`` on the host: measure each hooked op, keep the result as a fact.

For every engine role of the profile on the host, the kernels package of this dsv4ctl goes into a
scratch directory under ``<install_root>/.incoming`` and ``python -m dsv4_kernels.qualify`` runs in
the engine's own environment (``<engine.env>/bin/python``, after the environment's owner/mode
check) on the role's first GPU, with the role's shapes
(:func:`orchestrator.kernel_paths.role_shape`). Its JSON, a
:class:`~orchestrator.facts.KernelQualification`, is merged into
``<install_root>/kernels-qualification.json`` (one per role, the newest wins), which ``plan
--live`` reads back (``remote.probes``) and decides from (:mod:`orchestrator.kernel_paths`).
``--from-file`` stores a measurement taken by hand the same way; ``--reset`` removes the file.
The pure parts live in :mod:`orchestrator.kernel_qualification`.
"""

from __future__ import annotations

import hashlib
import io
import shlex
import tarfile
from typing import Any

from orchestrator import kernel_qualification as KQ
from orchestrator.errors import DsvError
from orchestrator.facts import KernelQualification
from orchestrator.remote.hostfs import remove_if_present

RUN_TIMEOUT_S = 1800  # Triton compiles every contender's kernels at first use


def qualification_path(install_root: str) -> str:
    return f"{install_root.rstrip('/')}/{KQ.QUALIFICATION_FILE}"


def read_host(shell: Any, install_root: str) -> list[KernelQualification]:
    from orchestrator.remote.probes import probe_kernel_qualification

    return probe_kernel_qualification(shell, install_root)


def write_host(remote: Any, install_root: str, measurements: list[KernelQualification]) -> None:
    """Merge ``measurements`` into the host's file (atomic replace)."""
    merged = KQ.merge(read_host(remote, install_root), measurements)
    remote.replace_bytes(KQ.render_file(merged).encode(), qualification_path(install_root))


def reset_host(remote: Any, install_root: str) -> bool:
    """Remove the host's kernels-qualification.json; True when there was one."""
    return remove_if_present(remote, qualification_path(install_root))


def _kernels_tarball() -> tuple[bytes, str]:
    from orchestrator import kernels_package

    src = kernels_package.source()
    if src is None:
        raise DsvError("the bundled kernels package (kernels/) is not part of this dsv4ctl "
                       "install, and the measurement runs from it",
                       fix="install dsv4ctl from a source checkout")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for rel in kernels_package.package_files(src):
            tar.add(src / rel, arcname=f"kernels/{rel}", recursive=False)
    data = buf.getvalue()
    return data, hashlib.sha256(data).hexdigest()[:12]


def run_role(remote: Any, host_name: str, install_root: str, engine_env: str, gpu: int,
             role: str, shape: dict[str, int]) -> KernelQualification:
    """One role's measurement on the host (the runner's JSON, checked as the fact model)."""
    import json

    data, digest = _kernels_tarball()
    scratch = f"{install_root.rstrip('/')}/.incoming/qualify-{digest}"
    tgz = f"{scratch}.tar.gz"
    remote.check(f"mkdir -p {shlex.quote(scratch)}", timeout=30,
                 what="preparing the measurement's scratch directory")
    remote.put_bytes(data, tgz, mode=0o600)
    py = shlex.quote(f"{engine_env}/bin/python")
    cmd = (f"tar -xzf {shlex.quote(tgz)} -C {shlex.quote(scratch)} && "
           f"CUDA_VISIBLE_DEVICES={gpu} PYTHONPATH={shlex.quote(scratch + '/kernels')} "
           f"{py} -m dsv4_kernels.qualify --role {shlex.quote(role)} "
           f"--host {shlex.quote(host_name)} "
           f"--shape {shlex.quote(json.dumps(shape, sort_keys=True, separators=(',', ':')))}")
    try:
        res = remote.run(cmd, timeout=RUN_TIMEOUT_S)
    finally:
        remote.run(f"rm -rf {shlex.quote(scratch)} {shlex.quote(tgz)}", timeout=60)
    if res.rc != 0:
        raise DsvError(f"the kernel measurement of role {role} failed on host '{host_name}' "
                       f"(exit {res.rc}): {(res.stdout + res.stderr).strip()[-400:]}",
                       fix="run it by hand to see why: PYTHONPATH=<kernels> "
                           f"{engine_env}/bin/python -m dsv4_kernels.qualify --help")
    return KQ.parse_measurement(res.stdout, where=f"the measurement of role {role}")


def table(m: KernelQualification) -> list[str]:
    """The contenders of one measurement, a line each."""
    out = [f"role {m.role} on {m.host} ({m.gpu}, cc {m.compute_cap}, sglang "
           f"{m.engine_version}), {m.measured_at}:"]
    for t in m.timings:
        us = f"{t.us:,.1f} us" if t.us is not None else "-"
        err = f" err {t.error:.2g}" if t.error is not None else ""
        detail = f" ({t.detail})" if t.detail else ""
        out.append(f"  {t.op:<9} {t.shape:<36} {t.contender:<13} {t.status:<11} {us}{err}"
                   f"{detail}")
    return out
