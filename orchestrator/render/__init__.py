"""Render a profile into the release tree a host receives: units, launch scripts, env, configs.

Owns the release tree's content (layout: ``units/<unit>``, ``bin/launch-<role>.sh``,
``env/<role>.env``, ``monitoring/...``, ``profile.yaml``; ``manifest()`` hashes them). Why a
library function: ``plan`` puts the tree into the Plan, ``apply`` uploads it, ``render``/``diff``
show it, and all must see byte-identical files for the same inputs. Rendering is pure: no clock, no
host, sorted output, every file ends with one newline.

Every value is quoted for the context it lands in by :mod:`orchestrator.render.quoting` before a
template sees it; templates only lay text out. Engine and router arguments come from
:mod:`orchestrator.render.argv` as lists, so tests can run them through the real upstream parsers.

Past 400 lines on purpose: one builder per kind of file in the tree (engine, router, monitoring,
profile, kernels) around the shared unit and sandbox helpers; the decisions with a seam of their
own already live apart (:mod:`.quoting`, :mod:`.argv`, :mod:`.secrets`, :mod:`.diff`).
"""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from orchestrator.deployment import LOOPBACK, Deployment, RoleDeployment
from orchestrator.errors import RenderError, fix_text, remove
from orchestrator.profile.schema import ColocatedTopology, Profile
from orchestrator.render.argv import (
    engine_argv,
    engine_program,
    router_argv,
    router_program,
)
from orchestrator.render.quoting import (
    env_file_line,
    exec_line,
    sh_quote,
    unit_path,
    unit_value,
)
from orchestrator.render.secrets import (
    ENGINE_ENTRY,
    ROUTER_ENGINE,
    ROUTER_ENTRY,
    check_secret_names,
    refuse_secret_extra_args,
    secret_args,
    shim_program,
)

__all__ = [
    "MANIFEST_FORMAT",
    "ReleaseTree",
    "RenderedFile",
    "engine_argv",
    "engine_env",
    "render_release",
    "router_argv",
]

MANIFEST_FORMAT = 1
MODE_FILE = 0o644
MODE_SCRIPT = 0o755

# Environment names dsv4ctl sets itself; a role's `env:` may not override them (the unit reads the
# env file after its own settings, so a profile value would silently win over `gpus:`).
# Environment that activates the bundled kernels inside SGLang 0.5.23 (kernels/dsv4_kernels/
# sglang_hook.py), per role, from the role's decided kernel paths (orchestrator/kernel_paths.py,
# the one owner): the hook's switch, the ops it patches, and for each bundled op the SGLang
# settings that route it to the Python entry point the hook replaces (the catalog's
# kernel_paths.ops.<op>.bundled_env: SGLANG_SM120_FLASHMLA_BACKEND=triton for attention;
# SGLANG_FP8_PAGED_MQA_LOGITS_TORCH=1 and SGLANG_OPT_USE_TILELANG_INDEXER=0 for the indexer, since
# SGLang's V4 hook turns TileLang on on sm_120 unless set, model_hook.py L495-502, and the indexer
# tests TileLang first, dsv4/indexer.py L862-872). An op on the engine's path renders nothing: the
# engine takes its own default. Rendered rather than forced by the import hook so that the env
# file, `plan` and the headroom model show the path the engine takes.
HOOK_ENV = "DSV4_KERNELS_SGLANG"
HOOK_OPS_ENV = "DSV4_KERNELS_OPS"
# every SGLang variable a bundled op may render (a role's env may not set them while it does)
ROUTING_ENV = ("SGLANG_SM120_FLASHMLA_BACKEND", "SGLANG_FP8_PAGED_MQA_LOGITS_TORCH",
               "SGLANG_OPT_USE_TILELANG_INDEXER")
