"""Probes: each fact about a host is one shell command plus a pure parser of its output.

This module owns *what* we ask a host and *how* we read the answer; it never opens a connection (the
caller passes anything with a ``run`` method, :class:`Shell`). Keeping the
parsers pure lets ``tests/unit/test_probes.py`` check them on recorded real output
(``tests/data/probes/``), pyinfra-style: a fact is a command and a parser, nothing else
(https://github.com/pyinfra-dev/pyinfra, ``pyinfra/facts``).

Every command is POSIX sh and quotes every path it is given, because paths come from profiles and
inventories. A parser that meets output it does not understand raises :class:`RemoteError` with the
offending line instead of guessing.

Past ~400 lines: one command and one parser per fact, side by side, is the point of the module; the
seam, when it grows again, is the batch runner (``batch_command``, ``parse_batch``, ``_Replay``) into
a module of its own.

Just past 400 lines: one small command-and-parser pair per fact (GPUs, disks, models, ports, units,
current release, calibration) plus :func:`collect_facts` that runs them; each pair is
independent, so the length is the number of facts, not one tangled function.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from orchestrator.calibration import CALIBRATION_FILE
from orchestrator.calibration import parse_file as parse_calibration
from orchestrator.errors import RemoteError
from orchestrator.facts import (
    DiskFact,
    EngineEnvFact,
    Facts,
    GpuFact,
    KernelQualification,
    ModelFact,
    PoolMeasurement,
    UnitFact,
)
from orchestrator.profile.inventory import Host
from orchestrator.release_ids import sort_ids
from orchestrator.remote.drift import drift_command, probe_drift

# The fields we ask nvidia-smi for, in order. `compute_cap` needs driver >= 510 (nvidia-smi
# --help-query-gpu); every driver that supports Blackwell has it.
GPU_FIELDS = ("index", "name", "memory.total", "compute_cap", "uuid", "driver_version")
GPU_COMMAND = (
    "nvidia-smi --query-gpu=" + ",".join(GPU_FIELDS) + " --format=csv,noheader,nounits"
)
INDEX_FILE = "model.safetensors.index.json"
MARK = "==> "  # separates per-path sections in multi-path probe output (like `head` does)


class Shell(Protocol):
    """What probes need from a host: run a command, get (rc, stdout, stderr)."""

    def run(self, command: str, *, timeout: float | None = None) -> CommandResult: ...


@dataclass(frozen=True)
class CommandResult:
    command: str
    rc: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.rc == 0


# --------------------------------------------------------------------------------------- GPUs ---

def parse_gpus(stdout: str) -> tuple[list[GpuFact], str | None]:
    """Parse ``GPU_COMMAND`` output (one CSV line per GPU): the GPUs and the driver version."""
    gpus: list[GpuFact] = []
    drivers: set[str] = set()
    for line in stdout.splitlines():
        if not line.strip():
            continue
        cols = [c.strip() for c in line.split(",")]
        if len(cols) != len(GPU_FIELDS):
            raise RemoteError(
                f"cannot read nvidia-smi output line {line!r}: expected {len(GPU_FIELDS)} "
                f"comma-separated fields ({', '.join(GPU_FIELDS)})",
                fix="run the probe command on the host by hand: " + GPU_COMMAND,
            )
        index, name, mem, cap, uuid, driver = cols
        try:
            gpus.append(GpuFact(
                index=int(index), name=name,
                memory_mib=int(mem) if mem not in ("[N/A]", "N/A") else None,
                compute_cap=None if cap in ("[N/A]", "N/A") else cap,
                uuid=None if uuid in ("[N/A]", "N/A") else uuid,
            ))
        except ValueError as exc:
            raise RemoteError(f"cannot read nvidia-smi output line {line!r}: {exc}") from exc
        drivers.add(driver)
    if len(drivers) > 1:
        raise RemoteError(f"nvidia-smi reports several driver versions: {sorted(drivers)}")
    return sorted(gpus, key=lambda g: g.index), (drivers.pop() if drivers else None)


def probe_gpus(shell: Shell) -> tuple[list[GpuFact], str | None]:
    res = shell.run(GPU_COMMAND, timeout=60)
    if res.rc == 127:  # not installed: a host without NVIDIA GPUs is a fact, not a probe failure
        return [], None
    if not res.ok:
        raise RemoteError(
            f"nvidia-smi failed on the host (exit {res.rc}): "
            f"{(res.stderr or res.stdout).strip()[:300]}",
            fix="check the NVIDIA driver on the host (`nvidia-smi` must list the GPUs)",
        )
    return parse_gpus(res.stdout)


# --------------------------------------------------------------------------------------- disks ---

def disk_command(paths: Sequence[str]) -> str:
    """df for each path; a path that does not exist yet is measured at its nearest existing parent
    (that is where its files will land)."""
    quoted = " ".join(shlex.quote(p) for p in paths)
    return (
        f"for p in {quoted}; do q=\"$p\"; while [ ! -e \"$q\" ]; do q=$(dirname \"$q\"); done; "
        f"printf '{MARK}%s\\n' \"$p\"; df -B1 --output=size,avail -- \"$q\" | tail -n 1; done"
    )


GIB = 1 << 30


def parse_disks(stdout: str) -> list[DiskFact]:
    """Free space is rounded *down* to whole GiB: it moves by kilobytes every second on a live
    host (logs), so exact bytes would make plans of the same host differ from run to run. A GiB is
    far below what a checkpoint decision turns on (tens of GB), and rounding down never overstates
    the room. (It is left out of the facts' fingerprint: a boundary still gets crossed now and
    then; apply compares it with what the plan needs, ``apply.preflight.stale_reason``.)"""
    out: list[DiskFact] = []
    path: str | None = None
    for line in stdout.splitlines():
        if line.startswith(MARK):
            path = line[len(MARK):]
            continue
        if not line.strip():
            continue
        if path is None:
            raise RemoteError(f"unexpected df output before any path marker: {line!r}")
        cols = line.split()
        if len(cols) != 2 or not all(c.isdigit() for c in cols):
            raise RemoteError(f"cannot read df output for {path}: {line!r} (expected 'SIZE AVAIL')")
        out.append(DiskFact(path=path, size_bytes=int(cols[0]),
                            free_bytes=int(cols[1]) // GIB * GIB))
        path = None
    return out


def parse_df_table(stdout: str) -> list[DiskFact]:
    """Parse plain ``df -B1 --output=target,size,avail`` output (header + rows), as recorded."""
    rows = stdout.splitlines()
    if not rows or not rows[0].split()[:2] == ["Mounted", "on"]:
        raise RemoteError("df output has no 'Mounted on' header")
    out = []
    for line in rows[1:]:
        cols = line.split()
        if len(cols) < 3 or not cols[-1].isdigit() or not cols[-2].isdigit():
            raise RemoteError(f"cannot read df row {line!r}")
        out.append(DiskFact(path=" ".join(cols[:-2]), size_bytes=int(cols[-2]),
                            free_bytes=int(cols[-1])))
    return out


def probe_disks(shell: Shell, paths: Sequence[str]) -> list[DiskFact]:
    if not paths:
        return []
    res = shell.run(disk_command(paths), timeout=60)
    if not res.ok:
        raise RemoteError(f"df failed on the host (exit {res.rc}): {res.stderr.strip()[:300]}")
    return parse_disks(res.stdout)


# -------------------------------------------------------------------------------------- models ---

def model_command(paths: Sequence[str]) -> str:
    """Print each checkpoint's index file, or nothing for a path without one."""
    quoted = " ".join(shlex.quote(p) for p in paths)
    return (
        f"for p in {quoted}; do printf '{MARK}%s\\n' \"$p\"; "
        f"if [ -f \"$p/{INDEX_FILE}\" ]; then cat \"$p/{INDEX_FILE}\"; printf '\\n'; fi; done"
    )


