"""How a fleet's change rolls out, and the downtime clients really see, from the rollout strategy.

Owns the waves (canary first, then at most ``max_unavailable`` hosts at a time, in fleet order):
the fleet apply runs them (:mod:`orchestrator.apply.rollout` imports :func:`waves` from here),
and ``plan`` and ``diff`` state the downtime they imply, so the prediction and the run cannot
disagree. A host in a wave is drained through the router before its engines restart and put back
once healthy, so clients see an outage only when a wave takes out every host that runs some
engine role (or the fleet is one host); the router's own restart refuses connections for seconds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from orchestrator.planner_model import Action


def waves(hosts: Sequence[str], canary: int, max_unavailable: int) -> list[list[str]]:
    """The canary wave, then waves of at most ``max_unavailable``, in fleet order."""
    hosts = list(hosts)
    first = hosts[:canary]
    rest = hosts[canary:]
    out = [first] if first else []
    step = max(1, max_unavailable)
    out += [rest[i: i + step] for i in range(0, len(rest), step)]
    return out


@dataclass(frozen=True)
class Downtime:
    outage: bool  # some engine role has no serving host for minutes
    text: str  # the sentence plan and diff print after "downtime: "


def _engines_down(actions: Sequence[Action]) -> set[str]:
    return {r for a in actions if a.kind in ("stop", "restart") and a.downtime == "minutes"
            for r in a.roles if r != "router"}


def fleet_downtime(order: Sequence[str], actions: Mapping[str, Sequence[Action]],
                   roles: Mapping[str, Sequence[str]], canary: int, max_unavailable: int,
                   drain_timeout_s: float | None = None) -> Downtime | None:
    """The downtime of a fleet's change (None for a fleet of one: the host's own actions say
    it). ``order``: the engine hosts in rollout order; ``actions``: each host's transition
    (the router's host among them); ``roles``: the engine roles each host runs."""
    engine_hosts = [h for h in order if roles.get(h)]
    if len(engine_hosts) < 2:
        return None
    router_restart = any(a.kind in ("restart", "stop") and "router" in a.roles
                         for acts in actions.values() for a in acts)
    router = ("; the router restarts: clients see refused connections for seconds"
              if router_restart else "")
    down = {h: _engines_down(actions.get(h, ())) for h in engine_hosts}
    moving = [h for h in engine_hosts if down[h]]
    if not moving:
        return Downtime(False, ("no engine restarts" + router) if router else
                        "no outage: nothing running stops or restarts")
    plan = waves(engine_hosts, canary, max_unavailable)
    for i, wave in enumerate(plan, 1):
        out = {h for h in wave if down[h]}
        for role in sorted({r for h in out for r in down[h]}):
            serving = [h for h in engine_hosts if h not in out and role in roles[h]]
            if not serving:
                label = "the canary wave" if i == 1 and canary else f"wave {i}"
                return Downtime(True, (
                    f"a full outage of role {role} during {label} ({', '.join(wave)}): no other "
                    f"host runs it, so requests fail until its engines are ready (minutes)"
                    + router))
    widest = max(len([h for h in w if down[h]]) for w in plan)
    if drain_timeout_s == 0:  # no drain: what runs on a host when it leaves the router is cut
        router += ("; drain_timeout_s 0: requests still running on a host when it leaves the "
                   "router fail")
    return Downtime(False, (
        f"no outage: the rollout drains {widest} host{'s' if widest != 1 else ''} at a time "
        f"through the router ({'canary ' + str(canary) + ', then ' if canary else ''}"
        f"max_unavailable {max_unavailable}), and the other hosts keep serving every role; "
        f"capacity drops while a wave restarts (minutes)" + router))