# the hook's switch of the single-switch releases (kernels.bf16_gemms); still read by the hook
LEGACY_BF16_GEMMS_ENV = "DSV4_KERNELS_BF16_GEMMS"
# The kernels ship inside each release (apply unpacks them into releases/<id>/kernels/); the
# engine imports them through `current`, so the switch and a rollback select them with the
# release (issue 20 item 6). PYTHONPATH precedes site-packages, so the engine env's .pth hook line
# imports dsv4_kernels from here, not from a copy an older dsv4ctl pip-installed into the env.
KERNELS_PATH_ENV = "PYTHONPATH"
RESERVED_ENV = ("CUDA_VISIBLE_DEVICES", HOOK_ENV, HOOK_OPS_ENV, *ROUTING_ENV,
                LEGACY_BF16_GEMMS_ENV, KERNELS_PATH_ENV)


# Knobs only dsv4ctl reads (health, rollout, monitoring) reach no unit and no command line, so
# changing them restarts nothing. health.startup_timeout_s is apply's own deadline for a start
# (it polls readiness that long); the units and the router carry fixed values instead:
# - Type=exec: systemd's start job ends once the launch script is exec'd (systemd.service(5)),
#   so TimeoutStartSec bounds only that instant, never the model load;
# - the start-limit window holds three loads of up to 30 min plus RestartSec-and-margin, so a
#   release that crashes while loading stops restarting as "failed" instead of thrashing the GPUs;
# - the router waits as long as the longest startup_timeout_s the schema allows: apply's
#   health check, not the router, decides when a start has failed (and rolls back).
ENGINE_TIMEOUT_START_S = 300
ENGINE_START_LIMIT_INTERVAL_S = 3 * (1800 + 60)
ROUTER_WORKER_WAIT_S = 86400


def _reserved_source(name: str, role: RoleDeployment) -> str:
    if name == "CUDA_VISIBLE_DEVICES":
        return "gpus"
    ops = [p.op for p in role.kernels if p.path == "bundled"
           and (name not in ROUTING_ENV or name in dict(p.env))]
    return ", ".join(f"kernels.{op}: bundled" for op in ops) or "kernels"


@dataclass(frozen=True)
class RenderedFile:
    content: str
    mode: int = MODE_FILE
    roles: tuple[str, ...] = ()  # roles that must restart when this file changes

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.content.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class ReleaseTree:
    deployment: str
    files: dict[str, RenderedFile] = field(default_factory=dict)

    def manifest(self) -> str:
        """``manifest.json``: sha256, mode and restart roles of every file; deterministic."""
        doc = {
            "format": MANIFEST_FORMAT,
            "deployment": self.deployment,
            "files": {
                path: {
                    "mode": f"{f.mode:04o}",
                    "roles": list(f.roles),
                    "sha256": f.sha256,
                }
                for path, f in sorted(self.files.items())
            },
        }
        return json.dumps(doc, indent=2, sort_keys=True) + "\n"

    def digest(self) -> str:
        """A short content id of the whole tree (sha256 of the manifest)."""
        return hashlib.sha256(self.manifest().encode()).hexdigest()[:16]

    def all_files(self) -> dict[str, RenderedFile]:
        """The files plus ``manifest.json``: what a release directory holds."""
        out = dict(self.files)
        out["manifest.json"] = RenderedFile(self.manifest(), MODE_FILE, ())
        return dict(sorted(out.items()))

    def write(self, root: Path) -> list[Path]:
        """Write the tree under ``root`` (which must exist) with its modes, whatever the umask,
        never through a symbolic link (orchestrator.localfs); returns the paths written."""
        from orchestrator.localfs import make_dirs, write_atomic

        root.mkdir(mode=0o755, parents=True, exist_ok=True)
        written = []
        for rel, f in self.all_files().items():
            *dirs, name = rel.split("/")
            path = make_dirs(root, tuple(dirs)) / name
            write_atomic(path, f.content.encode("utf-8"), f.mode)
            written.append(path)
        return written

    def to_text(self) -> str:
        """All files in one stream (for ``render --stdout`` and git textconv)."""
        parts = []
        for rel, f in self.all_files().items():
            body = f.content
            roles = ",".join(f.roles) or "-"
            parts.append(f"==> {rel} (mode {f.mode:04o}, restarts {roles}) <==\n{body}")
        return "\n".join(parts)


