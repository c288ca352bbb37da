"""The releases directory on a host: list, read and write records, upload a tree, switch, prune.

Every write is atomic on the host: files go to a temp name and are renamed into place; a release
tree is unpacked into ``releases/.tmp-<id>`` and only renamed to ``releases/<id>`` once its manifest
verifies; ``current`` is switched with ``ln -sfn`` to a temp link and ``mv -T`` over the old one
(rename(2) is atomic), the Capistrano idiom. A dropped connection at any point leaves ``current``
pointing at a complete release. Past ~400 lines: every change to the releases directory is here so
that each follows the same atomic protocol; the seam is the per-release secrets files
(``secrets_body`` and the env quoting) into their own module.
"""

from __future__ import annotations

import hashlib
import io
import re
import secrets
import shlex
import tarfile
from collections.abc import Callable, Iterable, Mapping
from typing import Protocol

from orchestrator.errors import RemoteError
from orchestrator.host_data import HostDataError
from orchestrator.planner_model import PlannedFile
from orchestrator.release.prune import select_prunable
from orchestrator.release.record import ReleaseRecord
from orchestrator.release_ids import is_release_id, sequence, sort_ids
from orchestrator.remote import hostfs
from orchestrator.remote.probes import MARK, CommandResult, manifest_hashes

MANIFEST = "manifest.json"
RECORD = "record.json"
PLAN = "plan.json"
PROFILE = "profile.yaml"


class HostShell(Protocol):
    name: str

    def run(self, command: str, *, timeout: float | None = None) -> CommandResult: ...

    def check(self, command: str, *, timeout: float | None = None, what: str = "") -> str: ...

    def put_bytes(self, data: bytes, remote_path: str, *, mode: int = 0o644,
                  chunk: int = 1 << 16,
                  on_progress: Callable[[int, int], None] | None = None) -> None: ...

    def replace_bytes(self, data: bytes, remote_path: str, *, mode: int = 0o644) -> None: ...


