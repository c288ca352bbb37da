"""Check construction and the checks that need no catalog: topology and disk.

A check is a finding with a stable id (``topology.gpu-overlap``), a severity, the numbers behind it and
a fix. Ids are part of the interface: profiles acknowledge warnings by id, tests and CI grep for them, so
they never change meaning. A fix that is an edit of the profile is given as one (``change``), its
text rendered from it. Every function here is pure. Just past 400 lines: the topology rules with
their edits, disk and the host's own checks; the seam, if it grows, is the host checks (keys,
users, secrets, acknowledgements) into a module of their own.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from orchestrator.deployment import Deployment
from orchestrator.errors import DsvError, FixChange, fix_text, set_to
from orchestrator.facts import DiskFact, Facts
from orchestrator.planner_model import Check, DiskRow, Severity
from orchestrator.profile.inventory import Host


def check(
    id: str,
    severity: Severity,
    title: str,
    message: str,
    fix: str | None = None,
    *,
    subject: str | None = None,
    source: str | None = None,
    field: str | None = None,
    change: Sequence[FixChange] = (),
    **numbers: float | int | str,
) -> Check:
    """A check. With ``change`` (the profile edit its fix proposes), the fix's text is rendered
    from the change and ``fix`` is only what follows it (:func:`fix_text`)."""
    if change:
        fix = fix_text(change, fix or "")
    return Check(id=id, severity=severity, title=title, message=message, fix=fix, subject=subject,
                 source=source, field=field, change=tuple(change),
                 numbers=dict(sorted(numbers.items())))


def layout_check(role: str, exc: DsvError) -> Check:
    """``capacity.layout`` of a role (the catalog's UnsupportedLayout / UnknownCatalogData): its
    reason, and its fix once (not also inside the message)."""
    change = tuple(FixChange(_field(role, c.field), c.value, c.remove)
                   for c in getattr(exc, "change", ()))  # a layout knob is the role's field
    return check("capacity.layout", "error", "weights cannot be sharded this way",
                 f"role {role}: {exc.message}",
                 getattr(exc, "then", "") if change else
                 exc.fix or "choose tp/ep/attn_dp the model supports",
                 field=f"topology.{role}.tp", subject=role, change=change)


def gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB"


def gb(n: float) -> str:
    return f"{n / 1e9:.1f} GB"


def _divisors(n: int, limit: int | None = None) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0 and (limit is None or d <= limit)]


def topology_checks(dep: Deployment, num_heads: int) -> list[Check]:
    """Topology and ports as the profile states them: no host facts needed, so `dsv4ctl validate`
    reports these too. :func:`host_topology_checks` adds what needs the host."""
    out: list[Check] = []
    owner: dict[int, str] = {}
    for role in dep.roles:
        seen: set[int] = set()
        for g in role.gpus:
            if g in seen:
                out.append(check(
                    "topology.gpu-duplicate", "error", "GPU listed twice in one role",
                    f"role {role.name} lists GPU {g} more than once",
                    "list each GPU index once",
                    field=_field(role.name, "gpus"), subject=role.name, gpu=g))
            seen.add(g)
            if g in owner and owner[g] != role.name:
                out.append(check(
                    "topology.gpu-overlap", "error", "GPU used by two roles",
                    f"GPU {g} is assigned to both {owner[g]} and {role.name}; two engines cannot "
                    "share a GPU's memory",
                    "give each role a disjoint set of GPUs (e.g. prefill [0,1,2,3], decode [4,5,6,7])",
                    field=_field(role.name, "gpus"), subject=role.name, gpu=g))
            owner.setdefault(g, role.name)
        if role.tp != len(role.gpus):
            change = _tp_of_gpus(role.name, len(role.gpus), role.ep, role.attn_dp, num_heads)
            out.append(check(
                "topology.tp-gpus", "error", "TP size differs from the number of GPUs",
                f"role {role.name} has tp={role.tp} but {len(role.gpus)} GPUs; SGLang runs one rank "
                "per GPU, so the TP group spans exactly the role's GPUs",
                f", or list {role.tp} GPUs" if change else
                f"list {role.tp} GPUs ({len(role.gpus)} does not divide the {num_heads} heads)",
                field=_field(role.name, "tp"), subject=role.name, tp=role.tp,
                gpus=len(role.gpus), change=change))
        if num_heads % role.tp:
            ok = ", ".join(str(d) for d in _divisors(num_heads, 64))
            out.append(check(
                "topology.tp-heads", "error", "TP does not divide the attention heads",
                f"role {role.name}: tp={role.tp} does not divide the model's {num_heads} attention "
                "heads; each rank must hold a whole number of heads",
                f"use tp in {{{ok}}}",
                field=_field(role.name, "tp"), subject=role.name, tp=role.tp, heads=num_heads))
        if role.ep not in (1, role.tp) and (role.tp % role.ep):
            out.append(check(
                "topology.ep", "error", "EP size does not divide TP",
                f"role {role.name}: ep={role.ep} with tp={role.tp}; SGLang requires ep_size x "
                "moe_dp_size == tp_size",
                f", or ep: {role.tp}",
                field=_field(role.name, "ep"), subject=role.name, ep=role.ep, tp=role.tp,
                change=[set_to(_field(role.name, "ep"), 1)]))
        if role.tp % role.attn_dp:
            ok = ", ".join(str(d) for d in _divisors(role.tp))
            out.append(check(
                "topology.attn-dp", "error", "attention-DP does not divide TP",
                f"role {role.name}: attn_dp={role.attn_dp} must divide tp={role.tp}",
                f" (attn_dp divides tp: one of {{{ok}}})",
                field=_field(role.name, "attn_dp"), subject=role.name, attn_dp=role.attn_dp,
                tp=role.tp, change=[set_to(_field(role.name, "attn_dp"), max(
                    d for d in _divisors(role.tp) if d <= role.attn_dp))]))
    out.extend(_port_conflicts(dep))
    return out


def _tp_of_gpus(role: str, n: int, ep: int, attn_dp: int, num_heads: int) -> list[FixChange]:
    """The edit that makes a role's TP group its ``n`` GPUs: tp, and the ep and attn_dp a TP
    of ``n`` then needs (ep 1 or tp, attn_dp a divisor), so the fix raises no error of its own;
    none when ``n`` cannot be a TP size (it does not divide the heads)."""
    if n < 1 or num_heads % n:
        return []
    change = [set_to(_field(role, "tp"), n)]
    if ep not in (1, n):
        change.append(set_to(_field(role, "ep"), n if ep > 1 else 1))
    if n % attn_dp:
        change.append(set_to(_field(role, "attn_dp"), max(d for d in _divisors(n) if d <= attn_dp)))
    return change


def host_topology_checks(dep: Deployment, facts: Facts) -> list[Check]:
    """GPU indices the host does not have; ports something else already listens on."""
    out: list[Check] = []
    gpu_count = len(facts.gpus)
    for role in dep.roles:
        for g in dict.fromkeys(role.gpus):
            if g >= gpu_count:
                out.append(check(
                    "topology.gpu-missing", "error", "GPU index not on the host",
                    f"role {role.name} uses GPU {g}, but host {facts.host} has {gpu_count} GPUs "
                    f"(indices 0-{gpu_count - 1})",
                    f"use GPU indices between 0 and {gpu_count - 1}",
                    field=_field(role.name, "gpus"), subject=role.name, gpu=g,
                    host_gpus=gpu_count))
    return out + _ports_in_use(dep, facts)


def _field(role: str, key: str) -> str:
    return f"topology.{role}.{key}"


def _ports(dep: Deployment) -> list[tuple[str, int]]:
    ports: list[tuple[str, int]] = []
    for r in dep.roles:
        ports += [(f"{r.name}.port", r.port), (f"{r.name}.nccl_port", r.nccl_port),
                  (f"{r.name}.engine_info_bootstrap_port", r.engine_info_bootstrap_port)]
        if r.bootstrap_port is not None:
            ports.append((f"{r.name}.bootstrap_port", r.bootstrap_port))
    if dep.router is not None:
        ports += [("router.port", dep.router.port),
                  ("router.prometheus_port", dep.router.prometheus_port)]
    return ports


def _port_field(name: str) -> str:
    role, key = name.split(".", 1)
    return f"topology.router.{key}" if role == "router" else _field(role, key)


def _port_conflicts(dep: Deployment) -> list[Check]:
    out: list[Check] = []
    for port, names in sorted(_by_port(dep).items()):
        if len(names) > 1:
            out.append(check(
                "topology.port-conflict", "error", "one port used twice",
                f"port {port} is used by {', '.join(names)}; every instance on one host needs its own "
                "--port, --nccl-port and --engine-info-bootstrap-port",
                f"give {names[1]} a free port", subject=names[1], port=port,
                field=_port_field(names[1])))
    return out


def _by_port(dep: Deployment) -> dict[int, list[str]]:
    by_port: dict[int, list[str]] = {}
    for name, port in _ports(dep):
        by_port.setdefault(port, []).append(name)
    return by_port


def _ports_in_use(dep: Deployment, facts: Facts) -> list[Check]:
    out: list[Check] = []
    by_port = _by_port(dep)
    ours = set(by_port)
    running_units = {u.name for u in facts.units if u.active in ("active", "activating")}
    mine = {r.unit for r in dep.roles} | ({dep.router.unit} if dep.router else set())
    # the current release's units are stopped before the new ones start (planner.transition), so
    # the ports they hold are free by then: switching PD 4+4 -> colocated TP8 and back reuses
    # engine_info_bootstrap_port 6789
    mine |= {p.removeprefix("units/") for p in facts.current_files if p.startswith("units/")}
    if facts.source == "probed" and not (running_units & mine):
        for port in sorted(ours & set(facts.ports_in_use)):
            out.append(check(
                "host.port-in-use", "error", "port already in use on the host",
                f"port {port} ({', '.join(by_port[port])}) is already listening on {facts.host} and "
                "not by this deployment",
                "stop what listens there or choose another port", subject=by_port[port][0], port=port,
                field=_port_field(by_port[port][0])))
    return out


def disk_rows(facts: Facts, model_path: str, needed: int, variant: str) -> tuple[list[DiskRow], list[Check]]:
    """Where the checkpoint goes and whether it fits; which present models would free enough."""
    present = any(m.path.rstrip("/") == model_path.rstrip("/") for m in facts.models)
    disk = _covering_disk(facts, model_path)
    checks: list[Check] = []
    rows: list[DiskRow] = []
    if disk is None:
        checks.append(check(
            "disk.unknown", "warning", "no disk declared for the model path",
            f"no declared disk contains {model_path}; the planner cannot tell whether the "
            f"{gb(needed)} checkpoint fits",
            "declare the disk (path, size, free) in the inventory, or plan with --host to probe it",
            subject=model_path, needed_bytes=needed))
        return rows, checks
    shortfall = 0 if present else max(0, needed - disk.free_bytes)
    could_free: list[str] = []
    if shortfall:
        others = sorted((m for m in facts.models if m.path.startswith(disk.path.rstrip("/") + "/")
                         or m.path == disk.path), key=lambda m: -m.size_bytes)
        single = [m for m in others if m.size_bytes >= shortfall]
        if single:
            smallest = min(single, key=lambda m: m.size_bytes)
            could_free = [f"{smallest.path} ({gb(smallest.size_bytes)})"]
        else:
            acc = 0
            for m in others:
                could_free.append(f"{m.path} ({gb(m.size_bytes)})")
                acc += m.size_bytes
                if acc >= shortfall:
                    break
            if acc < shortfall:
                could_free = []
        fix = (f"free at least {gb(shortfall)} on {disk.path}"
               + (f", e.g. remove {' + '.join(could_free)}" if could_free else "")
               + ", or put the model on a larger disk (model.path)")
        checks.append(check(
            "disk.space", "error", "checkpoint does not fit the disk",
            f"{variant} needs {gb(needed)} ({gib(needed)}) at {model_path}; {disk.path} has "
            f"{gb(disk.free_bytes)} ({gib(disk.free_bytes)}) free: {gb(shortfall)} short",
            fix, subject=disk.path, needed_bytes=needed, free_bytes=disk.free_bytes,
            shortfall_bytes=shortfall))
    rows.append(DiskRow(path=disk.path, size_bytes=disk.size_bytes, free_bytes=disk.free_bytes,
                        needed_bytes=needed, present=present, shortfall_bytes=shortfall,
                        could_free=could_free))
    return rows, checks


def _covering_disk(facts: Facts, path: str) -> DiskFact | None:
    """The declared/probed disk with the longest mount path that contains ``path``."""
    best: DiskFact | None = None
    for d in facts.disks:
        root = d.path.rstrip("/") or "/"
        covers = root == "/" or path == root or path.startswith(root + "/")
        if covers and (best is None or len(root) > len(best.path.rstrip("/") or "/")):
            best = d
    return best


def host_key_checks(host_name: str, host: Host) -> list[Check]:
    """A host without ``known_hosts:`` has no pinned key: the first connection is refused unless
    the operator opts in with ``--accept-new-host-key`` (issue 19), so say so before apply."""
    if host.known_hosts is not None:
        return []
    return [check(
        "host.key-unpinned", "warning", "no pinned SSH host key",
        f"host {host_name} ({host.address}) has no known_hosts in the inventory: its SSH key is "
        "checked only against the controller's /etc/ssh/ssh_known_hosts and ~/.ssh/known_hosts, "
        "and a key found in neither is refused",
        "pin it: set known_hosts: to a file holding the host's key (ssh-keyscan, verified out "
        "of band), or accept it once with --accept-new-host-key (the key is then recorded)",
        subject=host_name)]


def inline_host_checks(host_name: str, host: Host, inline: bool) -> list[Check]:
    """A profile that carries its own host (address, key, known_hosts) decides where apply
    connects and where the controller's secrets go, whatever inventory ``-i`` names (issue 31:
    it overrode -i silently): say so where the review happens (plan's target line names it too)."""
    if not inline:
        return []
    return [check(
        "host.inline", "warning", "the profile carries its own host",
        f"this profile defines its host inline ({host.user}@{host.address}:{host.port}"
        + (f", key {host.key}" if host.key else "")
        + (f", known_hosts {host.known_hosts}" if host.known_hosts else "")
        + "): apply connects there and sends the controller's secrets there; no inventory "
        "is used for it, -i included", "name an inventory host instead (host: NAME) so the "
        "target is reviewed where hosts are, or acknowledge host.inline", subject=host_name,
        field="host")]


def ssh_user_checks(host_name: str, host: Host) -> list[Check]:
    """A root SSH user runs every command of apply with every privilege: a warning naming the
    alternative (issue 31; the schema's default is not root)."""
    who = [("user", host.user)] + ([("jump.user", host.jump.user)] if host.jump else [])
    return [check(
        "host.ssh-root", "warning", "SSH user is root",
        f"host {host_name} is reached as root ({field}: root): every command dsv4ctl runs there, "
        "and every file it reads back, has every privilege on the host",
        "use an unprivileged deploying user: one that owns install_root and the engine env, with "
        "sudo rights for systemctl (scope: system) or its own systemd --user (scope: user); "
        "the default is dsv4", subject=host_name)
        for field, user in who if user == "root"]


def engine_env_checks(dep: Deployment, facts: Facts) -> list[Check]:
    """The engine environment's owner/mode check, as the probe saw it (issue 31): whoever can
    write the env's ``bin/python`` runs code as the deploying user when apply runs it (the kernels
    step), and as the service user at every start. Declared facts cannot see it: apply checks it
    on the host before anything runs from it either way."""
    env = facts.engine_env
    if env is None or not dep.roles:
        return []
    if env.problem is None:
        return [check(
            "host.engine-env-trusted", "info", "engine environment checked",
            f"{env.path}, its bin/ and its interpreter are owned by the deploying user or root "
            "and not writable by group or others along their whole real paths, and nothing "
            "inside it is writable by others", subject="engine.env", field="engine.env")]
    return [check(
        "host.engine-env-untrusted", "error", "engine environment others can change",
        f"the engine environment {env.path} is not safe to run: {env.problem}",
        "give the environment (and every directory above it) to root or the deploying user and "
        "chmod go-w it (e.g. `chown -R root: ENV && chmod -R go-w ENV`), or point engine.env at "
        "one that is; dsv4ctl runs nothing from it until then",
        subject="engine.env", field="engine.env", source="OpenSSH sshd StrictModes; sudo "
        "refuses files others can write for the same reason")]


def secrets_checks(dep: Deployment) -> list[Check]:
    """A plan carries the names of the profile's secrets, never their values (nor a digest of them:
    a hash of a short key can be searched offline), so it cannot show a rotated value. apply
    compares the values with the host's active secrets (digests computed on the host) and, when
    they differ, restarts every running role at the switch. Say so here, where the review happens,
    rather than let "No changes." stand for it."""
    if not dep.secret_names:
        return []
    return [check(
        "secrets.values-not-planned", "info", "secret values are not part of the plan",
        f"this plan names the secrets {', '.join(dep.secret_names)} but not their values, so a "
        "changed value does not show here; apply compares them with the host's active secrets "
        "(by digest, on the host) and, when they differ, restarts every running role at the "
        "switch and says so before it changes anything",
        "to review a rotation, run `dsv4ctl apply` without --yes: it lists the restarts "
        "before asking",
        subject="secrets")]


# Errors that a profile may acknowledge, each with why: a choice the operator can make knowingly
# (a firewall in front, a flag they trust) rather than a deployment that would fail. Acknowledged,
# they become acknowledged warnings and stop blocking apply; unacknowledged they block.
ACKNOWLEDGEABLE_ERRORS: dict[str, str] = {
    "exposure.all-interfaces": "every interface is reachable; a firewall may make that intended",
    "engine.foreign-code-flag": "the flag runs code or sends data the operator may trust",
}


def apply_acknowledgements(checks: Sequence[Check], acks: Iterable[tuple[str, str]], *,
                           report_unused: bool = True) -> list[Check]:
    """Mark acknowledged warnings (and the errors of :data:`ACKNOWLEDGEABLE_ERRORS`, which become
    acknowledged warnings); an acknowledgement of another error or of nothing is itself reported.
    ``report_unused=False``: the checks are only the static half (`validate`), so an
    acknowledgement may match a check only the host's facts raise; plan decides it."""
    ack = dict(acks)
    out: list[Check] = []
    used: set[str] = set()
    for c in checks:
        if c.id in ack:
            used.add(c.id)
            if c.severity == "error" and c.id in ACKNOWLEDGEABLE_ERRORS:
                out.append(c.model_copy(update={"severity": "warning", "acknowledged": True,
                                                "ack_reason": ack[c.id]}))
                continue
            if c.severity == "error":
                out.append(c)
                out.append(check(
                    "profile.ack-error", "error", "errors cannot be acknowledged",
                    f"the profile acknowledges {c.id}, which is an error: the deployment would fail",
                    f"fix the cause of {c.id} instead of acknowledging it", subject=c.id))
                continue
            out.append(c.model_copy(update={"acknowledged": True, "ack_reason": ack[c.id]}))
        else:
            out.append(c)
    for cid in sorted(set(ack) - used) if report_unused else ():
        out.append(check(
            "profile.ack-unused", "warning", "acknowledgement matches no check",
            f"the profile acknowledges {cid}, but the plan has no such check",
            "remove the stale acknowledgement (or correct the id)", subject=cid))
    return out


def drop_acks_used_on_other_hosts(checks: Sequence[Check], used: set[str]) -> list[Check]:
    """A fleet's host plans without the ``profile.ack-unused`` findings for acknowledgements that
    another host's plan used: one profile's acknowledgements apply to every host, and a check may
    exist on one host only (the router's ``exposure.all-interfaces`` on the router's host), so an
    acknowledgement is stale only when no host of the fleet matches it. ``used``: the ids
    acknowledged on any host."""
    return [c for c in checks if not (c.id == "profile.ack-unused" and c.subject in used)]