_TOTAL_SIZE = re.compile(r'"total_size"\s*:\s*([0-9]{1,16}(?:\.[0-9]{1,6})?)(?![0-9.eE])')
MAX_CHECKPOINT_BYTES = 1 << 50  # 1 PiB: far past any checkpoint, far below a float's range


def parse_index_total_size(text: str) -> int:
    """``metadata.total_size`` of a safetensors index: the exact bytes of all shards' tensors.
    Host data (issue 31): bounded JSON, a finite whole number of bytes up to 1 PiB."""
    from orchestrator.host_data import HostDataError, bounded_json

    try:
        doc = bounded_json(text, INDEX_FILE)
    except HostDataError:
        doc = None
    if isinstance(doc, dict):
        meta = doc.get("metadata")
        size = meta.get("total_size") if isinstance(meta, dict) else None
        if isinstance(size, int | float) and not isinstance(size, bool):
            if not 0 <= size <= MAX_CHECKPOINT_BYTES:
                raise RemoteError(f"{INDEX_FILE} gives metadata.total_size {size:.6g}, outside "
                                  f"0 to {MAX_CHECKPOINT_BYTES:,} bytes")
            return int(size)
        raise RemoteError(f"{INDEX_FILE} has no metadata.total_size")
    m = _TOTAL_SIZE.search(text)  # a truncated or slightly malformed file still names its size
    if m and float(m.group(1)) <= MAX_CHECKPOINT_BYTES:
        return int(float(m.group(1)))
    raise RemoteError(f"{INDEX_FILE} is not JSON and names no total_size")


