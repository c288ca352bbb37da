"""Where clients connect: each endpoint of a deployment with its URL, its exposure and whether an
API key guards it.

Owns the one description apply and status end with. The exposure words come from
:func:`orchestrator.exposure.classify_listen` (the classification the plan's exposure checks use),
and whether a key guards an endpoint from :func:`orchestrator.render.secrets.api_key_names` (the
keys the rendered command lines carry), so the plan's warnings and these lines cannot disagree.
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.deployment import Deployment
from orchestrator.exposure import DESCRIPTION, Exposure, classify_listen
from orchestrator.render.secrets import api_key_names


@dataclass(frozen=True)
class Endpoint:
    name: str  # router | a role
    url: str  # what a client puts as its OpenAI base URL
    exposure: Exposure
    key: str | None  # the secret name of the key a client must send; None: no key
    client_facing: bool  # False: an engine behind the router (clients use the router)

    def line(self) -> str:
        guard = f"API key required ({self.key})" if self.key else "no API key"
        reach = DESCRIPTION[self.exposure] + (" (from the host itself)"
                                              if self.exposure == "loopback" else "")
        role = self.name if self.client_facing else f"{self.name}, behind the router"
        return f"{self.url}  ({role}; {reach}; {guard})"


def _url(listen: str, port: int, host_address: str) -> str:
    where = classify_listen(listen)
    addr = host_address if where == "all" else listen
    if ":" in addr and not addr.startswith("["):
        addr = f"[{addr}]"
    return f"http://{addr}:{port}/v1"


def endpoints(dep: Deployment, host_address: str) -> list[Endpoint]:
    """The deployment's endpoints on this host: the router first (when it runs here), then each
    engine role. ``host_address``: the inventory address clients use for "every interface"."""
    engine_key, router_key = api_key_names(dep)
    out: list[Endpoint] = []
    if dep.router is not None:
        r = dep.router
        out.append(Endpoint("router", _url(r.host, r.port, host_address),
                            classify_listen(r.host), router_key, True))
    for role in dep.roles:
        out.append(Endpoint(role.name, _url(role.listen, role.port, host_address),
                            classify_listen(role.listen), engine_key, dep.router is None))
    return out


def endpoint_lines(dep: Deployment, host_address: str) -> list[str]:
    """``Endpoints:`` and one line each, for the end of apply and status."""
    eps = endpoints(dep, host_address)
    return ["Endpoints:", *(f"  {e.line()}" for e in eps)] if eps else []
