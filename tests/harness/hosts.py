"""Fake target hosts with real parts: netns + OpenSSH sshd + private mounts + `systemd --user`.

Owns bringing up and tearing down N fake hosts on this machine for integration tests, so the
orchestrator is tested over real SSH against a real service manager. Each host is:

- a network namespace `dsv4s<slot>h<i>` on the bridge `dsv4br0` (10.213.0.1/24 on the root
  side), address `10.213.0.<16 + 16*slot + i>`; nothing leaves the machine;
- a private mount namespace with `/run` a fresh tmpfs and, per host, bind mounts of host-side
  directories on the private paths (default `/srv`, holding the install root `/srv/dsv4`,
  `/opt/sglang-env`, `/models`,
  `/root/.config/systemd/user`, `/var/lib/prometheus/node-exporter`); missing mount points are
  created (empty) on the machine's own filesystem, everything else (e.g. `/tmp`, `/usr`) is shared;
- its own cgroup (`<cgroup2 root>/dsv4-harness/s<slot>h<i>`) and cgroup namespace with cgroup2
  mounted on `/sys/fs/cgroup`, so its `systemd --user` manages only its own processes: without
  this a user manager treats the machine's root cgroup as its own and migrates every process on
  the machine into `init.scope` (seen while probing), and two hosts' units of the same name would
  share a cgroup and be killed together;
- an OpenSSH sshd on port 22 (key auth, sftp) for the cluster's user (root by default;
  `HostCluster(user=NAME)`: an unprivileged user, uid 1500, that exists only in the host's mount
  namespace, owns the private paths and its cgroup subtree, and has HOME=/home/NAME), whose
  sessions get `XDG_RUNTIME_DIR=/run/user/<uid>` and a PATH with the host's fake `nvidia-smi`
  (sshd `SetEnv`), so `systemctl --user daemon-reload/start/stop/is-active/show` works over SSH;
- a real `systemd --user` of that user (units in `~/.config/systemd/user`). There is no journald:
  units should log with `StandardOutput=append:FILE`;
- the engine simulator installed as the engine env (`/opt/sglang-env/bin/sglang`,
  `/opt/sglang-env/bin/python -m sglang_router.launch_router`), control file
  `/opt/sglang-env/sim-control.json`, run log `/opt/sglang-env/sim-runs.jsonl`.

API::

    with HostCluster(n=2, workdir=tmp_path) as hosts:     # list[FakeHost]
        h = hosts[0]
        h.name, h.address, h.port, h.user, h.key_path, h.known_hosts
        h.inventory_dict()   # {"name","address","port","user","key","known_hosts","scope":"user"}
        h.exec("systemctl --user is-active x")  -> CompletedProcess (inside the host's namespaces)
        h.systemctl("start", "x.service")        -> CompletedProcess
        h.read("/srv/dsv4/current/plan.json")    -> str (raises HarnessError if missing)
        h.path("/srv/dsv4")                      -> host-side Path of a private path
        h.write_sim_control({...}); h.sim_runs(); h.set_gpus(cfg); h.url(port)
        h.stop()

Slots: each cluster holds an flock on `/run/dsv4-harness/slot-<k>.lock`, so concurrent test runs
(or xdist workers) get disjoint names and addresses, and a slot whose lock is free but whose
namespaces exist holds leftovers of a crashed run, removed before reuse. `close()` kills every
process in the host cgroups (`cgroup.kill`), deletes the namespaces, and deletes the bridge when
no other slot is in use; it runs on `__exit__` and at interpreter exit. Requires root and the
Debian packages in `requirements/apt.txt`; a missing tool raises `HarnessError` (tests fail).
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

SUBNET_PREFIX = "10.213.0"
BRIDGE = "dsv4br0"
BRIDGE_ADDR = f"{SUBNET_PREFIX}.1/24"
STATE_DIR = Path("/run/dsv4-harness")
MAX_SLOTS = 14
MAX_HOSTS = 14
ENGINE_ENV = "/opt/sglang-env"
# /srv whole, not only the install root under it: tests change the install root's parent (a
# world-writable /srv must be refused) and plant files beside it (/srv/victim); on the machine's
# own /srv that reached every other host of every concurrent test run (an xdist worker's apply
# was refused "/srv is writable by group or others" while another worker's test held it 0777).
INSTALL_ROOT = "/srv/dsv4"
DEFAULT_PRIVATE_PATHS = (
    "/srv",
    ENGINE_ENV,
    "/models",
    "/root/.config/systemd/user",
    "/var/lib/prometheus/node-exporter",
)
BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
SYSTEMD = "/lib/systemd/systemd"
REQUIRED_TOOLS = ("ip", "nsenter", "unshare", "mount", "ssh-keygen", "systemctl", "curl", "setpriv")
UNPRIVILEGED_UID = 1500  # the SSH user of a HostCluster(user=...) that is not root


class HarnessError(RuntimeError):
    """A fake host cannot be set up or used; the message says what failed and how to fix it."""


def _run(cmd: list[str], *, check: bool = True, timeout: float = 30,
         input_text: str | None = None) -> subprocess.CompletedProcess[str]:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                              input=input_text)
    except FileNotFoundError as exc:
        raise HarnessError(f"command not found: {cmd[0]} ({exc}); install "
                           "requirements/apt.txt") from exc
    if check and proc.returncode != 0:
        raise HarnessError(f"command failed (rc {proc.returncode}): {shlex.join(cmd)}\n"
                           f"stdout: {proc.stdout.strip()}\nstderr: {proc.stderr.strip()}")
    return proc


def check_prerequisites() -> None:
    """Raise HarnessError naming every missing tool or privilege."""
    problems = []
    if os.geteuid() != 0:
        problems.append("must run as root (network/mount namespaces, cgroups)")
    for tool in REQUIRED_TOOLS:
        if shutil.which(tool) is None:
            problems.append(f"`{tool}` not on PATH")
    if _sshd_path() is None:
        problems.append("OpenSSH server `sshd` not found (Debian package openssh-server)")
    if not os.access(SYSTEMD, os.X_OK):
        problems.append(f"{SYSTEMD} not found (Debian package systemd)")
    if problems:
        raise HarnessError("fake hosts cannot start: " + "; ".join(problems)
                           + ". Fix: run as root and `apt-get install -y $(cat "
                             "requirements/apt.txt)`")


def _sshd_path() -> str | None:
    found = shutil.which("sshd")
    if found:
        return found
    return "/usr/sbin/sshd" if os.access("/usr/sbin/sshd", os.X_OK) else None


def cgroup2_root() -> Path:
    """Mount point of the cgroup v2 hierarchy (mounted under STATE_DIR if the system has none)."""
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        if right.split(" ", 1)[0] == "cgroup2":
            return Path(left.split()[4])
    mnt = STATE_DIR / "cgroup2"
    mnt.mkdir(parents=True, exist_ok=True)
    _run(["mount", "-t", "cgroup2", "cgroup2", str(mnt)])
    return mnt


def _kill_cgroup(cg: Path, timeout: float = 10) -> None:
    """Kill every process in cgroup `cg` (and below) and remove the cgroup directories."""
    if not cg.exists():
        return
    kill_file = cg / "cgroup.kill"
    deadline = time.monotonic() + timeout
    while True:
        pids = []
        for procs in cg.rglob("cgroup.procs"):
            with contextlib.suppress(OSError):
                pids += [int(p) for p in procs.read_text().split()]
        if not pids:
            break
        if kill_file.exists():
            with contextlib.suppress(OSError):
                kill_file.write_text("1")
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if time.monotonic() > deadline:
            raise HarnessError(f"processes {pids} in {cg} survive SIGKILL")
        time.sleep(0.05)
    for d in sorted((p for p in cg.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
        with contextlib.suppress(OSError):
            d.rmdir()
    with contextlib.suppress(OSError):
        cg.rmdir()


def _wait_port(addr: str, port: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((addr, port), timeout=0.5) as s:
                if s.recv(4).startswith(b"SSH"):
                    return
        except OSError as exc:
            last = exc
        time.sleep(0.05)
    raise HarnessError(f"nothing answers SSH on {addr}:{port} after {timeout}s ({last})")


class FakeHost:
    """One fake target host (see the module docstring for what it contains)."""

    def __init__(self, cluster: HostCluster, index: int) -> None:
        self.cluster = cluster
        self.index = index
        slot = cluster.slot
        self.name = f"host{index}"
        self.netns = f"dsv4s{slot}h{index}"
        self.veth = f"dsv4s{slot}h{index}"
        self.address = f"{SUBNET_PREFIX}.{16 + 16 * slot + index}"
        self.port = 22
        self.user = cluster.user
        self.uid = 0 if self.user == "root" else UNPRIVILEGED_UID
        self.home = "/root" if self.uid == 0 else f"/home/{self.user}"
        self.dir = cluster.workdir / self.name
        self.key_path = cluster.key_path
        self.known_hosts = cluster.known_hosts
        self.bin_dir = self.dir / "bin"
        self.ssh_dir = self.dir / "ssh"
        self.log_dir = self.dir / "logs"
        self.cgroup = cluster.cg_parent / f"s{slot}h{index}"
        self.engine_env = ENGINE_ENV
        self.anchor: subprocess.Popen[str] | None = None
        self.systemd: subprocess.Popen[bytes] | None = None
        # an unprivileged user cannot reach bin_dir under pytest's 0700 temp dir: bind it at /run
        self.path_env = f"{self.bin_dir if self.uid == 0 else '/run/dsv4-bin'}:{BASE_PATH}"

    # -- paths -----------------------------------------------------------------------------
    def path(self, private_path: str) -> Path:
        """Host-side directory backing `private_path` (or a file under it) on this host."""
        p = Path(private_path)
        for root in self.cluster.private_paths:
            r = Path(root)
            if p == r or r in p.parents:
                return self.dir / "fs" / str(r).strip("/").replace("/", "__") / p.relative_to(r)
        raise HarnessError(f"{private_path} is not under a private path of {self.name} "
                           f"({list(self.cluster.private_paths)}); use exec()/read() instead")

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        for d in (self.bin_dir, self.ssh_dir, self.log_dir):
            d.mkdir(parents=True, exist_ok=True)
        self._net_up()
        self._anchor_up()
        self._install_sim()
        self._hand_over()
        self._sshd_up()
        self._systemd_up()

    def _net_up(self) -> None:
        _run(["ip", "netns", "add", self.netns])
        _run(["ip", "link", "add", self.veth, "type", "veth", "peer", "name", "eth0",
              "netns", self.netns])
        _run(["ip", "link", "set", self.veth, "master", BRIDGE, "up"])
        _run(["ip", "-n", self.netns, "addr", "add", f"{self.address}/24", "dev", "eth0"])
        _run(["ip", "-n", self.netns, "link", "set", "eth0", "up"])
        _run(["ip", "-n", self.netns, "link", "set", "lo", "up"])
        self._forget_neighbour()

    def _forget_neighbour(self) -> None:
        """Drop the machine's ARP entry for this host's address. The address belongs to the slot,
        so the previous host of the slot (a cluster that just closed) left an entry with its own
        MAC; while that entry stays REACHABLE (15-45 s after its last use, then 8 s of probes) the
        machine sends to a MAC that no longer exists and the new host does not answer, which made
        sshd bring-up miss its 30 s wait whenever a slot was reused at once."""
        _run(["ip", "neigh", "flush", "to", self.address, "dev", BRIDGE], check=False)

    def _anchor_up(self) -> None:
        self.cgroup.mkdir(parents=True, exist_ok=True)
        binds = []
        for root in self.cluster.private_paths:
            src = self.path(root)
            src.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(HarnessError):  # a cluster whose private paths lack it
            self.path(INSTALL_ROOT).mkdir(parents=True, exist_ok=True)
        for root in self.cluster.private_paths:
            src = self.path(root)
            Path(root).mkdir(parents=True, exist_ok=True)  # mount point on the shared fs
            binds.append(f"mkdir -p {shlex.quote(root)} && "
                         f"mount --bind {shlex.quote(str(src))} {shlex.quote(root)}")
        setup = "\n".join([
            "set -e",
            "mount --make-rprivate /",
            "mount -t sysfs sysfs /sys",
            "mount -t cgroup2 cgroup2 /sys/fs/cgroup",
            "mount -t tmpfs -o mode=755 tmpfs /run",
            f"mkdir -p /run/sshd /run/systemd/system /run/user/{self.uid} /run/lock",
            # What a booted host's /run/systemd has and this fresh /run lacks, which units with
            # mount namespaces (the PrivateUsers= sandbox of user scope) need, else they fail with
            # status 226/NAMESPACE: unit-root, the mount point systemd 252 builds a unit's
            # namespace on (src/core/namespace.c, setup_namespace; made by the first such unit, as
            # root: a user manager's unit cannot create it), and the inaccessible nodes that PID 1
            # makes at boot (src/shared/mount-setup.c, make_inaccessible_nodes) and that a root
            # manager bind-mounts over what ProtectKernelTunables=/Logs= hide.
            "mkdir -m 0700 /run/systemd/unit-root",
            "mkdir -m 0755 /run/systemd/inaccessible",
            "mkdir -m 0000 /run/systemd/inaccessible/dir",
            "install -m 0000 /dev/null /run/systemd/inaccessible/reg",
            "mkfifo -m 0000 /run/systemd/inaccessible/fifo",
            "mknod -m 0000 /run/systemd/inaccessible/chr c 0 0",
            "mknod -m 0000 /run/systemd/inaccessible/blk b 0 0",
            *self._unprivileged_setup(),
            *binds,
            *self._unprivileged_identity(),
            "echo READY",
            "exec sleep infinity",
        ])
        outer = (f"echo $$ > {shlex.quote(str(self.cgroup / 'cgroup.procs'))} && exec unshare "
                 f"--mount --cgroup --propagation private -- nsenter "
                 f"--net=/run/netns/{self.netns} -- sh -c {shlex.quote(setup)}")
        self.anchor = subprocess.Popen(["sh", "-c", outer], stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE, text=True,
                                       start_new_session=True)
        assert self.anchor.stdout is not None
        line = self.anchor.stdout.readline().strip()
        if line != "READY":
            err = self.anchor.stderr.read() if self.anchor.poll() is not None else ""
            raise HarnessError(f"{self.name}: namespace setup failed: {line!r} {err.strip()}")

    # -- an unprivileged SSH user (HostCluster(user=...)): nothing changes on the machine itself;
    # the user exists only in this host's mount namespace (its own /etc/passwd and /etc/group) ---
    def _unprivileged_setup(self) -> list[str]:
        """Before the private binds: the base Python lives under /root (0700 on this machine),
        which the user cannot traverse; /root becomes a tmpfs with only that prefix bound back."""
        if self.uid == 0:
            return ["chmod 700 /run/user/0"]
        prefix = Path(sys.base_prefix).resolve()
        lines = [f"chown {self.uid}:{self.uid} /run/user/{self.uid}",
                 f"chmod 700 /run/user/{self.uid}",
                 "mkdir -p /run/dsv4-bin /run/dsv4-ssh",
                 f"mount --bind {shlex.quote(str(self.bin_dir))} /run/dsv4-bin",
                 # sshd reads authorized_keys with the user's privileges
                 f"mount --bind {shlex.quote(str(self.ssh_dir))} /run/dsv4-ssh"]
        if Path("/root") in prefix.parents:
            q = shlex.quote(str(prefix))
            lines += ["mkdir -p /run/.pyprefix", f"mount --bind {q} /run/.pyprefix",
                      "mount -t tmpfs -o mode=755 tmpfs /root",
                      f"mkdir -p {q}", f"mount --bind /run/.pyprefix {q}"]
        return lines

    def _unprivileged_identity(self) -> list[str]:
        if self.uid == 0:
            return []
        passwd, group = self.dir / "passwd", self.dir / "group"
        passwd.write_text(Path("/etc/passwd").read_text()
                          + f"{self.user}:x:{self.uid}:{self.uid}::{self.home}:/bin/bash\n")
        group.write_text(Path("/etc/group").read_text() + f"{self.user}:x:{self.uid}:\n")
        for f in (passwd, group):
            f.chmod(0o644)
        return [f"mount --bind {shlex.quote(str(passwd))} /etc/passwd",
                f"mount --bind {shlex.quote(str(group))} /etc/group"]

    def _hand_over(self) -> None:
        """The user owns its home, the install root, the engine env, the models and textfile dirs,
        and its cgroup subtree (delegation, so its `systemd --user` can manage it)."""
        if self.uid == 0:
            return
        for root in self.cluster.private_paths:
            _run(["chown", "-R", f"{self.uid}:{self.uid}", str(self.path(root))])
        _run(["chown", "-R", f"{self.uid}:{self.uid}", str(self.cgroup)])

    def _nsenter_argv(self, argv: list[str]) -> list[str]:
        """argv run inside this host's namespaces and cgroup."""
        assert self.anchor is not None
        procs = self.cgroup / "cgroup.procs"
        fallback = self.cgroup / "init.scope" / "cgroup.procs"
        wrapper = (f"echo $$ > {shlex.quote(str(procs))} 2>/dev/null || "
                   f"echo $$ > {shlex.quote(str(fallback))}; "
                   f'exec nsenter -t {self.anchor.pid} -m -n -C -- "$@"')
        return ["sh", "-c", wrapper, "nsenter-wrapper", *argv]

    def _env(self, extra: dict[str, str] | None = None, *, root: bool = False) -> list[str]:
        uid, user, home = (0, "root", "/root") if root else (self.uid, self.user, self.home)
        env = {"HOME": home, "USER": user, "LOGNAME": user, "LANG": "C.UTF-8",
               "XDG_RUNTIME_DIR": f"/run/user/{uid}", "PATH": self.path_env,
               "DSV4_FAKE_HOST": self.name}
        env.update(extra or {})
        drop = [] if uid == 0 else ["setpriv", f"--reuid={uid}", f"--regid={uid}",
                                    "--clear-groups", "--"]
        return [*drop, "env", "-i", *[f"{k}={v}" for k, v in env.items()]]

    def exec(self, cmd: str, *, check: bool = False, timeout: float = 60,
             env: dict[str, str] | None = None, root: bool = False
             ) -> subprocess.CompletedProcess[str]:
        """Run `cmd` with bash inside the host as its SSH user would (``root=True``: as root, for
        what only an administrator may do, e.g. planting files outside the user's reach)."""
        argv = self._nsenter_argv([*self._env(env, root=root), "bash", "-c", cmd])
        proc = _run(argv, check=False, timeout=timeout)
        if check and proc.returncode != 0:
            raise HarnessError(f"{self.name}: `{cmd}` failed (rc {proc.returncode}): "
                               f"{proc.stderr.strip() or proc.stdout.strip()}")
        return proc

    def systemctl(self, *args: str, check: bool = False) -> subprocess.CompletedProcess[str]:
        return self.exec("systemctl --user " + shlex.join(args), check=check)

    def read(self, path: str) -> str:
        proc = self.exec(f"cat {shlex.quote(path)}")
        if proc.returncode != 0:
            raise HarnessError(f"{self.name}: cannot read {path}: {proc.stderr.strip()}")
        return proc.stdout

    def _install_sim(self) -> None:
        from tests.sim import install_engine_env, install_fake_nvidia_smi

        install_engine_env(self.path(ENGINE_ENV), self.cluster.python,
                           runtime_prefix=Path(ENGINE_ENV))
        install_fake_nvidia_smi(self.bin_dir, self.cluster.python, self.cluster.gpus)

    def _sshd_up(self) -> None:
        key = self.ssh_dir / "host_ed25519"
        if not key.exists():
            _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", self.name, "-f", str(key)])
        shutil.copy(self.cluster.key_path.with_suffix(".pub"), self.ssh_dir / "authorized_keys")
        (self.ssh_dir / "authorized_keys").chmod(0o600)
        keys = str(self.ssh_dir / "authorized_keys")
        if self.uid != 0:
            os.chown(self.ssh_dir / "authorized_keys", self.uid, self.uid)
            keys = "/run/dsv4-ssh/authorized_keys"
        conf = self.ssh_dir / "sshd_config"
        conf.write_text("\n".join([
            "Port 22", "ListenAddress 0.0.0.0",
            f"HostKey {key}", f"PidFile {self.ssh_dir / 'sshd.pid'}",
            f"AuthorizedKeysFile {keys}",
            "PermitRootLogin prohibit-password", "PubkeyAuthentication yes",
            "PasswordAuthentication no", "KbdInteractiveAuthentication no", "UsePAM no",
            "StrictModes no", "Subsystem sftp internal-sftp", "MaxStartups 100:30:200",
            "MaxSessions 100", "UseDNS no", "LogLevel INFO",
            # Sessions need the user manager's runtime dir and the fake nvidia-smi.
            f"SetEnv XDG_RUNTIME_DIR=/run/user/{self.uid} PATH={self.path_env} "
            f"DSV4_FAKE_HOST={self.name}",
            "",
        ]))
        sshd = _sshd_path()
        assert sshd is not None
        _run(self._nsenter_argv([sshd, "-t", "-f", str(conf)]))
        _run(self._nsenter_argv([sshd, "-f", str(conf), "-E", str(self.log_dir / "sshd.log")]))
        _wait_port(self.address, 22, 30)  # generous: 2-core CI machines under a loaded suite
        pub = (key.with_suffix(".pub")).read_text().split()
        with open(self.known_hosts, "a") as fh:
            fh.write(f"{self.address} {pub[0]} {pub[1]}\n")

    def _systemd_up(self) -> None:
        # Refuse to start a user manager that could see the machine's root cgroup (see module doc).
        guard = ('[ "$(stat -f -c %T /sys/fs/cgroup)" = cgroup2fs ] && '
                 "grep -qx '0::/' /proc/self/cgroup || "
                 "{ echo 'refusing to start systemd --user outside a private cgroup' >&2; "
                 "exit 97; }; "
                 f"exec {SYSTEMD} --user")
        with open(self.log_dir / "systemd.log", "ab") as log:
            self.systemd = subprocess.Popen(
                self._nsenter_argv([*self._env(), "sh", "-c", guard]), stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 20
        state = ""
        while time.monotonic() < deadline:
            if self.systemd.poll() is not None:
                raise HarnessError(f"{self.name}: systemd --user exited with "
                                   f"{self.systemd.returncode}; see {self.log_dir}/systemd.log")
            state = self.exec("systemctl --user is-system-running").stdout.strip()
            if state in ("running", "degraded"):
                return
            time.sleep(0.1)
        raise HarnessError(f"{self.name}: systemd --user not running after 20 s (state "
                           f"{state!r}); see {self.log_dir}/systemd.log")

    def stop(self) -> None:
        """Kill everything on this host and delete its namespaces (idempotent)."""
        _kill_cgroup(self.cgroup)
        for p in (self.systemd, self.anchor):
            if p is not None:
                if p.poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(p.pid, signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.wait(timeout=5)
        if self.anchor is not None and self.anchor.stdout is not None:
            self.anchor.stdout.close()
            self.anchor.stderr.close()  # type: ignore[union-attr]
        self.systemd = self.anchor = None
        _run(["ip", "netns", "del", self.netns], check=False)
        _run(["ip", "link", "del", self.veth], check=False)
        self._forget_neighbour()

    # -- conveniences for tests --------------------------------------------------------------
    def inventory_dict(self) -> dict[str, Any]:
        """What an inventory entry needs to reach this host."""
        return {"name": self.name, "address": self.address, "port": self.port,
                "user": self.user, "key": str(self.key_path),
                "known_hosts": str(self.known_hosts), "scope": "user"}

    def connect_kwargs(self) -> dict[str, Any]:
        """kwargs for `fabric.Connection(host.address, **host.connect_kwargs())`."""
        return {"user": self.user, "port": self.port, "connect_timeout": 10,
                "connect_kwargs": {"key_filename": str(self.key_path), "look_for_keys": False,
                                   "allow_agent": False}}

    def url(self, port: int, path: str = "") -> str:
        return f"http://{self.address}:{port}{path}"

    def write_sim_control(self, data: dict[str, Any]) -> None:
        """Validate and write the simulator control file (read by each process at start)."""
        from tests.sim import control

        target = self.path(ENGINE_ENV) / "sim-control.json"
        tmp = target.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=2))
        control.load_control(tmp)
        os.replace(tmp, target)
        # rule counters live beside the control file, or in a sandboxed unit's logs folder
        # (tests/sim/control.py state_dir): a new control file starts them all from zero
        for state in (self.dir / "fs").glob(f"**/{target.name}.state.json"):
            state.unlink()

    def sim_runs(self) -> list[dict[str, Any]]:
        """Every simulator/router start on this host, oldest first: the engine env's run log and
        those that sandboxed units (read-only engine env) keep in their logs folder."""
        runs = [json.loads(line) for f in (self.dir / "fs").glob("**/sim-runs.jsonl")
                for line in f.read_text().splitlines() if line.strip()]
        return sorted(runs, key=lambda r: r.get("time", 0.0))

    def set_gpus(self, config: dict[str, Any]) -> None:
        """Replace the GPU list the fake nvidia-smi reports (see tests/sim/nvidia_smi.py)."""
        (self.bin_dir / "nvidia-smi.json").write_text(json.dumps(config, indent=2))


