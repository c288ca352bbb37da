"""Issue 19, Deliver 3 on a real host (sshd + systemd --user + the engine simulator): canary secrets
(a plain env secret and the engines' --api-key, which the router presents to them) reach the
engines and the router, and appear nowhere else on the host: not in the process list, not in the
journal, not in any file under install_root but the 0600 secrets file. Removing the secrets from
the profile removes the file from the host.
"""

from __future__ import annotations

import shlex

import pytest

from tests.integration import test_apply, test_hostile_fs
from tests.integration.test_apply import ROOT, Env

env = test_apply.env  # the clean fake-host fixture of test_apply, registered here under its name
victim = test_hostile_fs.victim  # env plus a root-owned /srv/victim a link could point at

HF = "hf_CANARY_2b7e151628aed2a6_host"
API = "sk-CANARY-3c6e0b8a9c15224a_api"


def test_canary_secrets_reach_the_engine_and_nothing_else(
        env: Env, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("ITEST_HF", HF)
    monkeypatch.setenv("ITEST_API", API)
    profile = env.profile(secrets={"HF_TOKEN": {"env": "ITEST_HF"},
                                   "DSV4_SECRET_API_KEY": {"env": "ITEST_API"}})
    assert env.apply(profile) == 0
    assert env.serves(api_key=API)
    # sglang-router 0.3.2's --api-key (the engines' key, rendered for it) guards the router's own
    # generation and worker routes as well: a client without it is refused there
    assert env.generate_status() == 401
    secret_file = f"{ROOT}/secrets/itest.env"
    assert env.fake.exec(f"stat -c %a {secret_file}").stdout.strip() == "600"
    # delivered: the engines and the router parsed the flags (the simulator records its argv)
    runs = env.fake.sim_runs()
    engine_argv = [r["argv"] for r in runs if r.get("mode") in ("prefill", "decode")]
    assert engine_argv and all(a[-2:] == ["--api-key", API] for a in engine_argv)
    # the engines now demand the key (as SGLang does): health passed because apply sent it
    port = next(r["port"] for r in runs if r.get("mode") == "decode")
    unauth = env.fake.exec(f"curl -s -o /dev/null -w '%{{http_code}}' "
                           f"http://127.0.0.1:{port}/v1/models")
    assert unauth.stdout.strip() == "401"
    # status reads the key from the host's secrets file for its own requests: healthy, no drift
    capsys.readouterr()
    rc = env.cli("status", "--host", "h")
    shown = capsys.readouterr()
    assert rc == 0, shown.out + shown.err
    assert API not in shown.out + shown.err
    # the engine logs its server_args at startup, as SGLang 0.5.23 does: the key shows redacted
    log = env.fake.read(f"{ROOT}/logs/decode.log")
    assert "server_args=" in log and "'api_key': '<redacted>'" in log
    router_argv = [r["argv"] for r in runs if r.get("mode") == "router"]
    assert router_argv and router_argv[-1][-2:] == ["--api-key", API]  # the engines' key
    for canary in (HF, API):
        q = shlex.quote(canary)
        # the process list: every process's command line on the host
        ps = env.fake.exec("ps -eo pid,args ww")
        assert ps.returncode == 0 and "sglang.cli.main" in ps.stdout
        assert canary not in ps.stdout, "a secret is in the host's process list"
        cmdlines = env.fake.exec("for f in /proc/[0-9]*/cmdline; do tr '\\0' ' ' < $f; echo; "
                                 "done 2>/dev/null")
        assert "sglang.cli.main" in cmdlines.stdout and canary not in cmdlines.stdout
        # the journal: the harness hosts run no journald (journalctl answers nothing and the
        # manager's own log stays empty); the units' stdout/stderr, which a production host's
        # journal would hold, go to install_root/logs/, grepped below with every other file
        journal = env.fake.exec("journalctl --no-pager -q -o cat 2>/dev/null; "
                                "journalctl --user --no-pager -q -o cat 2>/dev/null; true")
        assert canary not in journal.stdout
        manager_logs = [env.fake.log_dir / "systemd.log", env.fake.log_dir / "sshd.log"]
        for log in manager_logs:
            assert canary not in log.read_text(errors="replace"), f"secret in {log}"
        # every file under install_root except the secrets files themselves (the active one and
        # the release's own, secrets/itest.<release>.env) and the simulator's own
        # run log: under the sandbox the simulator keeps it in logs/ (tests/sim/control.py
        # state_dir), and it records the argv the engine process received, the proof above that
        # the key reached the engine; a real engine writes no such file
        sim_log = f"{ROOT}/logs/sim-runs.jsonl"
        own = f"{ROOT}/secrets/itest.{env.current()}.env"
        leaks = env.fake.exec(f"grep -rlF -- {q} {ROOT} 2>/dev/null "
                              f"| grep -vxF -e {secret_file} -e {own} -e {sim_log}")
        assert leaks.stdout == "", f"secret in {leaks.stdout}"
        assert canary in env.fake.read(secret_file)
    # removed from the profile: removed from the host
    assert env.apply(env.profile(), name="nosecrets.json") == 0
    assert env.fake.exec(f"test -e {secret_file}").returncode != 0


def test_planted_secret_file_link_is_refused(victim: Env) -> None:
    """A link planted at a release's secrets/<name>.<id>.env itself (the directory being real):
    the secret is not written through it, and what it points to is left as it was."""
    from orchestrator.errors import DsvError
    from tests.integration.test_hostile_fs import RID, VICTIM, _store, untouched

    victim.fake.exec(f"mkdir -p -m 0700 {ROOT}/secrets && "
                     f"ln -s {VICTIM}/file {ROOT}/secrets/itest.{RID}.env", check=True)
    remote, store = _store(victim)
    with remote, pytest.raises(DsvError) as exc:
        store.write_secrets("itest", RID, {"HF_TOKEN": HF})
    assert "symbolic link" in exc.value.message
    untouched(victim)