def parse_models(stdout: str, variants: dict[str, str | None] | None = None) -> list[ModelFact]:
    sections: list[tuple[str, list[str]]] = []
    for line in stdout.splitlines():
        if line.startswith(MARK):
            sections.append((line[len(MARK):], []))
        elif sections:
            sections[-1][1].append(line)
    out = []
    for path, lines in sections:
        text = "\n".join(lines).strip()
        if not text:
            continue  # no checkpoint at that path
        out.append(ModelFact(path=path, size_bytes=parse_index_total_size(text),
                             variant=(variants or {}).get(path)))
    return out


def probe_models(shell: Shell, paths: Sequence[str],
                 variants: dict[str, str | None] | None = None) -> list[ModelFact]:
    if not paths:
        return []
    res = shell.run(model_command(paths), timeout=120)
    if not res.ok:
        raise RemoteError(f"reading checkpoint indexes failed (exit {res.rc}): {res.stderr[:300]}")
    return parse_models(res.stdout, variants)


# ---------------------------------------------------------------------------------------- ports ---

PORTS_COMMAND = "cat /proc/sys/net/ipv4/ip_local_port_range; ss -ltnH"


def parse_ports(stdout: str) -> list[int]:
    """Listening TCP ports from ``ss -ltnH`` (State Recv-Q Send-Q Local:Port Peer:Port [Process]).

    When the output starts with the kernel's ephemeral range (``ip_local_port_range``), ports in
    that range are left out: engines and NCCL bind random ports there while running, which would
    make every saved plan stale; a deployment's own ports are configured below it."""
    ports: set[int] = set()
    lines = stdout.splitlines()
    lo, hi = 0, -1
    if lines and len(lines[0].split()) == 2 and all(x.isdigit() for x in lines[0].split()):
        lo, hi = (int(x) for x in lines[0].split())
        lines = lines[1:]
    for line in lines:
        cols = line.split()
        if not cols:
            continue
        if len(cols) < 5:
            raise RemoteError(f"cannot read ss output line {line!r}")
        local = cols[3]
        port = local.rsplit(":", 1)[-1]
        if not port.isdigit():
            raise RemoteError(f"cannot read a port in ss output line {line!r}")
        if not lo <= int(port) <= hi:
            ports.add(int(port))
    return sorted(ports)


def probe_ports(shell: Shell) -> list[int]:
    res = shell.run(PORTS_COMMAND, timeout=30)
    if not res.ok:
        raise RemoteError(f"`ss -ltnH` failed on the host (exit {res.rc}): {res.stderr[:300]}",
                          fix="install iproute2 on the host")
    return parse_ports(res.stdout)


# ---------------------------------------------------------------------------------------- units ---

def systemctl(scope: str) -> str:
    return "systemctl --user" if scope == "user" else "systemctl"


def unit_dir_expr(scope: str) -> str:
    """Shell expression for the unit directory (evaluated on the host)."""
    if scope == "user":
        return '"${XDG_CONFIG_HOME:-$HOME/.config}/systemd/user"'
    return "/etc/systemd/system"


def units_command(scope: str, pattern: str = "dsv4-*") -> str:
    return (f"{systemctl(scope)} list-units --all --plain --no-legend --no-pager "
            f"{shlex.quote(pattern)}")


