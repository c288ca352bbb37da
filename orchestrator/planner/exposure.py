"""The plan's exposure checks: who can reach each endpoint the deployment listens on.

Each listener is classified by :func:`orchestrator.exposure.classify_listen` (the one owner of that
classification; status prints the same words). The rules:

- a listener on every interface (an engine's ``service_address: 0.0.0.0`` or ``::``, or
  ``topology.router.host`` set so) is an error unless the profile acknowledges
  ``exposure.all-interfaces``: it reaches every network the host is on, management and public ones
  included, where the private network between the hosts (for an engine) or the clients' network
  (for the router) was the intent;
- any endpoint beyond loopback without an API key is a warning (``exposure.no-key``): whoever can
  reach the address can use the model, and the engines' admin endpoints with it.

- an engine flag in ``extra_args`` that the catalog lists as running foreign code or sending or
  writing request data elsewhere (``foreign_code_flags``, with the engine's own words as the source)
  is an error unless the profile acknowledges ``engine.foreign-code-flag``.

Engines and the router go through the same two rules (one loop, :func:`exposure_checks`); what
differs is only the field that sets the address and so the fix. The router listens on loopback
unless the profile says otherwise (``topology.router.host``); in a fleet the router reaches the
engines at their hosts' ``service_address``, which is the engines' bind, not the router's.
"""

from __future__ import annotations

from typing import NamedTuple

from orchestrator.catalog import EngineRules
from orchestrator.deployment import Deployment
from orchestrator.errors import remove
from orchestrator.exposure import DESCRIPTION, classify_listen
from orchestrator.planner.checks import check
from orchestrator.planner_model import Check
from orchestrator.render.secrets import api_key_names

SOURCE = ("SGLang 0.5.23 server_args.py: --api-key unset serves every request, /flush_cache, "
          "/update_weights_* and /abort_request included")


class _Listener(NamedTuple):
    """One socket the deployment listens on, with what its two findings say about it."""
    subject: str  # a role's name, or "router"
    who: str  # "role decode", "the router"
    kind: str  # "engine" | "router": the check's title
    address: str
    port: int
    field: str  # the field that sets the address
    key: str | None  # the secret name of the key that guards it
    narrow: str  # the all-interfaces fix: how to bind less, or acknowledge it
    key_fix: str  # the no-key fix
    exposes: str  # what whoever reaches it can use
    key_field: str  # where the no-key finding points


def _listeners(dep: Deployment) -> list[_Listener]:
    engine_key, router_key = api_key_names(dep)
    out = [_Listener(
        role.name, f"role {role.name}", "engine", role.listen, role.port, "host.service_address",
        engine_key,
        "set service_address to the host's address on the private network between the hosts, "
        "or acknowledge exposure.all-interfaces with the reason (a firewall that admits only the "
        "router, say)",
        "set secrets.DSV4_SECRET_API_KEY (the router sends it to the engines), or acknowledge "
        "exposure.no-key when the network itself admits only the router",
        "the model and the engine's admin endpoints", f"topology.{role.name}")
        for role in dep.roles]
    r = dep.router
    if r is not None:
        out.append(_Listener(
            "router", "the router", "router", r.host, r.port, "topology.router.host", router_key,
            "set topology.router.host to the address clients use (or remove it: 127.0.0.1, this "
            "host only), or acknowledge exposure.all-interfaces with the reason (a firewall that "
            "admits only the clients, say) and set secrets.DSV4_SECRET_API_KEY",
            "set secrets.DSV4_SECRET_API_KEY (or DSV4_SECRET_ROUTER_API_KEY), or set "
            "topology.router.host to 127.0.0.1, or acknowledge exposure.no-key",
            "the model", "topology.router.host"))
    return out


def exposure_checks(dep: Deployment) -> list[Check]:
    """The exposure findings of one host's deployment (see the module's rules)."""
    out: list[Check] = []
    for lst in _listeners(dep):
        where = classify_listen(lst.address)
        if where == "all":
            out.append(check(
                "exposure.all-interfaces", "error", f"{lst.kind} listens on every interface",
                f"{lst.who} listens on {lst.address}:{lst.port} ({lst.field}), "
                f"{DESCRIPTION['all']}",
                lst.narrow, subject=lst.subject, field=lst.field, source=SOURCE,
                address=lst.address, port=lst.port))
        if where != "loopback" and lst.key is None:
            out.append(check(
                "exposure.no-key", "warning", "endpoint beyond loopback without an API key",
                f"{lst.who} listens on {lst.address}:{lst.port} ({DESCRIPTION[where]}) and no "
                f"API key is set: whoever reaches it can use {lst.exposes}",
                lst.key_fix, subject=lst.subject, field=lst.key_field, source=SOURCE,
                address=lst.address, port=lst.port))
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
            # the flag's words: the flag, and its value when it takes one as the next word
            words = [i] + ([i + 1] if spec is not None and spec.takes_value and "=" not in word
                           and i + 1 < len(role.extra_args) else [])
            out.append(check(
                "engine.foreign-code-flag", "error", "engine flag runs foreign code or sends data",
                f"role {role.name}: extra_args[{i}] = {word!r} {_KIND[f.kind]} ({f.kind})",
                f" ({word}{' and its value' if len(words) > 1 else ''}), or acknowledge "
                "engine.foreign-code-flag with why it is safe here (the code or the destination "
                "is yours)",
                subject=f"topology.{role.name}.extra_args",
                field=f"topology.{role.name}.extra_args.{i}", source=f.source,
                change=[remove(f"topology.{role.name}.extra_args.{w}") for w in words]))
    return out
