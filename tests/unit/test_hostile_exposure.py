"""Issue 31, Deliver 6: who can reach what the deployment listens on.

- ``classify_listen`` is the one owner of loopback / host address / every interface (status prints
  the same classification), compared as parsed addresses, not strings;
- an engine on every interface is an error unless acknowledged, then an acknowledged warning;
- a router on every interface follows the engine's rule (the same check and acknowledgement), and
  the router listens on loopback unless the profile says otherwise;
- any endpoint beyond loopback without an API key is a warning.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.exposure import classify_listen
from orchestrator.paths import data_dir
from orchestrator.planner.fleet import plan_from_paths

PROFILES = data_dir("profiles")


@pytest.mark.parametrize(("address", "where"), [
    ("127.0.0.1", "loopback"), ("127.3.4.5", "loopback"), ("::1", "loopback"), ("[::1]", "loopback"),
    ("localhost", "loopback"), ("::ffff:127.0.0.1", "loopback"), ("127.1", "loopback"),
    ("0.0.0.0", "all"), ("::", "all"), ("[::]", "all"), ("0", "all"), ("", "all"),
    ("::ffff:0.0.0.0", "all"), ("0:0:0:0:0:0:0:0", "all"), ("*", "all"),
    ("10.0.1.11", "host"), ("fe80::1%eth0", "host"), ("gpu-a.internal", "host"),
    ("2001:db8::1", "host"),
])
def test_a_listen_address_is_classified_as_parsed(address: str, where: str) -> None:
    assert classify_listen(address) == where


def _fleet_plan(tmp_path: Path, address: str, *, ack: bool = False, key: bool = False) -> Any:
    inv = yaml.safe_load((PROFILES / "inventory.yaml").read_text())
    inv["groups"]["fleet-3x"]["hosts"]["gpu-a"]["service_address"] = address
    (tmp_path / "inventory.yaml").write_text(yaml.safe_dump(inv))
    prof = yaml.safe_load((PROFILES / "fleet-3x.yaml").read_text())
    if ack:
        prof.setdefault("acknowledge", []).append(
            {"id": "exposure.all-interfaces", "reason": "nftables admits only the router"})
    if key:
        (tmp_path / "key").write_text("k" * 32)
        prof.setdefault("secrets", {})["DSV4_SECRET_API_KEY"] = {"file": str(tmp_path / "key")}
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(prof, sort_keys=False))
    return plan_from_paths(path, host_override="gpu-a")


@pytest.mark.parametrize("address", ["0.0.0.0", "::"])
def test_an_engine_on_every_interface_is_an_error(tmp_path: Path, address: str) -> None:
    plan = _fleet_plan(tmp_path, address)
    bad = [c for c in plan.errors if c.id == "exposure.all-interfaces"]
    assert bad, [c.id for c in plan.checks]
    assert address in bad[0].message and "every interface" in bad[0].message
    assert "acknowledge exposure.all-interfaces" in (bad[0].fix or "")


def test_an_acknowledged_all_interfaces_binding_is_an_acknowledged_warning(tmp_path: Path) -> None:
    plan = _fleet_plan(tmp_path, "0.0.0.0", ack=True)
    assert not [c for c in plan.errors if c.id.startswith(("exposure.", "profile.ack"))]
    acked = [c for c in plan.checks if c.id == "exposure.all-interfaces"]
    assert acked and acked[0].acknowledged and acked[0].severity == "warning"


def test_beyond_loopback_without_a_key_is_a_warning_and_a_key_ends_it(tmp_path: Path) -> None:
    plan = _fleet_plan(tmp_path, "10.0.1.11")
    warn = [c for c in plan.checks if c.id == "exposure.no-key"]
    assert warn and all(c.severity == "warning" for c in warn)
    assert any("10.0.1.11" in c.message for c in warn)
    keyed = _fleet_plan(tmp_path, "10.0.1.11", key=True)
    assert not [c for c in keyed.checks if c.id == "exposure.no-key"]


def test_the_default_router_listens_on_loopback_only() -> None:
    """Secure by default: the shipped default profile's router (no ``host:``) binds 127.0.0.1, so
    it raises no exposure finding; exposing it is the operator's explicit choice."""
    from orchestrator.profile.schema import Router

    assert Router().host == "127.0.0.1"
    plan = plan_from_paths(PROFILES / "default.yaml")
    assert plan.deployment.router is not None and plan.deployment.router.host == "127.0.0.1"
    assert not [c for c in plan.checks if c.id.startswith("exposure.")]


