"""Where clients connect: each endpoint of a deployment with its URL, its exposure and whether an
API key guards it.

Owns the one description apply, rollback and status end with, for one host and for a fleet (the
router, its front door, first; then each engine host's engines, each named with its host). The
exposure words come from :func:`orchestrator.exposure.classify_listen` (the classification the
plan's exposure checks use), and whether a key guards an endpoint from
:func:`orchestrator.render.secrets.api_key_names` (the keys the rendered command lines carry), so
the plan's warnings and these lines cannot disagree.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

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
    # the fleet member it runs on; None on a host of its own (its name is the run's already)
    host: str | None = None

    def line(self) -> str:
        guard = f"API key required ({self.key})" if self.key else "no API key"
        reach = DESCRIPTION[self.exposure] + (" (from the host itself)"
                                              if self.exposure == "loopback" else "")
        who = self.name + (f" on {self.host}" if self.host else "")
        role = who if self.client_facing else f"{who}, behind the router"
        return f"{self.url}  ({role}; {reach}; {guard})"

    def as_dict(self) -> dict[str, Any]:
        """The endpoint in ``--format json`` documents (status, apply, rollback)."""
        return {"name": self.name, "host": self.host, "url": self.url,
                "exposure": self.exposure, "key": self.key, "client_facing": self.client_facing}


def _url(listen: str, port: int, host_address: str) -> str:
    where = classify_listen(listen)
    addr = host_address if where == "all" else listen
    if ":" in addr and not addr.startswith("["):
        addr = f"[{addr}]"
    return f"http://{addr}:{port}/v1"


def endpoints(dep: Deployment, host_address: str) -> list[Endpoint]:
    """The deployment's endpoints on this host: the router first (when it runs here), then each
    engine role. ``host_address``: the inventory address clients use for "every interface". An
    engine is behind the router when one fronts it, on this host or (a fleet) on another."""
    engine_key, router_key = api_key_names(dep)
    member = dep.host if dep.fleet else None
    out: list[Endpoint] = []
    if dep.router is not None:
        r = dep.router
        out.append(Endpoint("router", _url(r.host, r.port, host_address),
                            classify_listen(r.host), router_key, True, member))
    alone = dep.router is None and dep.router_on is None
    for role in dep.roles:
        out.append(Endpoint(role.name, _url(role.listen, role.port, host_address),
                            classify_listen(role.listen), engine_key, alone, member))
    return out


def fleet_endpoints(members: Iterable[Sequence[Endpoint]]) -> list[Endpoint]:
    """Every member's endpoints (each host's, in the fleet's order) as one list: the router, the
    fleet's front door, first, then each engine host's engines."""
    every = [e for eps in members for e in eps]
    return [e for e in every if e.name == "router"] + [e for e in every if e.name != "router"]


def endpoint_lines(eps: Sequence[Endpoint]) -> list[str]:
    """``Endpoints:`` and one line each, for the end of apply, rollback and status."""
    return ["Endpoints:", *(f"  {e.line()}" for e in eps)] if eps else []
