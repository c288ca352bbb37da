"""The plan's exposure checks: who can reach each endpoint the deployment listens on.

Each listener is classified by :func:`orchestrator.exposure.classify_listen` (the one owner of that
classification; status prints the same words). The rules:

- an engine on every interface (``service_address: 0.0.0.0`` or ``::``) is an error unless the
  profile acknowledges ``exposure.all-interfaces``: it reaches every network the host is on,
  management and public ones included, and the private network between the hosts was the intent;
- any endpoint beyond loopback without an API key is a warning (``exposure.no-key``): whoever can
  reach the address can use the model, and the engines' admin endpoints with it.

The router is the deployment's client-facing endpoint and listens on every interface by default
(``topology.router.host``), so for it only the missing key is reported.
"""

from __future__ import annotations

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