def _router_plan(tmp_path: Path, host: str, *, ack: bool = False, key: bool = False) -> Any:
    prof = yaml.safe_load((PROFILES / "default.yaml").read_text())
    prof["topology"]["router"]["host"] = host
    if ack:
        prof["acknowledge"] = [{"id": "exposure.all-interfaces",
                                "reason": "a firewall admits only the clients' network"}]
    if key:
        (tmp_path / "key").write_text("k" * 32)
        prof["secrets"] = {"DSV4_SECRET_API_KEY": {"file": str(tmp_path / "key")}}
    (tmp_path / "inventory.yaml").write_text((PROFILES / "inventory.yaml").read_text())
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(prof, sort_keys=False))
    return plan_from_paths(path)


@pytest.mark.parametrize("address", ["0.0.0.0", "::"])
def test_a_router_on_every_interface_is_an_error_naming_the_fix(
        tmp_path: Path, address: str) -> None:
    """The same rule, check and acknowledgement as an engine on every interface."""
    plan = _router_plan(tmp_path, address)
    [bad] = [c for c in plan.errors if c.id == "exposure.all-interfaces"]
    assert bad.subject == "router" and bad.field == "topology.router.host"
    assert f"{address}:8000" in bad.message and "every interface" in bad.message
    fix = bad.fix or ""
    assert "topology.router.host" in fix and "acknowledge exposure.all-interfaces" in fix
    assert "DSV4_SECRET_API_KEY" in fix


def test_an_acknowledged_router_on_every_interface_without_a_key_is_a_warning(
        tmp_path: Path) -> None:
    plan = _router_plan(tmp_path, "0.0.0.0", ack=True)
    assert not plan.errors, [c.id for c in plan.errors]
    [acked] = [c for c in plan.checks if c.id == "exposure.all-interfaces"]
    assert acked.acknowledged and acked.severity == "warning" and acked.subject == "router"
    [warn] = [c for c in plan.checks if c.id == "exposure.no-key"]
    assert warn.severity == "warning" and "0.0.0.0:8000" in warn.message
    keyed = _router_plan(tmp_path, "0.0.0.0", ack=True, key=True)
    assert not keyed.errors and not [c for c in keyed.checks if c.id == "exposure.no-key"]


def test_a_router_on_a_host_address_without_a_key_is_only_a_warning(tmp_path: Path) -> None:
    plan = _router_plan(tmp_path, "10.0.0.5")
    assert not plan.errors, [c.id for c in plan.errors]
    assert [c.subject for c in plan.checks if c.id.startswith("exposure.")] == ["router"]


def test_a_fleet_acknowledging_its_router_on_every_interface_is_not_told_the_ack_is_stale(
        tmp_path: Path) -> None:
    """The router runs on one host of the fleet, so only that host's plan has the check the
    acknowledgement matches; the engine hosts' plans must not call it stale ("remove it"), which
    would make the router's host fail."""
    from orchestrator.planner.fleet import load_fleet, plan_fleet

    prof = yaml.safe_load((PROFILES / "fleet-3x.yaml").read_text())
    prof["topology"]["router"]["host"] = "0.0.0.0"
    prof["acknowledge"] = [{"id": "exposure.all-interfaces", "reason": "a firewall in front"}]
    (tmp_path / "inventory.yaml").write_text((PROFILES / "inventory.yaml").read_text())
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(prof, sort_keys=False))
    fleet = plan_fleet(load_fleet(path, None))
    router = fleet.plan("router-1")
    [acked] = [c for c in router.checks if c.id == "exposure.all-interfaces"]
    assert acked.acknowledged and not router.errors
    for p in fleet.plans:
        assert not [c for c in p.checks if c.id == "profile.ack-unused"], p.host
    # an acknowledgement no host uses is still reported, on every host
    prof["acknowledge"].append({"id": "exposure.no-such", "reason": "typo"})
    path.write_text(yaml.safe_dump(prof, sort_keys=False))
    fleet = plan_fleet(load_fleet(path, None))
    for p in fleet.plans:
        assert [c.subject for c in p.checks if c.id == "profile.ack-unused"] == [
            "exposure.no-such"], p.host