def parse_units(stdout: str) -> list[UnitFact]:
    """``systemctl list-units --plain --no-legend``: UNIT LOAD ACTIVE SUB DESCRIPTION..."""
    out = []
    for line in stdout.splitlines():
        cols = line.split()
        if not cols:
            continue
        if cols[0] in ("●", "*"):  # failed units carry a marker in some versions
            cols = cols[1:]
        if len(cols) < 4:
            raise RemoteError(f"cannot read systemctl output line {line!r}")
        out.append(UnitFact(name=cols[0], active=cols[2]))
    return sorted(out, key=lambda u: u.name)


def probe_units(shell: Shell, scope: str) -> list[UnitFact]:
    res = shell.run(units_command(scope), timeout=30)
    if not res.ok:
        raise RemoteError(
            f"listing units failed (exit {res.rc}): {(res.stderr or res.stdout).strip()[:300]}",
            fix=("for scope 'user' the SSH session needs a running `systemd --user` "
                 "(XDG_RUNTIME_DIR); for 'system' the host must boot with systemd"),
        )
    return parse_units(res.stdout)


def parse_show(stdout: str) -> dict[str, dict[str, str]]:
    """``systemctl show -p A -p B u1 u2``: blocks of KEY=VALUE separated by blank lines.
    Returned by the ``Id`` property of each block."""
    blocks: list[dict[str, str]] = [{}]
    for line in stdout.splitlines():
        if not line.strip():
            if blocks[-1]:
                blocks.append({})
            continue
        key, _, value = line.partition("=")
        blocks[-1][key] = value
    return {b["Id"]: b for b in blocks if b.get("Id")}


# ------------------------------------------------------------------------------ current release ---

LATEST = MARK + "releases"


def current_command(install_root: str) -> str:
    """The ``current`` link, its manifest, then (after a ``==> releases`` line) the names in
    ``releases/``: the newest of them, whatever its outcome, is a fact a plan depends on."""
    root = shlex.quote(install_root)
    return (
        f"if [ -L {root}/current ]; then printf 'release=%s\\n' \"$(readlink {root}/current)\"; "
        f"if [ -f {root}/current/manifest.json ]; then cat {root}/current/manifest.json; fi; fi; "
        f"printf '\\n{LATEST}\\n'; ls -1 {root}/releases 2>/dev/null; true"
    )


def _split_latest(stdout: str) -> tuple[str, str | None]:
    """(the current-release part, the releases listing or None when absent)."""
    parts = re.split(r"(?m)^" + re.escape(LATEST) + r"$\n?", stdout, maxsplit=1)
    return parts[0], (parts[1] if len(parts) == 2 else None)


def parse_latest(stdout: str) -> str | None:
    """The newest release directory (by sequence number) listed after the ``==> releases`` line;
    None when there is none (or the output predates that line)."""
    ids = sort_ids(n.strip() for n in (_split_latest(stdout)[1] or "").splitlines())
    return ids[-1] if ids else None


def parse_current(stdout: str) -> tuple[str | None, dict[str, str]]:
    """The current release id (basename of the ``current`` link) and its manifest's file hashes."""
    stdout = _split_latest(stdout)[0]
    lines = stdout.splitlines()
    if not lines or not lines[0].startswith("release="):
        if stdout.strip():
            raise RemoteError(f"unexpected output from the current-release probe: {lines[0]!r}")
        return None, {}
    target = lines[0][len("release="):].rstrip("/")
    release = target.rsplit("/", 1)[-1] or None
    rest = "\n".join(lines[1:]).strip()
    if not rest:
        return release, {}
    return release, manifest_hashes(rest)


def manifest_hashes(text: str) -> dict[str, str]:
    """path -> sha256 of the current release's manifest (host data: bounded, paths checked)."""
    return {p: sha for p, (sha, _) in _manifest(text).items()}


def manifest_roles(text: str) -> dict[str, list[str]]:
    """path -> the roles that restart when it changes, for the files of a manifest that have any
    (the transition model needs them to know which unit runs which role)."""
    return {p: list(roles) for p, (_, roles) in _manifest(text).items() if roles}


def _manifest(text: str) -> dict[str, tuple[str, tuple[str, ...]]]:
    from orchestrator.host_data import HostDataError, manifest_files

    try:
        return manifest_files(text, "the current release's manifest.json")
    except HostDataError as exc:
        raise RemoteError(f"the current release's manifest.json is unreadable: "
                          f"{exc.message.split(': ', 1)[-1]}",
                          fix="run `dsv4ctl status` to see the host's state") from None


