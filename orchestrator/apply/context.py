"""The state apply's and rollback's steps share (:class:`Context`), what a step returns, and how a
release is read back: its files, deployment and profile from the host, its tree from a plan, its
secrets from the controller's files.

Split from :mod:`.steps` (the step implementations) and :mod:`.preflight` (the checks before
anything changes) so that each stays readable; :mod:`.steps` re-exports nothing from here that its
callers should not import from the owner.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from orchestrator.deployment import Deployment
from orchestrator.errors import DsvError, StalePlan
from orchestrator.facts import Facts
from orchestrator.planner.transition import (
    ROLE_ORDER,
    ReleaseFile,
    release_from_facts,
    release_from_manifest,
    roles_affected,
)
from orchestrator.planner_model import Action, Plan
from orchestrator.profile.inventory import Host
from orchestrator.profile.schema import Profile
from orchestrator.release.record import (
    ReleaseRecord,
)
from orchestrator.release.store import (
    MANIFEST,
    PLAN,
    ReleaseStore,
    release_files,
)
from orchestrator.remote.connection import RemoteHost
from orchestrator.remote.lock import HostLock
from orchestrator.remote.systemd import ServiceManager


class StepFailed(DsvError):
    """A step's own failure (health, smoke, self-test); the executor decides what follows."""


@dataclass(frozen=True)
class Outcome:
    result: str = "ok"  # ok | skipped
    detail: str | None = None
    finish: str | None = None  # stop the playbook successfully with this message


def role_units(dep: Deployment | None) -> dict[str, str]:
    """role -> unit name, engines first, router last (start order; reverse for stop)."""
    if dep is None:
        return {}
    out = {r.name: r.unit for r in sorted(dep.roles, key=lambda r: ROLE_ORDER.index(r.name))}
    if dep.router is not None:
        out["router"] = dep.router.unit
    return out


@dataclass
class Context:
    remote: RemoteHost
    host_name: str
    host: Host
    out: Callable[[str], None]
    now: Callable[[], datetime]
    command: str
    store: ReleaseStore = field(init=False)
    svc: ServiceManager = field(init=False)
    lock: HostLock | None = None
    # the fleet lock the host lock is taken inside of (HostLock outer=): the fleet of one's,
    # which it takes with its host lock in one command (planner/targets.py Targets.fleet_lock)
    fleet_lock: str | None = None
    # the facts this run's probe read over ``remote`` a moment before (a profile's apply; None
    # for a saved plan, which preflight probes again under the lock)
    probed: Facts | None = None
    record: ReleaseRecord | None = None
    persist: bool = False
    journal_prefix: str = ""
    # the transition
    target: str | None = None
    target_files: dict[str, ReleaseFile] = field(default_factory=dict)
    deployment: Deployment | None = None
    profile: Profile | None = None
    from_release: str | None = None
    from_files: dict[str, ReleaseFile] = field(default_factory=dict)
    from_deployment: Deployment | None = None
    # drift at preflight (remote/drift.py): path -> how the host differs from from_files
    drift: dict[str, str] = field(default_factory=dict)
    # and unit -> the command line it runs (remote/drift.py; planner.transition.running_drift)
    running: dict[str, list[str]] = field(default_factory=dict)
    # apply only
    plan: Plan | None = None
    saved_plan: bool = False
    # every host's plan of the fleet the plan belongs to: the router host's Prometheus scrapes
    # every engine host's GPUs, and each one's predicted use is its own host's plan's
    fleet_plans: tuple[Plan, ...] = ()
    tree: dict[str, tuple[bytes, int]] = field(default_factory=dict)
    manifest_sha: dict[str, str] = field(default_factory=dict)
    secrets: dict[str, str] = field(default_factory=dict)
    # planner.transition's actions from (from_files, target_files, the units running at preflight):
    # the only list stop_changed and start_units execute
    actions: list[Action] = field(default_factory=list)
    # what happened
    stopped: list[str] = field(default_factory=list)
    started: list[str] = field(default_factory=list)
    switched: bool = False
    rollback_timeout_s: float = 1800.0
    health: str = ""
    records: list[ReleaseRecord] = field(default_factory=list)
    # apply's forward steps fail when their journal cannot be written (issue 20 #1); a rollback
    # carries on without it (putting a release back matters more than its journal), keeps the
    # record in memory and says so
    journal_strict: bool = True
    journal_error: str | None = None

    @property
    def roles_to_restart(self) -> set[str]:
        """Roles whose process the transition stops, starts or restarts."""
        return set(roles_affected(self.actions))

    def __post_init__(self) -> None:
        self.store = ReleaseStore(self.remote, self.host.install_root)
        self.svc = ServiceManager(self.remote, self.host.scope)

    def condition(self, name: str) -> tuple[bool, str]:
        assert self.deployment is not None and self.profile is not None
        if name == "kernels_enabled":
            return self.deployment.kernels_enabled, "no role runs a bundled kernel (kernels.<op>)"
        if name == "qualify_configured":
            return self.profile.health.qualify is not None, "health.qualify is not set"
        raise KeyError(name)

    def timeout(self, name: str | None) -> float:
        assert self.profile is not None
        if name == "rollback":
            return self.rollback_timeout_s
        return float(self.profile.health.startup_timeout_s)

    def save_record(self) -> None:
        if not self.persist or self.record is None:
            return
        if self.started and self.deployment is not None and not self.journal_prefix:
            # the roles whose units this release really (re)started, as they happen
            by_unit = {u: r for r, u in role_units(self.deployment).items()}
            done = sorted({by_unit[u] for u in self.started if u in by_unit},
                          key=lambda r: (r == "router", r))
            if done != self.record.restarted_roles:
                self.record = self.record.model_copy(update={"restarted_roles": done})
        try:
            self.store.write_record(self.record)
            self.journal_error = None
        except DsvError as exc:
            if self.journal_strict:
                raise
            if self.journal_error is None:
                self.out(f"  (the journal could not be written, carrying on: {exc.message})")
            self.journal_error = exc.message


