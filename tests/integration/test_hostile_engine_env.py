"""A hostile neighbour on a harness host: the engine environment is writable by others
(issue 31, Deliver 2; the offline half is tests/unit/test_hostile_engine_env_check.py).

Before: with the env's ``bin/`` at mode 0777 a local user replaced ``bin/python``; ``plan --live``
said nothing (install_root with the same mode is refused) and apply ran the replacement over SSH as
the deploying user. Now plan shows the check's result, and apply refuses before anything runs
from the env: nothing started, nothing switched, the replacement never ran.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from tests.integration.test_apply import ROOT, Env, env  # noqa: F401  (env is a fixture)

pytestmark = pytest.mark.integration

ENV = "/opt/sglang-env"
MARK = "/srv/dsv4-replaced-python-ran"


@pytest.fixture
def hostile(env: Env) -> Iterator[Env]:  # noqa: F811
    """bin/ at 0777 and bin/python replaced by a script that leaves a mark, then runs the real
    interpreter; both put back after the test (the env is the session's)."""
    real = env.fake.exec(f"readlink {ENV}/bin/python").stdout.strip()
    assert real, "the harness env's bin/python is not a link"
    env.fake.exec(f"rm -f {MARK}", root=True)
    yield env
    env.fake.exec(f"chmod 0755 {ENV}/bin && rm -f {ENV}/bin/python && "
                  f"ln -s {real} {ENV}/bin/python && rm -f {MARK}", check=True, root=True)


def _make_hostile(e: Env) -> None:
    real = e.fake.exec(f"readlink {ENV}/bin/python").stdout.strip()
    e.fake.exec(f"chmod 0777 {ENV}/bin && rm -f {ENV}/bin/python && "
                f"printf '#!/bin/sh\\ntouch {MARK}\\nexec {real} \"$@\"\\n' > {ENV}/bin/python && "
                f"chmod 0755 {ENV}/bin/python", check=True, root=True)


def _plan_json(e: Env, capsys: pytest.CaptureFixture[str]) -> dict:
    path = e.profile_file(e.profile())
    capsys.readouterr()
    e.cli("plan", str(path), "--live", "--format", "json")
    return json.loads(capsys.readouterr().out)


def test_plan_live_shows_the_engine_env_check(hostile: Env,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    ok = {c["id"]: c for c in _plan_json(hostile, capsys)["checks"]}
    assert "host.engine-env-trusted" in ok and ENV in ok["host.engine-env-trusted"]["message"]
    _make_hostile(hostile)
    bad = {c["id"]: c for c in _plan_json(hostile, capsys)["checks"]}
    c = bad["host.engine-env-untrusted"]
    assert c["severity"] == "error"
    assert f"{ENV}/bin: it is writable by group or others (mode 777)" in c["message"]
    assert hostile.fake.exec(f"test -e {MARK}").returncode != 0


def test_apply_refuses_to_run_anything_from_an_env_others_can_write(
        hostile: Env, capsys: pytest.CaptureFixture[str]) -> None:
    # reviewed while the env was sound, then the neighbour strikes before apply
    saved = hostile.save(hostile.plan(hostile.profile(kernels={"enabled": True})))
    _make_hostile(hostile)
    capsys.readouterr()
    rc = hostile.cli("apply", str(saved))
    err = " ".join(capsys.readouterr().err.split())  # the message is folded to the width
    assert rc != 0
    assert f"dsv4ctl runs nothing from the engine environment {ENV}" in err, err
    assert "writable by group or others (mode 777)" in err
    assert hostile.fake.exec(f"test -e {MARK}").returncode != 0, "the replaced python ran"
    assert hostile.current() is None and hostile.starts("prefill") == 0