def probe_current(shell: Shell, install_root: str
                  ) -> tuple[str | None, dict[str, str], dict[str, list[str]], str | None]:
    """The current release id, its files' hashes and their roles, and the newest release on the
    host (whatever its outcome)."""
    res = shell.run(current_command(install_root), timeout=30)
    if not res.ok:
        raise RemoteError(f"reading the current release failed (exit {res.rc}): {res.stderr[:300]}")
    release, hashes = parse_current(res.stdout)
    rest = "\n".join(_split_latest(res.stdout)[0].splitlines()[1:]).strip()
    return (release, hashes, manifest_roles(rest) if hashes and rest else {},
            parse_latest(res.stdout))


# -------------------------------------------------------------------------------- calibration ---

def calibration_command(install_root: str) -> str:
    path = f"{install_root.rstrip('/')}/{CALIBRATION_FILE}"
    return f"cat {shlex.quote(path)} 2>/dev/null || true"


def probe_calibration(shell: Shell, install_root: str) -> list[PoolMeasurement]:
    """The host's pool measurements (``<install_root>/calibration.json``, written by apply's
    measure step and by ``dsv4ctl calibrate``); none when the file is absent."""
    path = f"{install_root.rstrip('/')}/{CALIBRATION_FILE}"
    res = shell.run(calibration_command(install_root), timeout=30)
    if not res.ok:
        raise RemoteError(f"reading {path} failed (exit {res.rc}): {res.stderr[:300]}")
    return parse_calibration(res.stdout, where=f"{path} on the host")


def kernel_qualification_command(install_root: str) -> str:
    from orchestrator.kernel_qualification import QUALIFICATION_FILE

    path = f"{install_root.rstrip('/')}/{QUALIFICATION_FILE}"
    return f"cat {shlex.quote(path)} 2>/dev/null || true"


def probe_kernel_qualification(shell: Shell, install_root: str) -> list[KernelQualification]:
    """The host's kernel measurements (``<install_root>/kernels-qualification.json``, written by
    ``dsv4ctl qualify kernels``); none when the file is absent."""
    from orchestrator.kernel_qualification import QUALIFICATION_FILE, parse_file

    path = f"{install_root.rstrip('/')}/{QUALIFICATION_FILE}"
    res = shell.run(kernel_qualification_command(install_root), timeout=30)
    if not res.ok:
        raise RemoteError(f"reading {path} failed (exit {res.rc}): {res.stderr[:300]}")
    return parse_file(res.stdout, where=f"{path} on the host")


# ---------------------------------------------------------------------------------------- all ---

def probe_paths(host: Host, model_paths: Iterable[str] = ()) -> tuple[list[str], list[str]]:
    """Which disks and checkpoints to probe: the inventory's declared disks and models, the install
    root, and the given checkpoint paths (the profile's). Sorted and deduplicated, so a plan and the
    stale check at apply time probe exactly the same things."""
    models = sorted({*(m.path for m in host.models), *model_paths})
    disks = sorted({*(d.path for d in host.disks), host.install_root, *models})
    return disks, models


# Each batched command's stdout and stderr are capped on the host (issue 31: a probe read a
# hostile file that never ended into the shared temp directory, 66 GB): one byte past the cap is
# kept, so the size tells "cut" from "exactly the cap". A model index is a few MB.
BATCH_MAX_OUTPUT = 16 << 20
BATCH_MAX_STDERR = 64 << 10
# dsv4ctl's own directory on the host for the batch's files, the user's private runtime dir
# (0700, /run/user/UID) or their cache, never the shared temp directory
BATCH_DIR = '"${XDG_RUNTIME_DIR:-$HOME/.cache}/dsv4ctl"'