@functools.cache
def _env() -> object:
    """One jinja environment per process: templates compile once."""
    import jinja2

    from orchestrator.paths import data_dir

    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(data_dir("templates"))),
        undefined=jinja2.StrictUndefined,
        autoescape=False,  # not HTML: every value is quoted for its context before it gets here
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )


def _render(env: object, template: str, **ctx: object) -> str:
    import jinja2

    assert isinstance(env, jinja2.Environment)
    try:
        text = env.get_template(template).render(**ctx)
    except jinja2.TemplateError as exc:
        raise RenderError(f"template {template} failed: {exc}",
                          fix="this is a dsv4ctl bug; report it with the profile") from None
    return text.rstrip("\n") + "\n"


def _header(dep: Deployment) -> str:
    return (f"Generated by dsv4ctl from profile '{dep.name}' for {dep.engine_name} "
            f"{dep.engine_version}; do not edit, `dsv4ctl render` rewrites it.")


def _role_field(profile: Profile, role: str) -> str:
    """The profile path of a role's settings (``topology.engine`` when colocated)."""
    return f"topology.{role}"


def _arg_lines(argv: list[str], field: str) -> str:
    """Group argv into one line per option with its values; each word quoted for bash."""
    lines: list[list[str]] = []
    for word in argv:
        if word.startswith("--") or not lines:
            lines.append([word])
        else:
            lines[-1].append(word)
    return " \\\n  ".join(" ".join(sh_quote(w, field) for w in line) for line in lines)


def _command(program: list[str], argv: list[str], field: str) -> str:
    return " ".join(sh_quote(w, field) for w in program) + " \\\n  " + _arg_lines(argv, field)


def _unit_order(dep: Deployment, after: list[str]) -> list[str]:
    lines = []
    if dep.scope == "system":
        # network-online.target exists only in the system manager.
        lines += ["Wants=network-online.target", "After=network-online.target"]
    if after:
        units = " ".join(unit_value(u, "unit") for u in after)
        lines += [f"Wants={units}", f"After={units}"]
    return lines


# Device classes (/proc/devices) the engines open: /dev/nvidiactl, /dev/nvidia[0-9]*, and
# /dev/nvidia-modeset share the nvidia-frontend major; /dev/nvidia-uvm(-tools); /dev/nvidia-caps/*.
_GPU_DEVICES = ("char-nvidia-frontend rw", "char-nvidia-uvm rw", "char-nvidia-caps rw")
_RDMA_DEVICES = ("char-infiniband_verbs rw", "char-infiniband_mad rw")  # mooncake/nixl over RDMA


def _sandbox(dep: Deployment, role: str, *, gpus: bool) -> dict[str, object]:
    """What the unit's sandbox (templates/sandbox.service.j2) needs: the user, the only paths it
    writes, the devices it opens."""
    root = dep.install_root
    ro_home = any(p == h or p.startswith(h + "/") for p in (root, dep.engine_env, dep.model_path)
                  for h in ("/home", "/root"))
    devices = (_GPU_DEVICES + (_RDMA_DEVICES if dep.rdma else ())) if gpus else ()
    return {
        "service_user": unit_value(dep.service_user, "host.service_user"),
        # read-only rather than hidden when the engine, the checkpoint or the root live there; and
        # always in user scope, where the user's own Python behind the engine env's venv links
        # (uv, pyenv: ~/.local/share/uv/python, ~/.pyenv) is as likely to live in its home, which
        # the profile does not show (hidden, the unit fails with 203/EXEC)
        "protect_home": "read-only" if ro_home or dep.scope == "user" else "yes",
        "read_write_paths": [unit_path(f"{root}/logs", "host.install_root")],
        "cache_directory": unit_value(f"dsv4-{dep.name}-{role}", "name"),
        "device_allow": list(devices),
    }


