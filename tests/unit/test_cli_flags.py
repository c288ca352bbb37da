"""One spelling and one meaning per shared flag, across the whole command tree (issue 21).

`-p/--profile FILE` names the profile on every command that reads one (the operand too, where the
profile is the command's subject; both, differing, is a usage error); `--host NAME` is the inventory
host to act on and never probes (that is `plan --live`); `--format` and `-i/--inventory` read the
same everywhere. The tests walk `cli.commands`, so a new command is checked without being listed.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import click
import pytest

from orchestrator.cli import cli, main
from orchestrator.cli.options import HOST_HELP, INVENTORY_HELP, PROFILE_HELP
from orchestrator.cli.output import FORMAT_HELP
from orchestrator.paths import data_dir

PROFILES = data_dir("profiles")
DEFAULT = str(PROFILES / "default.yaml")
# the commands that read a profile, and among them those whose subject it is (operand allowed)
READS_PROFILE = {"validate", "plan", "render", "apply", "rollback", "history", "status", "unlock",
                 "calibrate", "qualify kernels", "probe chat"}
PROFILE_OPERAND = {"validate": "profile", "plan": "profile", "render": "profile", "apply": "source"}
ACTS_ON_HOST = {"plan", "render", "diff", "apply", "rollback", "history", "status", "unlock",
                "calibrate", "qualify kernels"}


def _commands() -> Iterator[tuple[str, click.Command]]:
    for name, cmd in cli.commands.items():
        if isinstance(cmd, click.Group):
            yield from ((f"{name} {sub}", c) for sub, c in cmd.commands.items())
        else:
            yield name, cmd


def _options(flag: str) -> dict[str, click.Option]:
    """Every command's visible option that answers to ``flag``."""
    return {name: p for name, cmd in _commands() for p in cmd.params
            if isinstance(p, click.Option) and not p.hidden and flag in p.opts + p.secondary_opts}


def test_profile_is_dash_p_with_one_help_text_on_every_command_that_reads_one() -> None:
    found = _options("--profile")
    assert set(found) == READS_PROFILE
    for name, opt in found.items():
        assert sorted(opt.opts) == ["--profile", "-p"], name
        assert opt.metavar == "FILE", name
        # probe chat checks an endpoint against a profile it may be given (no bundled default)
        assert opt.help == PROFILE_HELP or (name == "probe chat" and opt.help
                                            and opt.help.startswith("Profile file (YAML)")), name
    # no other spelling of a profile option anywhere
    for name, cmd in _commands():
        for p in cmd.params:
            if isinstance(p, click.Option) and not p.hidden:
                assert not any("profile" in o for o in p.opts if o != "--profile"), (name, p.opts)


def test_a_profile_operand_only_where_the_profile_is_the_subject() -> None:
    operands = {name: [p.name for p in cmd.params if isinstance(p, click.Argument)]
                for name, cmd in _commands()}
    for name, arg in PROFILE_OPERAND.items():
        assert arg in operands[name], name
    assert operands["diff"] == ["profiles"]  # diff compares two: OLD NEW (no -p)
    assert operands["rollback"] == ["release"]
    for name in ("history", "status", "unlock"):
        assert operands[name] == [], name


def test_host_is_one_option_with_one_meaning() -> None:
    found = _options("--host")
    assert set(found) == ACTS_ON_HOST
    for name, opt in found.items():
        assert opt.opts == ["--host"] and opt.metavar == "NAME" and opt.help == HOST_HELP, name
    # no command takes its host as a visible operand any more (`calibrate HOST` is a hidden alias)
    ctx = click.Context(cli, info_name="dsv4ctl")
    for name, cmd in _commands():
        assert "HOST" not in cmd.collect_usage_pieces(ctx), name


def test_format_and_inventory_read_the_same_everywhere() -> None:
    for name, opt in _options("--format").items():
        assert opt.opts == ["--format"] and opt.name == "fmt", name
        assert opt.help and opt.help.startswith(FORMAT_HELP), (name, opt.help)
        assert opt.default == "text" and "json" in opt.type.choices, name  # type: ignore[attr-defined]
    inv = _options("--inventory")
    assert set(inv) >= READS_PROFILE - {"probe chat"}
    for name, opt in inv.items():
        assert sorted(opt.opts) == ["--inventory", "-i"] and opt.help == INVENTORY_HELP, name


@pytest.mark.parametrize("command", ["validate", "plan", "render"])
def test_the_operand_and_dash_p_are_the_same_profile(command: str,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    assert main([command, "-p", DEFAULT]) == 0
    by_option = capsys.readouterr().out
    assert main([command, DEFAULT]) == 0
    assert capsys.readouterr().out == by_option
    assert main([command, DEFAULT, "-p", DEFAULT]) == 0  # the same file twice is no conflict
    capsys.readouterr()


@pytest.mark.parametrize("command", ["validate", "plan", "render", "apply"])
def test_two_different_profiles_are_a_usage_error(command: str,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    other = str(PROFILES / "mxfp4-tp8.yaml")
    assert main([command, DEFAULT, "--profile", other]) == 1
    err = capsys.readouterr().err
    assert "Usage: dsv4ctl " + command in err
    assert "given twice and differs" in err and other in err and DEFAULT in err


def test_plan_host_picks_the_host_and_live_probes_it(monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    import orchestrator.remote as remote
    from orchestrator.facts import declared_facts

    seen: list[str] = []

    def fake(name, host, model_paths=(), engine_env=None):  # type: ignore[no-untyped-def]
        seen.append(name)
        return declared_facts(name, host).model_copy(update={"source": "probed"})

    monkeypatch.setattr(remote, "gather_facts", fake)
    assert main(["plan", DEFAULT, "--host", "gpu-host"]) == 0
    err = capsys.readouterr().err
    assert seen == []  # --host alone: the declared facts, no SSH
    assert "--live" in err and "declared facts" in err
    assert main(["plan", DEFAULT, "--host", "gpu-host", "--live"]) == 0
    assert seen == ["gpu-host"]
    assert "note:" not in capsys.readouterr().err


def test_host_commands_default_to_the_bundled_profile_like_apply() -> None:
    from orchestrator.cli.common import resolve_host

    name, host = resolve_host(None, None, None)  # was "which host?"
    assert name == "gpu-host" and host.address == "gpu-host.internal"


def test_calibrate_host_operand_is_a_deprecated_alias(monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str],
                                                     tmp_path: Path) -> None:
    import orchestrator.apply.measure as measure
    import orchestrator.cli.calibrate_cmd as calibrate_cmd

    asked: list[str | None] = []
    monkeypatch.setattr(calibrate_cmd, "resolve_host",
                        lambda profile, inventory, host: (asked.append(host), (host, None))[1])
    monkeypatch.setattr(measure, "reset", lambda name, host: True)
    assert main(["calibrate", "--host", "gpu-host", "--reset"]) == 0
    assert main(["calibrate", "gpu-host", "--reset"]) == 0
    assert asked == ["gpu-host", "gpu-host"]
    err = capsys.readouterr().err
    # the new spelling with this run's host, not a placeholder command (HOST, a host of no one)
    assert "deprecated; use --host gpu-host" in err and "--host HOST" not in err
    assert main(["calibrate", "gpu-a", "--host", "gpu-b", "--reset"]) == 1
    err = capsys.readouterr().err
    assert "given twice and differs" in err and "gpu-a" in err and "gpu-b" in err
    assert "deprecated" not in err  # refused: no advice on a spelling that is not run
    assert asked == ["gpu-host", "gpu-host"]