def batch_command(commands: Sequence[str], token: str) -> str:
    """One shell command running ``commands`` side by side (each with its own stdout, stderr and
    exit status, kept in dsv4ctl's own directory, capped), then printing them in order between
    ``token`` lines: every probe in one SSH round trip (issue 20 #10) instead of one each.

    The printing runs two processes in all (one ``cat`` of every part, one ``wc -c`` of every
    output, for the cap), the rest shell builtins: a ``cat``, ``$(cat)`` and ``$(wc)`` per command
    cost ~40 forks on a ten-command probe, most of a no-change apply's time on the host (issue 30)."""
    out_cap, err_cap = BATCH_MAX_OUTPUT + 1, BATCH_MAX_STDERR + 1
    jobs = "".join(f'{{ {{ {{ ( {c}\n) </dev/null; echo $? >"$d/{i}.rc"; }} 2>&1 1>&3 | '
                   f'head -c {err_cap} >"$d/{i}.err"; }} 3>&1 | head -c {out_cap} >"$d/{i}.out"; '
                   f'}} &\n' for i, c in enumerate(commands))
    # the separators are written by printf (a builtin) into files that the one cat prints between
    # the outputs; the status is read by `read` (a builtin), "" when the job left none
    marks = "".join(f"printf '%s out {i}\\n' {token} >\"$d/{i}.a\"; "
                    f"printf '\\n%s err\\n' {token} >\"$d/{i}.b\"; "
                    f"dsv4_rc=; read -r dsv4_rc 2>/dev/null <\"$d/{i}.rc\"; "
                    f"printf '\\n%s rc %s\\n' {token} \"$dsv4_rc\" >\"$d/{i}.c\"\n"
                    for i in range(len(commands)))
    parts = " ".join(f'"$d/{i}.{x}"' for i in range(len(commands))
                     for x in ("a", "out", "b", "err", "c"))
    outs = " ".join(f'"$d/{i}.out"' for i in range(len(commands)))
    sizes = f"printf '%s sizes\\n' {token}; wc -c {outs} </dev/null\n" if commands else ""
    return (f"d=$(umask 077 && mkdir -p {BATCH_DIR} && mktemp -d {BATCH_DIR}/batch.XXXXXXXX) "
            f'|| exit 1\n{jobs}wait\n{marks}'
            + (f"cat {parts}\n" if commands else "")
            + f'{sizes}rm -rf "$d"\n')


def parse_batch(stdout: str, commands: Sequence[str], token: str) -> dict[str, CommandResult]:
    """The per-command results printed by :func:`batch_command`."""
    out: dict[str, CommandResult] = {}
    body, _, trailer = stdout.rpartition(f"\n{token} sizes\n")
    if not _:
        body, trailer = stdout, ""
    # `wc -c A B ...`: "N DIR/I.out" per output (then a total line, with two or more)
    sizes = {int(m.group(2)): int(m.group(1))
             for m in re.finditer(r"(?m)^\s*(\d+) .*/(\d+)\.out$", trailer)}
    pat = re.compile(rf"(?ms)^{re.escape(token)} out (\d+)\n(.*?)\n{re.escape(token)} err\n"
                     rf"(.*?)\n{re.escape(token)} rc (\d*)$")
    for m in pat.finditer(body + "\n"):
        i = int(m.group(1))
        if i < len(commands) and sizes.get(i, 0) > BATCH_MAX_OUTPUT:
            raise RemoteError(f"a probe's output on the host passed {BATCH_MAX_OUTPUT >> 20} MiB; "
                              f"dsv4ctl cut it there and stopped: {commands[i][:120]!r}",
                              fix="something on the host answers far more than a probe asks for "
                                  "(a model index replaced by a huge file, a device): fix it")
        if i < len(commands):
            out[commands[i]] = CommandResult(commands[i], int(m.group(4) or 255),
                                             m.group(2), m.group(3))
    missing = [c for c in commands if c not in out]
    if missing:
        raise RemoteError(f"the batched probe returned no result for {len(missing)} of "
                          f"{len(commands)} commands (first: {missing[0][:80]!r})",
                          fix="run `dsv4ctl probe` to see the host's answers one by one")
    return out


class _Replay:
    """A Shell answering the batched commands from their recorded results (others go to the
    real shell), so each probe keeps its own parsing and error messages."""

    def __init__(self, shell: Shell, results: dict[str, CommandResult]) -> None:
        self.shell, self.results = shell, results

    def run(self, command: str, *, timeout: float | None = None) -> CommandResult:
        res = self.results.get(command)
        return res if res is not None else self.shell.run(command, timeout=timeout)


def facts_command(host: Host, model_paths: Iterable[str], token: str, *,
                  engine_env: str | None = None) -> str:
    """The one command :func:`collect_facts` runs (``token``: its result separator)."""
    return batch_command(_fact_commands(host, model_paths, engine_env), token)


