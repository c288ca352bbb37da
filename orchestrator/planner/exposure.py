"""The plan's exposure checks: who can reach each endpoint the deployment listens on.

Each listener is classified by :func:`orchestrator.exposure.classify_listen` (the one owner of that
classification; status prints the same words). The rules:

- an engine on every interface (``service_address: 0.0.0.0`` or ``::``) is an error unless the
  profile acknowledges ``exposure.all-interfaces``: it reaches every network the host is on,
  management and public ones included, and the private network between the hosts was the intent;
- any endpoint beyond loopback without an API key is a warning (``exposure.no-key``): whoever can
  reach the address can use the model, and the engines' admin endpoints with it.

- an engine flag in ``extra_args`` that the catalog lists as running foreign code or sending or
  writing request data elsewhere (``foreign_code_flags``, with the engine's own words as the source)
  is an error unless the profile acknowledges ``engine.foreign-code-flag``.

The router is the deployment's client-facing endpoint and listens on every interface by default
(``topology.router.host``), so for it only the missing key is reported.
"""

from __future__ import annotations

from orchestrator.catalog import EngineRules
from orchestrator.deployment import Deployment
from orchestrator.exposure import DESCRIPTION, classify_listen
from orchestrator.planner.checks import check
from orchestrator.planner_model import Check
from orchestrator.render.secrets import api_key_names

SOURCE = ("SGLang 0.5.23 server_args.py: --api-key unset serves every request, /flush_cache, "
          "/update_weights_* and /abort_request included")


def exposure_checks(dep: Deployment) -> list[Check]:
    """The exposure findings of one host's deployment (see the module's rules)."""
    out: list[Check] = []
    engine_key, router_key = api_key_names(dep)
    for role in dep.roles:
        where = classify_listen(role.listen)
        if where == "all":
            out.append(check(
                "exposure.all-interfaces", "error", "engine listens on every interface",
                f"role {role.name} listens on {role.listen}:{role.port}, "
                f"{DESCRIPTION['all']}",
                "set service_address to the host's address on the private network between the "
                "hosts, or acknowledge exposure.all-interfaces with the reason (a firewall that "
                "admits only the router, say)",
                subject=role.name, field="host.service_address", source=SOURCE,
                address=role.listen, port=role.port))
        if where != "loopback" and engine_key is None:
            out.append(check(
                "exposure.no-key", "warning", "endpoint beyond loopback without an API key",
                f"role {role.name} listens on {role.listen}:{role.port} "
                f"({DESCRIPTION[where]}) and no API key is set: whoever reaches it can use the "
                "model and the engine's admin endpoints",
                "set secrets.DSV4_SECRET_API_KEY (the router sends it to the engines), or "
                "acknowledge exposure.no-key when the network itself admits only the router",
                subject=role.name, field=f"topology.{role.name}", source=SOURCE,
                address=role.listen, port=role.port))
    r = dep.router
    if r is not None:
        where = classify_listen(r.host)
        if where != "loopback" and router_key is None:
            out.append(check(
                "exposure.no-key", "warning", "endpoint beyond loopback without an API key",
                f"the router listens on {r.host}:{r.port} ({DESCRIPTION[where]}) and no API "
                "key is set: whoever reaches it can use the model",
                "set secrets.DSV4_SECRET_API_KEY (or DSV4_SECRET_ROUTER_API_KEY), or set "
                "topology.router.host to 127.0.0.1 or the address clients use, or acknowledge "
                "exposure.no-key",
                subject="router", field="topology.router.host", source=SOURCE,
                address=r.host, port=r.port))
    return out


_KIND = {"runs-foreign-code": "runs code from outside the engine environment",
         "sends-data-off-host": "sends data to another host",
         "writes-request-data": "writes request data (prompts, outputs) elsewhere"}


def foreign_flag_checks(engine: EngineRules, dep: Deployment) -> list[Check]:
    """``engine.foreign-code-flag``: each word of a role's ``extra_args`` naming (under any alias,
    or as ``--flag=value``) a flag the catalog lists in ``foreign_code_flags``."""
    from orchestrator.catalog.flags import UnknownFlagTableError, load_flag_table

    if not engine.foreign_code_flags:
        return []
    try:
        table = load_flag_table(dep.engine_name, dep.engine_version)
    except UnknownFlagTableError:
        return []  # engine.flag-table says so
    listed = {}
    for f in engine.foreign_code_flags:
        spec = table.spec(f.flag)
        listed[spec.dest if spec is not None else f.flag] = f
    out = []
    for role in dep.roles:
        for i, word in enumerate(role.extra_args):
            if not word.startswith("--"):
                continue
            name = word.split("=", 1)[0]
            spec = table.spec(name)
            f = listed.get(spec.dest if spec is not None else name)
            if f is None:
                continue
            out.append(check(
                "engine.foreign-code-flag", "error", "engine flag runs foreign code or sends data",
                f"role {role.name}: extra_args[{i}] = {word!r} {_KIND[f.kind]} ({f.kind})",
                "remove it, or acknowledge engine.foreign-code-flag with why it is safe here "
                "(the code or the destination is yours)",
                subject=f"topology.{role.name}.extra_args",
                field=f"topology.{role.name}.extra_args.{i}", source=f.source))
    return out
