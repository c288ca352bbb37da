"""The remote layer: the only package that talks to hosts (fabric / paramiko live here and nowhere
else).

- :mod:`.probes`: facts as command + pure parser (no network; importable on the ``plan`` path).
- :mod:`.connection`: SSH connections with timeouts, retries and jump hosts; HTTP tunnelled over
  SSH.
- :mod:`.lock`: the kernel-held host lock.
- :mod:`.systemd`: unit files and ``systemctl`` at system or user scope.

``import orchestrator.remote`` does not import fabric: :func:`gather_facts` imports it when called,
so ``dsv4ctl plan`` without ``--host`` stays light.
"""

from __future__ import annotations

from collections.abc import Iterable

from orchestrator.facts import Facts
from orchestrator.profile.inventory import Host

__all__ = ["gather_facts"]


def gather_facts(host_name: str, host: Host, *, model_paths: Iterable[str] = (),
                 engine_env: str | None = None) -> Facts:
    """Probe inventory host ``host_name`` over SSH and return its :class:`Facts`.

    ``model_paths``: checkpoint directories to measure besides the inventory's declared ones (pass
    the profile's ``model.path``). A saved plan's stale check re-probes with the plan's model path,
    so the planner should pass exactly ``[profile.model.path]`` for the fingerprints to be
    comparable. ``engine_env``: the profile's ``engine.env``, whose owner and mode are checked
    (the plan shows the result).
    """
    from orchestrator.remote.connection import connect
    from orchestrator.remote.probes import collect_facts

    with connect(host_name, host) as remote:
        return collect_facts(remote, host_name, host, model_paths=model_paths,
                             engine_env=engine_env)