def _common_unit(dep: Deployment, role: str) -> dict[str, object]:
    root = dep.install_root
    return {
        "header": _header(dep),
        "working_directory": unit_path(root, "host.install_root"),
        "log_file": unit_path(f"{root}/logs/{role}.log", "host.install_root"),
        "exec_start": exec_line([f"{root}/current/bin/launch-{role}.sh"], "host.install_root"),
        "wanted_by": "multi-user.target" if dep.scope == "system" else "default.target",
        "system_scope": dep.scope == "system",
    }


def _description(dep: Deployment, what: str) -> str:
    # Not profile.description: editing a comment must not change a unit, which would restart (and
    # reload the model of) every role.
    return unit_value(f"dsv4ctl {dep.name} {what}", "name")


def _fleet_pd(role: RoleDeployment) -> bool:
    return role.disaggregation_mode is not None and role.listen != LOOPBACK


def kernels_path(install_root: str) -> str:
    """Where the engine imports the kernels of the release ``current`` points to."""
    return f"{install_root}/current/kernels"


def engine_env(dep: Deployment, role: RoleDeployment, field: str) -> list[tuple[str, str, str]]:
    """``(name, value, profile field it comes from)`` of every variable in the role's env file,
    in file order (later wins, as in systemd's ``EnvironmentFile=``): what the engine process
    starts with. The planner reads the engine's env here too (its indexer path), so both see the
    same values. ``field``: the role's profile path, for the role's own ``env:`` entries."""
    out = [("CUDA_VISIBLE_DEVICES", ",".join(str(g) for g in role.gpus), field)]
    bundled = [p for p in role.kernels if p.path == "bundled"]
    if bundled:
        src = ",".join(f"kernels.{p.op}" for p in bundled)
        out.append((HOOK_ENV, "1", src))
        out.append((HOOK_OPS_ENV, ",".join(p.op for p in bundled), src))
        out += [(k, v, f"kernels.{p.op}") for p in bundled for k, v in p.env]
        out.append((KERNELS_PATH_ENV, kernels_path(dep.install_root), src))
    if _fleet_pd(role):
        # A fleet's PD engine hands KV to peers on other hosts. Its transfer endpoint binds
        # get_local_ip_auto(), which reads SGLANG_HOST_IP before guessing an interface (sglang
        # 0.5.23 srt/utils/network.py L416-419, srt/disaggregation/common/conn.py L368, L401): on
        # a host with several networks the guess may not be the private one the peers reach.
        out.append(("SGLANG_HOST_IP", role.listen, "host.service_address"))
    out += [(k, v, f"{field}.env.{k}") for k, v in role.env]
    return out


# Variables that make a process load or run code from elsewhere before or beside the engine: the
# dynamic loader's, the shells' start-up files, interpreter start-up and search paths (issue 31:
# role env accepted LD_PRELOAD, BASH_ENV and PATH). Sources: ld.so(8) ENVIRONMENT, bash(1)
# INVOCATION (BASH_ENV, ENV) and exported functions (BASH_FUNC_*), python(1) ENVIRONMENT
# VARIABLES, glibc iconv(3) (GCONV_PATH), node(1) NODE_OPTIONS, perlrun(1) PERL5LIB/PERL5OPT.
LOADER_ENV = frozenset({
    "PATH", "BASH_ENV", "ENV", "IFS", "SHELLOPTS", "BASHOPTS", "PS4", "PYTHONPATH",
    "PYTHONHOME", "PYTHONSTARTUP", "PYTHONUSERBASE", "PYTHONEXECUTABLE", "PYTHONBREAKPOINT",
    "PYTHONINSPECT", "PYTHONPLATLIBDIR", "PERL5LIB", "PERL5OPT", "PERLLIB", "RUBYOPT", "RUBYLIB",
    "NODE_OPTIONS", "NODE_PATH", "GCONV_PATH", "LOCPATH", "HOSTALIASES", "RESOLV_HOST_CONF",
    "NLSPATH",
})
LOADER_ENV_PREFIXES = ("LD_", "BASH_FUNC_", "DYLD_")


