"""Issue 19, Deliver 3 (offline half): secrets end to end.

- secret engine flags (marked ``"secret": true`` in the flag snapshots) are refused in extra_args,
  in every spelling argparse accepts, with the value redacted from the error;
- they are taken from ``secrets:`` instead: the launch script and the unit name the variable, never
  the value, and the shim that appends them runs the entry point with the value in ``sys.argv``
  while ``/proc/<pid>/cmdline`` (the process list) holds only the name;
- secret names that shadow rendered or loader variables are refused;
- secret files under /proc, /dev, /sys (directly or through a link), and non-regular files, are
  refused;
- a secret removed from the profile is removed from the host.
The host half (process list, journal, install_root grep) is tests/integration/test_hostile_secrets_host.py.
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.catalog.flags import load_flag_table
from orchestrator.cli import main
from orchestrator.errors import DsvError, InputError, RenderError
from orchestrator.profile.loader import load_text
from orchestrator.profile.schema import Profile
from orchestrator.render import render_release
from orchestrator.render.secrets import SHIM, secret_env_name
from tests.validate.helpers import INVENTORY, PROFILES, resolve_profile

CANARY = "sk-CANARY-7f3a9c1e5b_never_written"
BASE = yaml.safe_load((PROFILES / "default.yaml").read_text())


def _profile(**over: Any) -> Profile:
    data = copy.deepcopy(BASE)
    for path, value in over.items():
        *parents, last = path.split("__")
        node = data
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = value
    return load_text(Profile, yaml.safe_dump(data), "profile.yaml")


def _render(profile: Profile) -> Any:
    return render_release(profile, resolve_profile(profile))


# ------------------------------------------------------------------ flags in extra_args ---

def test_snapshots_mark_the_secret_flags() -> None:
    sg = {o.name for o in load_flag_table("sglang", "0.5.23").secret_options()}
    rt = {o.name for o in load_flag_table("sglang-router", "0.3.2").secret_options()}
    assert {"--api-key", "--admin-api-key", "--ssl-keyfile-password"} <= sg
    assert {"--api-key"} <= rt


@pytest.mark.parametrize("words", [
    ["--api-key", CANARY],
    [f"--api-key={CANARY}"],
    ["--admin-api-key", CANARY],
    ["--ssl-keyfile-password", CANARY],
    ["--api-k", CANARY],  # an abbreviation the upstream parser (allow_abbrev) would accept
    ["--enable-metrics-for-all-schedulers", f"--admin-api-key={CANARY}"],
])
def test_secret_flag_in_extra_args_is_refused_and_redacted(words: list[str]) -> None:
    profile = _profile(topology__decode__extra_args=words)
    with pytest.raises(RenderError) as info:
        _render(profile)
    text = info.value.render()
    assert CANARY not in text
    assert "topology.decode.extra_args[" in text and "secret" in text
    assert "DSV4_SECRET_" in (info.value.fix or "") and "secrets:" in (info.value.fix or "")


def test_plan_and_render_refuse_it_without_printing_it(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    data = copy.deepcopy(BASE)
    data["topology"]["prefill"]["extra_args"] = ["--api-key", CANARY]
    prof = tmp_path / "p.yaml"
    prof.write_text(yaml.safe_dump(data))
    (tmp_path / "inventory.yaml").write_text(INVENTORY.read_text())
    for argv in (["plan", str(prof)], ["render", str(prof), "--stdout"],
                 ["plan", str(prof), "-o", str(tmp_path / "plan.json")]):
        assert main(argv) == 1
        out = capsys.readouterr()
        assert CANARY not in out.out + out.err and "<redacted>" in out.err
    assert not (tmp_path / "plan.json").exists()


# ------------------------------------------------------------------ flags from secrets: ---

def test_secret_flags_come_from_the_secrets_file() -> None:
    name = secret_env_name("sglang", load_flag_table("sglang", "0.5.23").spec("--api-key"))
    assert name == "DSV4_SECRET_API_KEY"
    files = _render(_profile(secrets={"DSV4_SECRET_API_KEY": {"env": "X_KEY"}})).files
    launch = files["bin/launch-decode.sh"].content
    assert "--api-key DSV4_SECRET_API_KEY" in launch and "sglang.cli.main main 1" in launch
    # a router key alone guards the router; the engines run without one
    own = _render(_profile(secrets={"DSV4_SECRET_ROUTER_API_KEY": {"env": "X_KEY"}})).files
    assert "--api-key DSV4_SECRET_ROUTER_API_KEY" in own["bin/launch-router.sh"].content
    assert "--api-key" not in own["bin/launch-decode.sh"].content
    # both: the router would hand its key to engines that hold another (sglang-router 0.3.2)
    with pytest.raises(RenderError) as exc:
        _render(_profile(secrets={"DSV4_SECRET_API_KEY": {"env": "X_KEY"},
                                  "DSV4_SECRET_ROUTER_API_KEY": {"env": "X_KEY"}}))
    assert exc.value.message.startswith("secrets.DSV4_SECRET_ROUTER_API_KEY: set together with")
    assert "drop DSV4_SECRET_ROUTER_API_KEY" in (exc.value.fix or "")
    assert "EnvironmentFile=-/srv/dsv4/secrets/default.env" in \
        files["units/dsv4-default-router.service"].content.splitlines()
    # without a router key of its own, the router presents the engines' key to them
    only = _render(_profile(secrets={"DSV4_SECRET_API_KEY": {"env": "X_KEY"}})).files
    assert "--api-key DSV4_SECRET_API_KEY" in only["bin/launch-router.sh"].content
    # without the secret, nothing changes: the plain console script
    plain = _render(_profile()).files["bin/launch-decode.sh"].content
    assert "/bin/sglang' serve" in plain or "/bin/sglang serve" in plain


def test_the_shim_passes_the_value_in_process_only(tmp_path: Path) -> None:
    """Run the exact SHIM: the entry point sees ``--api-key VALUE``; the process's own
    /proc/self/cmdline (what `ps` shows) holds only the variable's name."""
    (tmp_path / "fakeentry.py").write_text(
        "import json, logging, sys\n"
        "def main():\n"
        "    cmdline = open('/proc/self/cmdline', 'rb').read().decode()\n"
        "    print(json.dumps({'argv': sys.argv, 'cmdline': cmdline}))\n"
        "    logging.basicConfig()\n"
        "    logging.getLogger('sglang').warning(f'server_args={sys.argv}')\n"
        "    return 0\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "DSV4_SECRET_API_KEY": CANARY}
    res = subprocess.run([sys.executable, "-c", SHIM, "fakeentry", "main", "1", "--api-key",
                          "DSV4_SECRET_API_KEY", "serve", "--port", "1"], env=env, check=True,
                         capture_output=True, text=True)
    import json

    got = json.loads(res.stdout)
    # what the process logs (SGLang logs its server_args, api_key included) shows it redacted
    assert "server_args=" in res.stderr and "<redacted>" in res.stderr
    assert CANARY not in res.stderr
    assert got["argv"] == ["fakeentry", "serve", "--port", "1", "--api-key", CANARY]
    assert CANARY not in got["cmdline"] and "DSV4_SECRET_API_KEY" in got["cmdline"]


def test_unknown_secret_flag_name_is_refused() -> None:
    with pytest.raises(RenderError, match="DSV4_SECRET_API_KY"):
        _render(_profile(secrets={"DSV4_SECRET_API_KY": {"env": "X"}}))


# ------------------------------------------------------------------ shadowing names ---

@pytest.mark.parametrize("name", ["CUDA_VISIBLE_DEVICES", "DSV4_KERNELS_SGLANG",
                                  "SGLANG_SM120_FLASHMLA_BACKEND", "PATH", "LD_PRELOAD",
                                  "PYTHONPATH", "MY_ROLE_VAR"])
def test_secret_that_shadows_a_rendered_variable_is_refused(name: str) -> None:
    data_env = {"MY_ROLE_VAR": "1"}
    profile = _profile(topology__decode__env=data_env, secrets={name: {"env": "X"}})
    with pytest.raises(RenderError) as info:
        _render(profile)
    assert f"secrets.{name}" in info.value.message and "override" in info.value.message


# ------------------------------------------------------------------ secret sources ---

@pytest.mark.parametrize("path", ["/proc/self/environ", "/dev/stdin", "/sys/kernel/x",
                                  "//proc/1/environ", "/dev"])
def test_secret_file_under_pseudo_filesystems_is_refused(path: str) -> None:
    with pytest.raises(InputError) as info:
        _profile(secrets={"HF_TOKEN": {"file": path}})
    assert "secrets.HF_TOKEN" in info.value.render() and "not a secret store" in info.value.render()


def test_link_to_proc_is_refused_at_apply_time(tmp_path: Path) -> None:
    from orchestrator.apply.context import resolve_secrets

    link = tmp_path / "token"
    link.symlink_to("/proc/self/environ")
    with pytest.raises(DsvError, match=r"resolves to /proc/\d+/environ, under /proc"):
        resolve_secrets(_profile(secrets={"HF_TOKEN": {"file": str(link)}}))
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(DsvError, match="not a regular file"):
        resolve_secrets(_profile(secrets={"HF_TOKEN": {"file": str(fifo)}}))
    ok = tmp_path / "ok"
    ok.write_text(CANARY + "\n")
    assert resolve_secrets(_profile(secrets={"HF_TOKEN": {"file": str(ok)}})) == {
        "HF_TOKEN": CANARY}


# ------------------------------------------------------------------ removal ---

RID1, RID2 = "r0001-20261201T000000Z-00000001", "r0002-20261201T000000Z-00000002"


def _releases(tmp_path: Path) -> Any:
    from orchestrator.release.store import ReleaseStore
    from tests.unit.test_release import LocalShell

    for rid in (RID1, RID2):
        (tmp_path / "releases" / rid).mkdir(parents=True)
        (tmp_path / "releases" / rid / "manifest.json").write_text("{}")
    return ReleaseStore(LocalShell(), str(tmp_path))  # type: ignore[arg-type]


def test_secret_removed_from_the_profile_is_removed_from_the_host(tmp_path: Path) -> None:
    """At the switch to a release without secrets (never before it: issue 20); a link planted
    at the units' file is removed, its target kept."""
    store = _releases(tmp_path)
    store.write_secrets("dep", RID1, {"HF_TOKEN": CANARY})
    store.switch(RID1, secrets=("dep", True))
    secret = tmp_path / "secrets" / "dep.env"
    assert secret.read_text() == f'HF_TOKEN="{CANARY}"\n'
    target = tmp_path / "elsewhere"
    target.write_text("keep")
    assert store.switch(RID2, secrets=("dep", False)) == "none"
    assert not secret.exists()
    secret.symlink_to(target)  # a planted link: removed, its target kept
    store.switch(RID2, secrets=("dep", False))
    assert not secret.is_symlink() and target.read_text() == "keep"


def test_status_reads_a_secret_back(tmp_path: Path) -> None:
    store = _releases(tmp_path)
    odd = 'k"e\\y$`x'
    store.write_secrets("dep", RID1, {"DSV4_SECRET_API_KEY": odd, "HF_TOKEN": CANARY})
    assert store.read_secret("dep", "DSV4_SECRET_API_KEY") is None  # not switched to yet
    store.switch(RID1, secrets=("dep", True))
    assert store.read_secret("dep", "DSV4_SECRET_API_KEY") == odd
    assert store.read_secret("dep", "NOPE") is None
    assert store.read_secret("other", "HF_TOKEN") is None


def test_upload_writes_the_release_secrets_only() -> None:
    """Upload writes the release's own secrets file and never the one the units read (the switch
    owns that): with no secrets it touches no secrets file at all."""
    from orchestrator.apply import steps

    calls: list[str] = []

    class Store:
        def upload(self, *a: Any) -> None: ...
        def mkdirs(self, *a: Any, **k: Any) -> None: ...
        def write_secrets(self, name: str, rid: str, values: Any) -> None:
            calls.append(f"write {name} {rid}")
        def remove_secrets(self, name: str) -> None: calls.append(f"remove {name}")

    class Remote:
        def check(self, *a: Any, **k: Any) -> str: return ""

    ctx: Any = type("Ctx", (), {})()
    ctx.target, ctx.tree, ctx.manifest_sha, ctx.secrets = "r1", {}, {}, {}
    ctx.store, ctx.remote = Store(), Remote()
    ctx.host = type("H", (), {"install_root": "/srv/dsv4"})()
    ctx.deployment = type("D", (), {"name": "dep"})()
    steps.upload_release(ctx, None)
    assert calls == []
    ctx.secrets = {"HF_TOKEN": CANARY}
    steps.upload_release(ctx, None)
    assert calls == ["write dep r1"]


def test_qualification_sends_the_engine_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """Colocated, qualification talks to the engine itself, which wants the key (401 otherwise)."""
    from orchestrator.probes import qualify

    seen: dict[str, Any] = {}

    class Stop(Exception):
        pass

    def fake_endpoint(url: str, **kw: Any) -> Any:
        seen.update(kw)
        raise Stop

    monkeypatch.setattr(qualify, "Endpoint", fake_endpoint)
    with pytest.raises(Stop):
        qualify.run_qualification("http://127.0.0.1:1", None, None,  # type: ignore[arg-type]
                                  api_key=CANARY)
    assert seen["api_key"] == CANARY


def test_status_drift_never_shows_a_secret_flag() -> None:
    from orchestrator.apply.status import _server_info_drift
    from orchestrator.render.argv import engine_argv

    profile = _profile(secrets={"DSV4_SECRET_API_KEY": {"env": "X"}})
    dep = resolve_profile(profile)
    role = dep.roles[0]
    argv = engine_argv(dep, role)
    import shlex

    same = {"launch_command": shlex.join(["sglang", "serve", *argv, "--api-key", CANARY])}
    assert _server_info_drift(role, dep, same) == []
    other = {"launch_command": shlex.join(["sglang", "serve", *argv, "--x", f"--api-key={CANARY}"])}
    (msg,) = _server_info_drift(role, dep, other)
    assert "--x" in msg and CANARY not in msg


def test_plan_reads_a_shimmed_engine_command_line_like_the_release() -> None:
    """The process of an engine with a key runs the secrets shim (``python -c SHIM ... --api-key
    NAME serve ...``): its /proc cmdline from the first flag, as the drift probe keeps it, is the
    release's command line, and one that differs is named without the secret flag."""
    from orchestrator.planner.transition import running_drift
    from orchestrator.render import ENGINE_ENTRY
    from orchestrator.render.argv import engine_argv
    from orchestrator.render.secrets import secret_args, shim_program

    profile = _profile(secrets={"DSV4_SECRET_API_KEY": {"env": "X"}})
    dep = resolve_profile(profile)
    role = dep.roles[0]
    words = [*shim_program("/opt/e/bin/python", ENGINE_ENTRY, secret_args(dep, "sglang")),
             "serve", *engine_argv(dep, role)]
    probed = words[next(i for i, w in enumerate(words) if w.startswith("--")):]
    assert probed[:2] == ["--api-key", "DSV4_SECRET_API_KEY"]  # the shim's pair comes first
    assert running_drift(dep, {role.unit: probed}) == {}
    (how,) = running_drift(dep, {role.unit: [*probed, "--x"]}).values()
    assert "--x" in how and "api-key" not in how and "DSV4_SECRET" not in how