def _fact_commands(host: Host, model_paths: Iterable[str], engine_env: str | None = None
                   ) -> list[str]:
    disk_paths, models = probe_paths(host, model_paths)
    cmds = [GPU_COMMAND, disk_command(disk_paths), model_command(models), PORTS_COMMAND,
            units_command(host.scope), current_command(host.install_root),
            calibration_command(host.install_root),
            drift_command(host.install_root, unit_dir_expr(host.scope), host.scope),
            kernel_qualification_command(host.install_root)]
    return cmds + ([engine_env_command(engine_env)] if engine_env else [])


def engine_env_command(env: str) -> str:
    """The engine environment's owner/mode check (:func:`orchestrator.remote.hostfs.
    check_engine_env`), as a probe."""
    from orchestrator.remote import hostfs

    return hostfs.check_engine_env(env)


def require_engine_env(shell: Shell, env: str, host_name: str) -> None:
    """Raise :class:`RemoteError` unless the engine environment passes its check: called before
    anything runs from it (apply's and rollback's preflight, the kernels step)."""
    refuse_untrusted_env(probe_engine_env(shell, env), host_name)


def refuse_untrusted_env(fact: EngineEnvFact, host_name: str) -> None:
    """Raise :class:`RemoteError` unless ``fact`` (the engine environment's check, as probed) says
    the environment passed."""
    if fact.problem is not None:
        raise RemoteError(
            f"dsv4ctl runs nothing from the engine environment {fact.path} on host "
            f"'{host_name}': {fact.problem}",
            fix="give the environment (and every directory above it) to root or the deploying "
                "user and chmod go-w it, or point engine.env at one that is; nothing was changed "
                "by this step")


def probe_engine_env(shell: Shell, env: str) -> EngineEnvFact:
    """Whether the engine environment passes the check, and the host's reason when it does not."""
    from orchestrator.remote import hostfs

    res = shell.run(engine_env_command(env), timeout=120)
    if res.ok:
        return EngineEnvFact(path=env)
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("dsv4ctl refuses ")]
    if res.rc == hostfs.REFUSED_RC and lines:
        return EngineEnvFact(path=env, problem=lines[-1][len("dsv4ctl refuses "):][:500])
    return EngineEnvFact(path=env, problem=f"the check could not run (exit {res.rc}): "
                                          f"{(res.stderr or res.stdout).strip()[:300]}")


def collect_facts(shell: Shell, host_name: str, host: Host, *,
                  model_paths: Iterable[str] = (), token: str | None = None,
                  engine_env: str | None = None) -> Facts:
    """Run every probe through ``shell`` in one round trip and assemble :class:`Facts`.
    ``token``: the result separator, given when the command was run ahead
    (:func:`facts_command`; apply's preflight batches it with its own reads)."""
    import secrets

    model_paths = list(model_paths)
    identity = getattr(shell, "identity", None)  # the machine reached (RemoteHost.identity)
    disk_paths, models = probe_paths(host, model_paths)
    commands = _fact_commands(host, model_paths, engine_env)
    token = token or "@@dsv4-" + secrets.token_hex(8)
    res = shell.run(batch_command(commands, token), timeout=180)
    if not res.ok:
        raise RemoteError(f"probing the host failed (exit {res.rc}): {res.stderr.strip()[:300]}")
    shell = _Replay(shell, parse_batch(res.stdout, commands, token))
    gpus, driver = probe_gpus(shell)
    variants: dict[str, str | None] = {m.path: m.variant for m in host.models}
    current, files, roles, latest = probe_current(shell, host.install_root)
    drift = probe_drift(shell, host.install_root, unit_dir_expr(host.scope), host.scope)
    return Facts(
        source="probed",
        host=host_name,
        gpus=gpus,
        driver=driver,
        disks=probe_disks(shell, disk_paths),
        models=probe_models(shell, models, variants),
        ports_in_use=probe_ports(shell),
        units=probe_units(shell, host.scope),
        current_release=current,
        current_files=files,
        calibration=probe_calibration(shell, host.install_root),
        kernel_qualification=probe_kernel_qualification(shell, host.install_root),
        current_roles=roles,
        latest_release=latest,
        engine_env=probe_engine_env(shell, engine_env) if engine_env else None,
        connection=identity,
        drift=drift.files,
        running=drift.running,
    )