def is_loader_env(name: str) -> bool:
    return name in LOADER_ENV or name.startswith(LOADER_ENV_PREFIXES)


def reserved_env_problems(dep: Deployment, role: RoleDeployment) -> list[tuple[str, str, str]]:
    """``(field, reason, then)`` for each variable of the role's ``env:`` that dsv4ctl renders
    itself: the fix removes ``field``, and ``then`` says what follows (its text:
    :func:`reserved_env_fix`). One owner: render refuses the first, and the planner's static
    checks report them all with their YAML location (so `validate` catches what render would
    refuse)."""
    field = f"topology.{role.name}"
    names = {k for k, _ in role.env}
    out = []
    hooked = any(p.path == "bundled" for p in role.kernels)
    # SGLang's routing variables are dsv4ctl's only where a bundled op of the role renders them;
    # on the engine's path the role's env may steer SGLang (plan names what then runs)
    routed = {k for p in role.kernels if p.path == "bundled" for k, _ in p.env}
    for reserved in RESERVED_ENV:
        owned = (reserved == "CUDA_VISIBLE_DEVICES" or reserved in routed
                 or (hooked and reserved not in ROUTING_ENV))
        if reserved in names and owned:
            out.append((f"{field}.env.{reserved}",
                        f"dsv4ctl sets {reserved} itself (from {_reserved_source(reserved, role)})",
                        ", or set the kernels.<op> choices to engine (then the role's env "
                        "reaches SGLang unchanged)" if reserved != "CUDA_VISIBLE_DEVICES" else ""))
    said = {where.rsplit(".", 1)[1] for where, _, _ in out}
    for name in sorted(n for n in names if is_loader_env(n) and n not in said):
        out.append((f"{field}.env.{name}",
                    f"{name} is a loader variable: it makes the engine's processes load or run "
                    "code from wherever it points, before or beside the engine environment's",
                    "; install what the engine needs into the engine environment (engine.env) "
                    "instead"))
    if _fleet_pd(role) and "SGLANG_HOST_IP" in names:
        out.append((f"{field}.env.SGLANG_HOST_IP",
                    "dsv4ctl sets it itself in a fleet (from the host's service_address)",
                    "; set service_address in the inventory"))
    return out


def reserved_env_fix(field: str, then: str) -> str:
    """The fix of a :func:`reserved_env_problems` entry: remove ``field``, then ``then``."""
    return fix_text([remove(field)], then)