class HostCluster:
    """N fake hosts sharing a client key and a known_hosts file (see module docstring)."""

    def __init__(self, n: int, workdir: Path, *, python: str | None = None,
                 private_paths: tuple[str, ...] = DEFAULT_PRIVATE_PATHS,
                 gpus: dict[str, Any] | None = None, user: str = "root") -> None:
        if not 1 <= n <= MAX_HOSTS:
            raise HarnessError(f"HostCluster n={n}: must be between 1 and {MAX_HOSTS}")
        for p in private_paths:
            if not p.startswith("/") or p.rstrip("/") in ("", "/run", "/sys", "/proc", "/tmp"):
                raise HarnessError(f"private path {p!r} must be absolute and not /, /run, "
                                   "/sys, /proc or /tmp")
        if not re.fullmatch(r"[a-z_][a-z0-9_-]{0,31}", user):
            raise HarnessError(f"HostCluster user={user!r}: not a user name")
        self.user = user
        if user != "root":  # its home, with ~/.config/systemd/user, is private to each host
            private_paths = (*private_paths, f"/home/{user}")
        self.n = n
        self.workdir = Path(workdir).resolve()
        self.python = python or sys.executable
        self.private_paths = tuple(p.rstrip("/") for p in private_paths)
        self.gpus = gpus
        self.hosts: list[FakeHost] = []
        self.slot = -1
        self._slot_fh: Any = None
        self.key_path = self.workdir / "client_ed25519"
        self.known_hosts = self.workdir / "known_hosts"
        self.cg_parent = Path("/")
        self._closed = True

    def __enter__(self) -> list[FakeHost]:
        self.start()
        return self.hosts

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> list[FakeHost]:
        check_prerequisites()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._closed = False
        atexit.register(self.close)
        try:
            self._acquire_slot()
            self.cg_parent = cgroup2_root() / "dsv4-harness"
            self.cg_parent.mkdir(exist_ok=True)
            self._clean_slot()
            self._bridge_up()
            if not self.key_path.exists():
                _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "dsv4-tests",
                      "-f", str(self.key_path)])
            self.known_hosts.write_text("")
            for i in range(1, self.n + 1):
                host = FakeHost(self, i)
                self.hosts.append(host)
                host.start()
        except BaseException:
            self.close()
            raise
        return self.hosts

    def _acquire_slot(self) -> None:
        STATE_DIR.mkdir(parents=True, exist_ok=True)
        for k in range(MAX_SLOTS):
            fh = open(STATE_DIR / f"slot-{k}.lock", "a+")  # noqa: SIM115 - held while in use
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                fh.close()
                continue
            fh.seek(0)
            fh.truncate()
            fh.write(f"pid {os.getpid()} workdir {self.workdir}\n")
            fh.flush()
            self.slot, self._slot_fh = k, fh
            return
        raise HarnessError(f"all {MAX_SLOTS} harness slots in {STATE_DIR} are in use")

    def _clean_slot(self) -> None:
        """Remove leftovers of a crashed run that used this slot."""
        pat = re.compile(rf"^dsv4s{self.slot}h\d+$")
        for cg in self.cg_parent.glob(f"s{self.slot}h*"):
            _kill_cgroup(cg)
        names = [ln.split()[0] for ln in _run(["ip", "netns", "list"]).stdout.splitlines()
                 if ln.strip()]
        for ns in names:
            if pat.match(ns):
                for pid in _run(["ip", "netns", "pids", ns], check=False).stdout.split():
                    with contextlib.suppress(ProcessLookupError, ValueError):
                        os.kill(int(pid), signal.SIGKILL)
                _run(["ip", "netns", "del", ns], check=False)
        links = _run(["ip", "-o", "link", "show"]).stdout
        for name in re.findall(rf"^\d+: (dsv4s{self.slot}h\d+)[@:]", links, re.M):
            _run(["ip", "link", "del", name], check=False)

    def _bridge_up(self) -> None:
        with open(STATE_DIR / "bridge.lock", "a+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if _run(["ip", "link", "show", BRIDGE], check=False).returncode != 0:
                _run(["ip", "link", "add", BRIDGE, "type", "bridge"])
            addrs = _run(["ip", "-o", "addr", "show", "dev", BRIDGE]).stdout
            if BRIDGE_ADDR.split("/")[0] + "/" not in addrs:
                _run(["ip", "addr", "add", BRIDGE_ADDR, "dev", BRIDGE])
            _run(["ip", "link", "set", BRIDGE, "up"])

    def _bridge_down_if_unused(self) -> None:
        with open(STATE_DIR / "bridge.lock", "a+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            for k in range(MAX_SLOTS):
                if k == self.slot:
                    continue
                path = STATE_DIR / f"slot-{k}.lock"
                if not path.exists():
                    continue
                with open(path, "a+") as fh:
                    try:
                        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    except BlockingIOError:
                        return  # another cluster uses the bridge
            _run(["ip", "link", "del", BRIDGE], check=False)

    def close(self) -> None:
        """Tear everything down; safe to call twice and after a failed start."""
        if self._closed:
            return
        self._closed = True
        errors = []
        for host in reversed(self.hosts):
            try:
                host.stop()
            except Exception as exc:  # keep cleaning the others
                errors.append(f"{host.name}: {exc}")
        if self.slot >= 0:
            self._bridge_down_if_unused()
            self._slot_fh.close()
            self.slot = -1
        atexit.unregister(self.close)
        if errors:
            raise HarnessError("cleanup problems: " + "; ".join(errors))