# ------------------------------------------------------------------------------------ loading ---

RELEASE_META = (MANIFEST, PLAN, "profile.yaml")  # what load_release reads of a release


def load_release(store: ReleaseStore, release_id: str) -> tuple[dict[str, ReleaseFile], Deployment,
                                                                 Profile]:
    """Manifest, deployment (from its plan.json) and resolved profile of a release on the host."""
    from orchestrator.profile.loader import load_text

    manifest, plan_text, profile_text = store.read_release(release_id)
    files = release_from_facts({p: sha for p, (sha, _) in manifest.items()},
                               {p: roles for p, (_, roles) in manifest.items()})
    plan = Plan.model_validate_json(plan_text)
    profile = load_text(Profile, profile_text, f"{release_id}/profile.yaml")
    return files, plan.deployment, profile


def profile_from_plan(plan: Plan) -> Profile:
    from orchestrator.profile.loader import load_text

    for f in plan.files:
        if f.path == "profile.yaml" and f.content is not None:
            return load_text(Profile, f.content, "plan:profile.yaml")
    raise StalePlan("the plan carries no profile.yaml (plan saved without file contents?)",
                    fix=f"re-create it with `dsv4ctl plan --host {shlex.quote(plan.host)} "
                        "--live -o plan.json`")


MAX_SECRET_BYTES = 64 * 1024


def _read_secret_file(name: str, path: str) -> str:
    """A secret file's text: a regular file whose real path (links resolved) is not under /proc,
    /dev or /sys, at most MAX_SECRET_BYTES (issue 19: ``/proc/self/environ``, or a link to it,
    shipped the controller's whole environment to the host)."""
    import os
    import stat

    from orchestrator.profile.schema import forbidden_secret_dir

    real = os.path.realpath(path)
    where = forbidden_secret_dir(real)
    if where is not None:
        raise DsvError(f"secrets.{name}.file: {path} resolves to {real}, under {where}, which is "
                       "not a secret store", fix="put the secret in a regular file, or use env:")
    try:
        fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        raise DsvError(f"secrets.{name}.file: cannot read {path}: {exc.strerror}",
                       fix="check the path and permissions of the secret file") from exc
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise DsvError(f"secrets.{name}.file: {path} is not a regular file",
                           fix="point it at a regular file holding only the secret")
        data = fh.read(MAX_SECRET_BYTES + 1)
    if len(data) > MAX_SECRET_BYTES:
        raise DsvError(f"secrets.{name}.file: {path} is larger than {MAX_SECRET_BYTES} bytes",
                       fix="point it at a file holding only the secret")
    return data.decode("utf-8", "replace").strip()