def _engine_files(env: object, profile: Profile, dep: Deployment, role: RoleDeployment
                  ) -> dict[str, RenderedFile]:
    field = _role_field(profile, role.name)
    refuse_secret_extra_args(dep, role, field)
    for i, word in enumerate(role.extra_args):  # precise field names for what cannot be quoted
        sh_quote(word, f"{field}.extra_args[{i}]")
    argv = engine_argv(dep, role)
    if not argv:
        raise RenderError(f"{field}: empty engine command line")
    for where, message, then in reserved_env_problems(dep, role):
        raise RenderError(f"{where}: {message}", fix=reserved_env_fix(where, then))
    env_lines = [env_file_line(k, v, src) for k, v, src in engine_env(dep, role, field)]

    root = dep.install_root
    secrets = f"{root}/secrets/{dep.name}.env"
    what = (f"{role.name} engine" if role.disaggregation_mode else "engine")
    unit = _render(
        env, "engine.service.j2",
        description=_description(dep, f"{what} (sglang {dep.engine_version}, GPUs "
                                 f"{','.join(str(g) for g in role.gpus)})"),
        unit_order=_unit_order(dep, []),
        start_limit_interval_s=ENGINE_START_LIMIT_INTERVAL_S,
        env_file=unit_path(f"{root}/current/env/{role.name}.env", "host.install_root"),
        secrets_file=unit_path(secrets, "host.install_root"),
        timeout_start_s=ENGINE_TIMEOUT_START_S,
        **_common_unit(dep, role.name),
        **_sandbox(dep, role.name, gpus=True),
    )
    pairs = secret_args(dep, dep.engine_name)
    program = ([*shim_program(f"{dep.engine_env}/bin/python", ENGINE_ENTRY, pairs), "serve"]
               if pairs else engine_program(dep))
    launch = _render(
        env, "launch.sh.j2",
        header=_header(dep),
        summary=f"{role.unit}: sglang serve, TP {role.tp}, GPUs {','.join(map(str, role.gpus))}"
                + (f"; {', '.join(f for f, _ in pairs)} from the secrets file" if pairs else ""),
        command=_command(program, argv, field),
    )
    envfile = _render(env, "role.env.j2", header=_header(dep), unit=role.unit,
                      secrets_file=secrets, lines=env_lines)
    roles = (role.name,)
    return {
        f"units/{role.unit}": RenderedFile(unit, MODE_FILE, roles),
        f"bin/launch-{role.name}.sh": RenderedFile(launch, MODE_SCRIPT, roles),
        f"env/{role.name}.env": RenderedFile(envfile, MODE_FILE, roles),
    }


def _router_files(env: object, profile: Profile, dep: Deployment) -> dict[str, RenderedFile]:
    assert dep.router is not None
    argv = router_argv(dep, worker_startup_timeout_s=ROUTER_WORKER_WAIT_S)
    pairs = secret_args(dep, ROUTER_ENGINE)
    program = (shim_program(f"{dep.engine_env}/bin/python", ROUTER_ENTRY, pairs) if pairs
               else router_program(dep))
    unit = _render(
        env, "router.service.j2",
        secrets_file=(unit_path(f"{dep.install_root}/secrets/{dep.name}.env", "host.install_root")
                      if pairs else ""),
        description=_description(dep, f"{'PD router' if dep.router.pd else 'router'} "
                                 f"(sglang-router {dep.router_version})"),
        unit_order=_unit_order(dep, [r.unit for r in dep.roles]),
        start_limit_interval_s=600,
        timeout_start_s=300,
        **_common_unit(dep, "router"),
        **_sandbox(dep, "router", gpus=False),
    )
    launch = _render(
        env, "launch.sh.j2",
        header=_header(dep),
        summary=f"{dep.router.unit}: sglang-router {dep.router_version}, "
                + (f"PD {len(dep.router.prefill)} prefill + {len(dep.router.decode)} decode"
                   if dep.router.pd else f"{len(dep.router.worker_urls)} workers"),
        command=_command(program, argv, "topology.router"),
    )
    roles = ("router",)
    return {
        f"units/{dep.router.unit}": RenderedFile(unit, MODE_FILE, roles),
        "bin/launch-router.sh": RenderedFile(launch, MODE_SCRIPT, roles),
    }


def _monitoring_files(profile: Profile, dep: Deployment) -> dict[str, str]:
    """Scrape config, rules, rule tests and dashboard, from the observability module (paths there
    are relative to ``monitoring/``); empty when monitoring is disabled."""
    from orchestrator.monitoring import release_files

    return {f"monitoring/{rel}": text for rel, text in release_files(profile, dep).items()}