def test_every_shipped_profile_plans_without_an_exposure_error() -> None:
    from orchestrator.planner.fleet import load_fleet, plan_fleet

    for name in ("default", "mxfp4-tp8", "fleet-3x"):
        fleet = plan_fleet(load_fleet(PROFILES / f"{name}.yaml", None))
        assert not fleet.checks or all(c.severity != "error" for c in fleet.checks)
        for p in fleet.plans:
            assert not p.errors, (name, p.host, [c.message for c in p.errors])


# ------------------------------------------- engine flags that run foreign code or send data ---

def _default_plan(tmp_path: Path, *, extra: list[str] | None = None,
                  env: dict[str, str] | None = None, ack: bool = False) -> Any:
    prof = yaml.safe_load((PROFILES / "default.yaml").read_text())
    if extra is not None:
        prof["topology"]["decode"]["extra_args"] = extra
    if env is not None:
        prof["topology"]["decode"]["env"] = env
    if ack:
        prof["acknowledge"] = [{"id": "engine.foreign-code-flag", "reason": "our collector"}]
    (tmp_path / "inventory.yaml").write_text((PROFILES / "inventory.yaml").read_text())
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(prof, sort_keys=False))
    return plan_from_paths(path)


@pytest.mark.parametrize(("extra", "kind"), [
    (["--enable-custom-logit-processor"], "runs-foreign-code"),
    (["--custom-weight-loader", "pkg.fn"], "runs-foreign-code"),
    (["--trust-request-chat-template"], "runs-foreign-code"),
    (["--dist-init-addr", "10.9.9.9:25000"], "sends-data-off-host"),
    (["--nccl-init-addr=10.9.9.9:25000"], "sends-data-off-host"),  # an alias, with =
    (["--otlp-traces-endpoint", "10.9.9.9:4317"], "sends-data-off-host"),
    (["--kv-events-config", "{}"], "sends-data-off-host"),
    (["--log-requests"], "writes-request-data"),
    (["--crash-dump-folder", "/srv/x"], "writes-request-data"),
])
def test_a_foreign_code_or_data_flag_is_an_error_with_its_source(
        tmp_path: Path, extra: list[str], kind: str) -> None:
    plan = _default_plan(tmp_path, extra=extra)
    bad = [c for c in plan.errors if c.id == "engine.foreign-code-flag"]
    assert len(bad) == 1, [c.id for c in plan.errors]
    assert kind in bad[0].message and bad[0].field == "topology.decode.extra_args.0"
    assert (bad[0].source or "").startswith("sglang==0.5.23")


def test_an_acknowledged_foreign_code_flag_is_a_warning(tmp_path: Path) -> None:
    plan = _default_plan(tmp_path, extra=["--log-requests"], ack=True)
    assert not plan.errors
    (c,) = [c for c in plan.checks if c.id == "engine.foreign-code-flag"]
    assert c.acknowledged and c.severity == "warning"


def test_every_listed_flag_exists_in_the_engines_flag_table() -> None:
    from orchestrator.catalog import load_catalog
    from orchestrator.catalog.flags import load_flag_table

    engine = next(e for e in load_catalog().engines if e.engine == "sglang")
    table = load_flag_table("sglang", engine.version)
    assert engine.foreign_code_flags
    for f in engine.foreign_code_flags:
        assert table.spec(f.flag) is not None, f.flag


@pytest.mark.parametrize("name", ["LD_PRELOAD", "LD_LIBRARY_PATH", "BASH_ENV", "PATH",
                                  "PYTHONSTARTUP", "BASH_FUNC_x%%", "NODE_OPTIONS"])
def test_loader_variables_are_refused_in_role_env(tmp_path: Path, name: str) -> None:
    from orchestrator.errors import DsvError

    try:
        plan = _default_plan(tmp_path, env={name: "/tmp/evil"})
    except DsvError as exc:  # the schema refuses some names itself (BASH_FUNC_x%%)
        assert name in exc.render()
        return
    bad = [c for c in plan.errors if c.id == "profile.env-reserved"]
    assert bad and f"topology.decode.env.{name}" == bad[0].field, [c.id for c in plan.errors]
    assert "loader variable" in bad[0].message