def resolve_secrets(profile: Profile) -> dict[str, str]:
    """Read the profile's secret refs on the controller. Values never enter a plan, a record or
    output; only the names do."""
    import os

    out: dict[str, str] = {}
    for name, ref in sorted(profile.secrets.items()):
        if ref.env is not None:
            value = os.environ.get(ref.env)
            if value is None:
                raise DsvError(f"secret {name}: environment variable {ref.env} is not set on the "
                               "controller", fix=f"export {ref.env}=... before `dsv4ctl apply`")
        else:
            assert ref.file is not None
            value = _read_secret_file(name, ref.file)
        out[name] = value
    return out


def tree_from_plan(plan: Plan, fleet: Sequence[Plan] = ()
                   ) -> tuple[dict[str, tuple[bytes, int]], dict[str, str], str]:
    """The release tree (files + manifest.json + plan.json, and the plans' per-GPU memory for
    Prometheus), the manifest's hashes and its text. ``fleet``: every host's plan of the plan's
    fleet (what a fleet's router host's Prometheus needs, :func:`plan_rules_file`).

    The manifest is the renderer's (:meth:`orchestrator.render.ReleaseTree.manifest`, its one
    writer), built from the plan's files after :func:`release_files` checked each against the
    sha256 the plan recorded."""
    from orchestrator.render import ReleaseTree, RenderedFile

    files = release_files(plan.files)
    manifest_text = ReleaseTree(plan.deployment.name, {
        p: RenderedFile(d.decode("utf-8"), m, tuple(r)) for p, (d, m, r) in files.items()
    }).manifest()
    hashes = {p: f.sha256 for p, f in release_from_manifest(json.loads(manifest_text)).items()
              if f.sha256}
    tree = {p: (d, m) for p, (d, m, _) in files.items()}
    tree[MANIFEST] = (manifest_text.encode(), 0o644)
    tree[PLAN] = (plan.model_dump_json(indent=2).encode() + b"\n", 0o644)
    from orchestrator.monitoring import plan_rules_file

    planned = plan_rules_file(plan, fleet)  # the plans' per-GPU memory (like plan.json)
    if planned is not None:
        tree[planned[0]] = (planned[1].encode(), 0o644)
    return tree, hashes, manifest_text


def engine_client(remote: Any, dep: Deployment | None,
                  secret: Callable[[str], str | None]) -> Callable[..., Any]:
    """The one authenticated HTTP client of a deployment's engines and router: ``remote.http``,
    with ``Authorization: Bearer`` when the deployment sets the engine's API key (``secrets:
    DSV4_SECRET_API_KEY``): SGLang then answers 401 on /v1/models, /server_info and the
    generation endpoints (only /health*, /ready*, /metrics* stay open, sglang/srt/utils/auth.py);
    the router's port gets the router's key (its own, else the engines'). Sent to the address
    each port listens on (a fleet's engines: the host's service address). ``secret(name)``: the
    key's value, from the controller (an apply) or the host's secrets file (status, the router
    of a fleet); each is read once."""
    from orchestrator.remote.connection import listen_http
    from orchestrator.render.secrets import api_key_names

    eng, rt = api_key_names(dep)
    seen: dict[str, str | None] = {}

    def bearer(name: str | None) -> dict[str, str] | None:
        if name is None:
            return None
        if name not in seen:
            seen[name] = secret(name)
        value = seen[name]
        return {"Authorization": f"Bearer {value}"} if value else None

    return listen_http(remote.http, dep, bearer(eng), router_headers=bearer(rt))


def engine_http(ctx: Context) -> Callable[..., Any]:
    """:func:`engine_client` of an apply or rollback, its keys from the controller's values."""
    return engine_client(ctx.remote, ctx.deployment, ctx.secrets.get)