def _drop_unset_fleet_keys(data: dict) -> None:
    """Fleet fields (issue 23) left unset are not written out: a single-host release record reads
    as it did before fleets existed (and stays byte-identical), and leaving them out means the
    same as null."""
    for key in ("host", "hosts"):
        if data.get(key) is None:
            data.pop(key, None)
    topo = data["topology"]
    if topo.get("router", {}) is None:
        topo.pop("router")
    elif "router" in topo and topo["router"].get("runs_on") is None:
        topo["router"].pop("runs_on", None)
    for role in ("engine", "prefill", "decode"):
        if role in topo and topo[role].get("hosts") is None:
            topo[role].pop("hosts", None)


def resolved_profile_yaml(profile: Profile, dep: Deployment) -> str:
    """The profile with every default written out (ports, index_topk, context length): applyable
    as is, and what a reviewer reads to know exactly what a release ran."""
    data = profile.model_dump(mode="json", by_alias=True)
    _drop_unset_fleet_keys(data)
    data["attention"]["index_topk"] = dep.index_topk
    data["attention"]["context_length"] = dep.context_length
    topo = data["topology"]
    for role in dep.roles:
        r = topo["engine"] if isinstance(profile.topology, ColocatedTopology) else topo[role.name]
        r["port"] = role.port
        r["nccl_port"] = role.nccl_port
        r["engine_info_bootstrap_port"] = role.engine_info_bootstrap_port
        if role.bootstrap_port is not None:
            r["bootstrap_port"] = role.bootstrap_port
    Profile.model_validate(data)  # the record must itself be a valid profile
    head = (f"# {_header(dep)}\n# The resolved profile of this release: every default written out; "
            "`dsv4ctl apply` accepts it as is.\n")
    return head + yaml.safe_dump(data, sort_keys=False, default_flow_style=False,
                                 allow_unicode=True, width=100)


def _kernels_file(dep: Deployment) -> RenderedFile | None:
    """``kernels.json``: the digest of the kernels package apply installs, read by every engine
    role (the hook loads them at start), so a kernel change restarts the engines like any change
    of their files. None with kernels disabled (or no kernels package to ship)."""
    from orchestrator import kernels_package

    digest = kernels_package.digest() if dep.kernels_enabled and dep.roles else None
    if digest is None:  # kernels off, no engine on this host (a fleet's router), no package
        return None
    text = json.dumps({"package": "dsv4-kernels", "sha256": digest}, indent=2, sort_keys=True)
    return RenderedFile(text + "\n", MODE_FILE, tuple(r.name for r in dep.roles))


def render_release(profile: Profile, deployment: Deployment, *,
                   extra_files: dict[str, str] | None = None) -> ReleaseTree:
    """Render the release tree of ``deployment`` (resolved from ``profile``)."""
    if profile.name != deployment.name:
        raise RenderError(f"profile {profile.name!r} and deployment {deployment.name!r} differ",
                          fix="resolve the deployment from this profile")
    env = _env()
    check_secret_names(deployment, [
        "CUDA_VISIBLE_DEVICES", *RESERVED_ENV, *(k for r in deployment.roles for k, _ in r.env)])
    files: dict[str, RenderedFile] = {}
    for role in deployment.roles:
        files.update(_engine_files(env, profile, deployment, role))
    if deployment.router is not None:
        files.update(_router_files(env, profile, deployment))
    for rel, text in _monitoring_files(profile, deployment).items():
        files[rel] = RenderedFile(text if text.endswith("\n") else text + "\n", MODE_FILE, ())
    files["profile.yaml"] = RenderedFile(resolved_profile_yaml(profile, deployment), MODE_FILE, ())
    kernels = _kernels_file(deployment)
    if kernels is not None:
        files["kernels.json"] = kernels
    for rel, text in sorted((extra_files or {}).items()):
        if rel in files or rel == "manifest.json" or rel.startswith("/") or ".." in rel.split("/"):
            raise RenderError(f"extra file {rel!r} would overwrite or escape the release tree")
        files[rel] = RenderedFile(text if text.endswith("\n") else text + "\n", MODE_FILE, ())
    return ReleaseTree(deployment.name, dict(sorted(files.items())))