def build_tarball(files: Mapping[str, tuple[bytes, int]]) -> bytes:
    """A deterministic gzip'd tar of the release tree (sorted, fixed mtime/owner)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=6) as tar:
        dirs: set[str] = set()
        for path in sorted(files):
            parts = path.split("/")[:-1]
            for i in range(1, len(parts) + 1):
                d = "/".join(parts[:i])
                if d not in dirs:
                    dirs.add(d)
                    info = tarfile.TarInfo(d)
                    info.type = tarfile.DIRTYPE
                    info.mode = 0o755
                    tar.addfile(info)
            data, mode = files[path]
            info = tarfile.TarInfo(path)
            info.size = len(data)
            info.mode = mode
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def release_files(files: Iterable[PlannedFile]) -> dict[str, tuple[bytes, int, list[str]]]:
    """The planned files as bytes, refusing unsafe paths (a plan file is input)."""
    out: dict[str, tuple[bytes, int, list[str]]] = {}
    for f in files:
        if f.content is None:
            continue
        parts = f.path.split("/")
        if f.path.startswith("/") or any(p in ("", ".", "..") for p in parts):
            raise RemoteError(f"refusing planned file with unsafe path {f.path!r}",
                              fix="re-create the plan with `dsv4ctl plan -o`")
        data = f.content.encode("utf-8")
        if hashlib.sha256(data).hexdigest() != f.sha256:
            raise RemoteError(f"planned file {f.path} does not match its sha256 (edited plan?)",
                              fix="re-create the plan with `dsv4ctl plan -o`")
        out[f.path] = (data, f.mode, list(f.roles))
    return out


class ReleaseStore:
    def __init__(self, shell: HostShell, install_root: str) -> None:
        self.shell = shell
        self.root = install_root.rstrip("/") or "/"
        self.releases = f"{self.root}/releases"
        self._dirs: set[str] = set()
        # separates the files :meth:`read_files` prints; random, so no file content can forge a
        # boundary, and fixed per store, so the command can be run ahead (apply.prefetch)
        self.token = "@@dsv4-" + secrets.token_hex(8)

    def q(self, *parts: str) -> str:
        return shlex.quote("/".join((self.root, *parts)))

    def path(self, release_id: str, *parts: str) -> str:
        return "/".join((self.releases, release_id, *parts))

    # ------------------------------------------------------------------------------ reading ---
    def mkdirs(self, *rels: str, mode: str = "0755", what: str = "") -> None:
        """Create (or check) directories under the install root, never through a symbolic link
        (:mod:`orchestrator.remote.hostfs`)."""
        self.shell.check(hostfs.ensure_dirs(self.root, *rels, mode=mode), timeout=30,
                         what=what or f"creating {', '.join(rels)} under {self.root}")

    def ensure_layout(self, *, clean: bool = False) -> None:
        """``releases/`` exists; with ``clean``, leftovers of interrupted uploads are removed in
        the same round trip (see :meth:`clean_temp`; one round trip less in preflight)."""
        self.shell.check(self.ensure_layout_command(clean=clean), timeout=120,
                         what=f"creating releases/ under {self.root}")

    def ensure_layout_command(self, *, clean: bool = False) -> str:
        rm = (f" && rm -rf {shlex.quote(self.releases)}/.tmp-* {self.q('.incoming')}"
              if clean else "")
        return hostfs.ensure_dirs(self.root, "releases") + rm

    def list_ids(self) -> list[str]:
        res = self.shell.run(f"ls -1 {shlex.quote(self.releases)} 2>/dev/null", timeout=30)
        return sort_ids(x.strip() for x in res.stdout.splitlines() if is_release_id(x.strip()))

    def current_command(self) -> str:
        return f"readlink {self.q('current')}"

    def current(self) -> str | None:
        res = self.shell.run(self.current_command(), timeout=30)
        if not res.ok or not res.stdout.strip():
            return None
        name = res.stdout.strip().rstrip("/").rsplit("/", 1)[-1]
        return name if is_release_id(name) else None

    def read_records(self) -> list[ReleaseRecord]:
        """Every release's record, oldest first. A missing or unreadable record is reported as
        such, never silently dropped."""
        out = self.shell.check(self.records_command(), timeout=60, what="reading release records")
        records: list[ReleaseRecord] = []
        sections: list[tuple[str, list[str]]] = []
        for line in out.splitlines():
            if line.startswith(MARK):
                sections.append((line[len(MARK):], []))
            elif sections:
                sections[-1][1].append(line)
        for name, lines in sections:
            if not is_release_id(name):
                continue
            text = "\n".join(lines).strip()
            try:
                rec = ReleaseRecord.from_host(text, f"{RECORD} of {name}")
                if rec.id != name:  # a record naming another release is not this one's
                    raise HostDataError(f"{RECORD} of {name} names release {rec.id}")
                records.append(rec)
            except HostDataError:
                records.append(ReleaseRecord(
                    id=name, created="?", host=self.shell.name, deployment="?", profile_name="?",
                    plan_id="?", base_release=None, status="failed",
                    reason="record missing or unreadable",
                ))
        return sorted(records, key=lambda r: sequence(r.id))

    def records_command(self) -> str:
        return (f"cd {shlex.quote(self.releases)} 2>/dev/null || exit 0; for d in r*; do "
                f"[ -d \"$d\" ] || continue; printf '{MARK}%s\\n' \"$d\"; "
                f"cat \"$d/{RECORD}\" 2>/dev/null; printf '\\n'; done")

    def read_record(self, release_id: str) -> ReleaseRecord:
        text = self.shell.check(f"cat {shlex.quote(self.path(release_id, RECORD))}", timeout=30,
                                what=f"reading the record of {release_id}")
        return ReleaseRecord.from_host(text, f"{RECORD} of {release_id} on host "
                                             f"'{self.shell.name}'")

    def read_file(self, release_id: str, rel: str) -> str:
        return self.shell.check(f"cat {shlex.quote(self.path(release_id, rel))}", timeout=60,
                                what=f"reading {rel} of {release_id}")

    def read_files(self, release_id: str, rels: list[str]) -> dict[str, str]:
        """Several files of a release in one round trip (apply's preflight reads three)."""
        token = self.token
        out = self.shell.check(self.read_files_command(release_id, rels), timeout=60,
                               what=f"reading {', '.join(rels)} of {release_id}")
        parts = out.split(token + " ")[1:]
        got = {}
        for part in parts:
            name, _, body = part.partition("\n")
            got[name] = body[:-1] if body.endswith("\n") else body
        if sorted(got) != sorted(rels):
            raise RemoteError(f"reading {', '.join(rels)} of {release_id} on host "
                              f"'{self.shell.name}' returned {sorted(got)}")
        return got

    def read_files_command(self, release_id: str, rels: list[str]) -> str:
        d = shlex.quote(self.path(release_id))
        names = " ".join(shlex.quote(r) for r in rels)
        return (f"cd {d} && for f in {names}; do printf '%s %s\\n' {self.token} \"$f\"; "
                f"cat -- \"$f\" || exit 1; printf '\\n'; done")

    def manifest(self, release_id: str) -> dict[str, str]:
        return manifest_hashes(self.read_file(release_id, MANIFEST))

    def read_release(self, release_id: str) -> tuple[dict[str, tuple[str, tuple[str, ...]]],
                                                     str, str]:
        """A release's manifest (checked host data: path -> (sha256, restart roles)), its
        plan.json and its profile.yaml, in one round trip (:meth:`read_files`, which apply's
        preflight reads ahead under the lock). The store is the one reader of manifest.json."""
        from orchestrator.host_data import manifest_files

        text = self.read_files(release_id, [MANIFEST, PLAN, PROFILE])
        files = manifest_files(text[MANIFEST], f"{release_id}/{MANIFEST} on host "
                                               f"'{self.shell.name}'")
        return files, text[PLAN], text[PROFILE]

    def verify_files(self, release_id: str) -> list[str]:
        """Each file of the release that differs from its manifest: 'PATH modified' or 'PATH
        missing' (a launch script edited on the host, say), checked on the host."""
        script = ("import json,hashlib,sys\nm=json.load(open('" + MANIFEST + "'))\n"
                  "for p,v in sorted(m['files'].items()):\n"
                  "  h=v.get('sha256')\n"
                  "  try: d=hashlib.sha256(open(p,'rb').read()).hexdigest()\n"
                  "  except OSError: d=None\n"
                  "  if h and d!=h: print(p, 'missing' if d is None else 'modified')\n")
        res = self.shell.run(f"cd {shlex.quote(self.path(release_id))} && python3 -c "
                             + shlex.quote(script), timeout=60)
        return [line for line in res.stdout.splitlines() if line.strip()]

    def exists(self, release_id: str, rel: str = MANIFEST) -> bool:
        return self.shell.run(f"[ -e {shlex.quote(self.path(release_id, rel))} ]", timeout=30).ok

    # ------------------------------------------------------------------------------ writing ---
    def write_record(self, record: ReleaseRecord) -> None:
        """Rewrite ``releases/<id>/record.json`` atomically (called after every step)."""
        d = self.path(record.id)
        if record.id not in self._dirs:
            self.mkdirs(f"releases/{record.id}", what="creating the release dir")
            self._dirs.add(record.id)
        self.shell.replace_bytes(record.to_json().encode(), f"{d}/{RECORD}", mode=0o644)

    def clean_temp(self) -> None:
        """Remove leftovers of interrupted uploads (never a release that current points to)."""
        self.shell.run(f"rm -rf {shlex.quote(self.releases)}/.tmp-* {self.q('.incoming')}",
                       timeout=120)

    def upload(self, release_id: str, files: Mapping[str, tuple[bytes, int]],
               manifest_sha: Mapping[str, str],
               on_progress: Callable[[int, int], None] | None = None) -> None:
        """Upload the tree as one tarball, unpack into ``.tmp-<id>``, verify every file's sha256
        against the manifest on the host, then move it into ``releases/<id>/`` (next to the record
        that is already there)."""
        tmp = f"{self.releases}/.tmp-{release_id}"
        incoming = f"{self.root}/.incoming"
        tgz = f"{incoming}/{release_id}.tar.gz"
        self.mkdirs(".incoming", "releases", what="preparing the upload")
        self.shell.check(f"rm -rf {shlex.quote(tmp)}", timeout=60, what="preparing the upload")
        self.mkdirs(f"releases/.tmp-{release_id}", what="preparing the upload")
        self.shell.put_bytes(build_tarball(files), tgz, mode=0o600, on_progress=on_progress)
        check_lines = "".join(f"{h}  {p}\n" for p, h in sorted(manifest_sha.items()))
        self.shell.put_bytes(check_lines.encode(), f"{tmp}.sha256", mode=0o600)
        self.shell.check(
            f"tar -xzf {shlex.quote(tgz)} -C {shlex.quote(tmp)} && cd {shlex.quote(tmp)} && "
            f"sha256sum --quiet -c {shlex.quote(tmp + '.sha256')} && rm -f {shlex.quote(tgz)} "
            f"{shlex.quote(tmp + '.sha256')}",
            timeout=300, what="unpacking and verifying the release")
        dest = self.path(release_id)
        # move each top-level entry into the release dir (which holds only record.json so far)
        self.shell.check(
            f"{hostfs.ensure_dirs(self.root, f'releases/{release_id}')}\n"
            f"cd {shlex.quote(tmp)} && for e in * .[!.]*; do "
            f"[ -e \"$e\" ] || continue; mv -f \"$e\" {shlex.quote(dest)}/; done && cd / && "
            f"rmdir {shlex.quote(tmp)}", timeout=120, what="moving the release into place")

    def switch(self, release_id: str, secrets: tuple[str, bool] | None = None) -> str:
        """Point ``current`` at ``releases/<id>`` atomically (symlink to a temp name + rename).

        ``secrets``: (deployment name, whether the release has secrets). The active secrets file
        becomes the release's in the same round trip, before ``current`` moves (see
        :meth:`_activate_secrets`): this is the only place that decides which secrets the units
        read, for apply, the restore after a failed apply and ``dsv4ctl rollback`` alike.
        Returns what happened to the secrets: ``activated``, ``none`` (removed), ``kept`` (a
        release without its own secrets file) or ``""`` (not asked)."""
        tmp = f"{self.root}/.current.tmp"
        activate = ""
        if secrets is not None and secrets[1]:
            activate = (f"{hostfs.ensure_dirs(self.root, 'secrets', mode='0700')}\n"
                        f"chmod 700 {self.q('secrets')} || exit 1\n"
                        f"{self._activate_secrets(secrets[0], release_id, True)}\n")
        elif secrets is not None:
            # nothing to create (a full disk must not fail a switch to a release without
            # secrets): remove the units' file when the (real, never a linked) dir holds one
            activate = (f"{hostfs.PRELUDE}\ndsv4_nolink {self.q('secrets')}\n"
                        f"if [ -d {self.q('secrets')} ]; then "
                        f"{self._activate_secrets(secrets[0], release_id, False)}; "
                        f"else echo secrets=none; fi\n")
        out = self.shell.check(
            f"[ -f {shlex.quote(self.path(release_id, MANIFEST))} ] || "
            f"{{ echo 'release {release_id} has no manifest' >&2; exit 1; }}\n{activate}"
            f"ln -sfn {shlex.quote('releases/' + release_id)} {shlex.quote(tmp)} && "
            f"mv -fT {shlex.quote(tmp)} {self.q('current')}",
            timeout=30, what=f"switching current to {release_id}")
        m = re.search(r"^secrets=(\w+)$", out, re.M)
        return m.group(1) if m else ""

    def remove(self, release_ids: Iterable[str]) -> None:
        ids = [i for i in release_ids if is_release_id(i)]
        self._dirs.difference_update(ids)
        if ids:
            # a release's secrets file goes with it (``secrets/<deployment>.<id>.env``; ids are
            # unique on a host; never through a linked ``secrets``, and ``rm -f`` on a link
            # removes the link, never its target)
            paths = " ".join(shlex.quote(self.path(i)) for i in ids)
            own = " ".join(self.q("secrets") + f"/*.{i}.env" for i in ids)
            self.shell.check(f"rm -rf {paths} && {{ [ -L {self.q('secrets')} ] || "
                             f"rm -f -- {own}; }}", timeout=300, what="removing old releases")

    def prune(self, keep: int, last_healthy: str | None) -> list[str]:
        """Delete releases beyond ``keep``; never current, never the last healthy one."""
        doomed = select_prunable(self.list_ids(), keep=keep, current=self.current(),
                                 last_healthy=last_healthy)
        self.remove(doomed)
        return doomed

    # ------------------------------------------------------------------------------ secrets ---
    # Each release's secrets live beside the others in the 0700 ``secrets/`` dir, outside the
    # world-readable release tree: ``secrets/<deployment>.<release-id>.env``. The file the units
    # read (``EnvironmentFile=-<root>/secrets/<deployment>.env``) becomes a release's only in
    # :meth:`switch` (issues 19, 20: secrets written at upload reached the serving release before
    # its switch, and a rollback left the newer release's key behind).

    def secrets_path(self, name: str, release_id: str | None = None) -> str:
        """The active secrets file (``release_id`` None) or one release's."""
        return (f"{self.root}/secrets/{name}.env" if release_id is None
                else f"{self.root}/secrets/{name}.{release_id}.env")

    def _secrets_dir(self) -> None:
        self.mkdirs("secrets", mode="0700", what="creating the secrets dir")
        self.shell.check(f"chmod 700 {shlex.quote(f'{self.root}/secrets')}", timeout=30,
                         what="creating the secrets dir")

    def write_secrets(self, name: str, release_id: str, values: Mapping[str, str]) -> None:
        """``secrets/<name>.<release_id>.env``, mode 0600, written via SFTP (values never pass
        through a shell command line, so they do not show up in the host's process list or logs).
        The file is created with its final mode and never through a symbolic link: ``put_bytes``
        opens a fresh temp file ``O_CREAT|O_EXCL`` with mode 0600 and renames it over the name
        (issue 19). Nothing reads it until :meth:`switch` makes it the active file."""
        body = secrets_body(values)
        self._secrets_dir()
        self.shell.put_bytes(body, self.secrets_path(name, release_id), mode=0o600)

    def secrets_digest_command(self, name: str, release_id: str | None = None) -> str:
        path = shlex.quote(self.secrets_path(name, release_id))
        return f"if [ -f {path} ]; then sha256sum < {path}; else echo none; fi"

    def secrets_digest(self, name: str, release_id: str | None = None) -> str | None:
        """sha256 of the active secrets file (or one release's), None when there is none: what
        apply and rollback compare to know whether the values change, without any value leaving
        the file (apply's preflight runs this command ahead, in the lock's round trip)."""
        out = self.shell.check(self.secrets_digest_command(name, release_id), timeout=30,
                               what="reading the digest of the secrets file").split()
        return None if not out or out[0] == "none" else out[0]

    def read_secrets(self, name: str, release_id: str | None = None) -> dict[str, str] | None:
        """The values of the active secrets file (or one release's); None when there is none.
        Read over the SSH channel's stdout: never in a command line, never printed."""
        path = shlex.quote(self.secrets_path(name, release_id))
        res = self.shell.run(f"if [ -f {path} ]; then cat -- {path}; else exit 3; fi",
                             timeout=30)
        if res.rc == 3:
            return None
        if not res.ok:
            raise RemoteError(f"cannot read the secrets file of {release_id or name} on host "
                              f"'{self.shell.name}': {res.stderr.strip()[-300:]}")
        out = {}
        for line in res.stdout.splitlines():
            k, sep, v = line.partition("=")
            if sep:
                out[k] = _env_unquote(v)
        return out

    def secrets_drift(self, name: str, release_id: str, has_secrets: bool) -> str | None:
        """Whether the units' secrets file is ``release_id``'s (for ``status``: the switch made it
        so; an edit on the host, or a switch by hand, would not): None when it is (or the release
        predates per-release secrets, so there is nothing to compare), else what differs. Compared
        on the host (``cmp``); no value leaves the files."""
        own = shlex.quote(self.secrets_path(name, release_id))
        act = shlex.quote(self.secrets_path(name))
        res = self.shell.run(
            f"if [ -f {own} ]; then if [ -f {act} ]; then cmp -s -- {own} {act} && echo same "
            f"|| echo differs; else echo missing; fi; elif [ -f {act} ]; then echo extra; "
            f"else echo none; fi", timeout=30)
        word = res.stdout.strip()
        units_file = f"secrets/{name}.env"
        if word == "differs":
            return f"{units_file} (what the units read) differs from {release_id}'s secrets"
        if word == "missing":
            return f"{units_file} (what the units read) is missing; {release_id} has secrets"
        if word == "extra" and not has_secrets:
            return f"{units_file} (what the units read) exists; {release_id} has no secrets"
        if word not in ("same", "none", "extra"):
            return f"{units_file}: could not be compared ({res.stderr.strip()[-200:]})"
        return None

    def read_secret(self, name: str, key: str) -> str | None:
        """One value of the active ``secrets/<name>.env`` (for ``status``'s requests to an engine
        that wants its API key): the current release's, since only :meth:`switch` writes it."""
        try:
            values = self.read_secrets(name)
        except RemoteError:
            return None
        return (values or {}).get(key)

    def _activate_secrets(self, name: str, release_id: str, has_secrets: bool) -> str:
        """Shell that makes ``secrets/<name>.env`` the release's secrets: a 0600 copy made
        exclusively (``umask 077; set -C``: ``O_CREAT|O_EXCL``, never through a link), checked
        byte for byte, renamed over the active name (rename(2) replaces a name, never follows
        it). A release with no secrets removes the active file. A release that names secrets but
        has no file of its own (applied before secrets were kept per release) leaves the active
        file as it is and says so on stdout."""
        src = shlex.quote(self.secrets_path(name, release_id))
        dst = shlex.quote(self.secrets_path(name))
        tmp = shlex.quote(f"{self.root}/secrets/.{name}.env.activate.tmp")
        if not has_secrets:
            return f"rm -f -- {dst} {tmp} && echo secrets=none || exit 1"
        return (f"dsv4_nolink {src}; dsv4_nolink {dst}; dsv4_nolink {tmp}; rm -f -- {tmp}; "
                f"if [ -f {src} ]; then "
                f"(umask 077; set -C; cat -- {src} > {tmp}) && cmp -s -- {src} {tmp} && "
                f"mv -fT -- {tmp} {dst} && echo secrets=activated "
                f"|| {{ rm -f -- {tmp}; echo 'cannot activate the secrets file' >&2; exit 1; }}; "
                f"else echo secrets=kept; fi")


def secrets_body(values: Mapping[str, str]) -> bytes:
    """The EnvironmentFile text of ``values`` (sorted, quoted): what a release's secrets file
    holds, byte for byte, so its sha256 can be compared with one on the host."""
    return "".join(f"{k}={_env_quote(v)}\n" for k, v in sorted(values.items())).encode()


def _env_unquote(text: str) -> str:
    """The inverse of :func:`_env_quote`."""
    if len(text) >= 2 and text[0] == text[-1] == '"':
        text = text[1:-1]
    return re.sub(r'\\(["\\])', r"\1", text)


def _env_quote(value: str) -> str:
    """Quote a value for a systemd EnvironmentFile (double quotes, backslash escapes)."""
    if "\n" in value or "\r" in value:
        raise RemoteError("a secret value contains a newline, which an EnvironmentFile cannot hold",
                          fix="store the secret without line breaks")
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
