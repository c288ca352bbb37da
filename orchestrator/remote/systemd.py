"""The host's service manager: systemd at system scope, or ``systemctl --user`` where the inventory
says.

Owns the commands that install unit files, reload, start, stop and inspect units, for either scope,
so the apply steps never spell ``systemctl`` themselves. Unit files are written atomically (temp
file + rename in the same directory) so systemd never reads a half-written unit.

Every unit name is checked against :data:`UNIT_NAME` before it reaches a shell, and quoted there
as well: names come from saved plans and from release records on the host, and a plan naming
``dsv4-x$(touch …).service`` once ran that command (issue 19).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from orchestrator.errors import RemoteError
from orchestrator.remote.connection import RemoteHost
from orchestrator.remote.probes import parse_show, systemctl, unit_dir_expr

# What dsv4ctl names its units (dsv4-<deployment>-<role>.service, from Slug names): letters, digits,
# '-', '_', '.', '@' (a subset of systemd's unit-name alphabet, without '\\' and ':').
UNIT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,240}\.service$")


def check_unit_names(units: Sequence[str]) -> list[str]:
    """``units`` as a list, or RemoteError naming the first one that is not a plain unit name."""
    for u in units:
        if not isinstance(u, str) or not UNIT_NAME.fullmatch(u):
            raise RemoteError(f"refusing unit name {u!r}: not of the form NAME.service with "
                              "letters, digits, '-', '_', '.', '@' only",
                              fix="re-plan from the profile (`dsv4ctl plan -o`); a saved plan or "
                                  "release record with such a name was edited")
    return list(units)


SHOW_PROPS = ("Id", "ActiveState", "SubState", "MainPID", "NRestarts", "Result", "LoadState")


@dataclass(frozen=True)
class UnitState:
    name: str
    active: str  # ActiveState: active, activating, failed, inactive, deactivating
    sub: str
    main_pid: int
    restarts: int
    result: str
    loaded: str

    @property
    def running(self) -> bool:
        return self.active == "active" and self.sub == "running"


class ServiceManager:
    def __init__(self, remote: RemoteHost, scope: str) -> None:
        self.remote = remote
        self.scope = scope
        self.ctl = systemctl(scope)

    def _units(self, units: Sequence[str]) -> str:
        return " ".join(shlex.quote(u) for u in check_unit_names(units))

    def install_units(self, source_dir: str, units: Sequence[str]) -> None:
        """Copy ``units`` from ``source_dir`` (a release's ``units/``) into the unit directory."""
        if not units:
            return
        d = unit_dir_expr(self.scope)
        cmds = [f"d={d}", 'mkdir -p "$d"']
        for u in check_unit_names(units):
            src = shlex.quote(f"{source_dir}/{u}")
            tmp, dst = shlex.quote(f".{u}.tmp"), shlex.quote(u)
            cmds.append(f'cp -f {src} "$d"/{tmp} && mv -f "$d"/{tmp} "$d"/{dst}')
        self.remote.check(" && ".join(cmds), timeout=60, what="installing unit files")

    def remove_units(self, units: Sequence[str]) -> None:
        if not units:
            return
        d = unit_dir_expr(self.scope)
        files = " ".join(f'"$d"/{shlex.quote(u)}' for u in check_unit_names(units))
        self.remote.check(f"d={d}; rm -f {files}", timeout=60, what="removing unit files")

    def daemon_reload(self) -> None:
        self.remote.check(f"{self.ctl} daemon-reload", timeout=120, what="systemctl daemon-reload")

    def start(self, units: Sequence[str]) -> None:
        if units:
            # --no-block: the units are Type=simple/exec; readiness is judged by the health checks
            self.remote.check(f"{self.ctl} start --no-block {self._units(units)}", timeout=120,
                              what=f"starting {', '.join(units)}")

    def restart(self, units: Sequence[str]) -> None:
        if units:
            self.remote.check(f"{self.ctl} restart --no-block {self._units(units)}", timeout=120,
                              what=f"restarting {', '.join(units)}")

    def stop(self, units: Sequence[str], timeout: float = 300) -> list[str]:
        """Stop the units systemd knows (a unit never installed needs no stopping); returns them."""
        states = self.show(units)
        units = [u for u in units if u in states and states[u].loaded == "loaded"]
        if units:
            self.remote.check(f"{self.ctl} stop {self._units(units)}", timeout=timeout,
                              what=f"stopping {', '.join(units)}")
        return list(units)

    def reset_failed(self, units: Sequence[str]) -> None:
        if units:
            self.remote.run(f"{self.ctl} reset-failed {self._units(units)}", timeout=60)

    def show_command(self, units: Sequence[str]) -> str:
        props = " ".join(f"-p {p}" for p in SHOW_PROPS)
        return f"{self.ctl} show {props} {self._units(units)}"

    def show(self, units: Sequence[str]) -> dict[str, UnitState]:
        if not units:
            return {}
        res = self.remote.run(self.show_command(units), timeout=60)
        if not res.ok:
            raise RemoteError(f"systemctl show failed on host '{self.remote.name}': "
                              f"{(res.stderr or res.stdout).strip()[:300]}")
        out = {}
        for name, b in parse_show(res.stdout).items():
            out[name] = UnitState(
                name=name, active=b.get("ActiveState", "unknown"), sub=b.get("SubState", ""),
                main_pid=int(b.get("MainPID") or 0),
                restarts=int(b.get("NRestarts") or 0) if (b.get("NRestarts") or "0").isdigit()
                else 0,
                result=b.get("Result", ""), loaded=b.get("LoadState", ""),
            )
        return out
