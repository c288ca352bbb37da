"""The suite's check of printed commands (tests/printed_commands.py) catches what it is for: a
command that drops the run's -i or -p, names another host or profile, or does not parse; and
passes a command that is runnable as printed on the run's deployment. Its hook into the CLI sees
what a real run prints (the issue-32 symptom: fix lines without -p/-i)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from orchestrator.cli import main
from tests.printed_commands import COLLECTOR, check, commands_in
from tests.validate.helpers import INVENTORY, PROFILES


@pytest.fixture
def files(tmp_path: Path) -> tuple[str, str, str]:
    """(a one-host profile, a fleet profile, an inventory) of the test's own."""
    inv = tmp_path / "hosts.yaml"
    shutil.copy(INVENTORY, inv)
    one = tmp_path / "mine.yaml"
    shutil.copy(PROFILES / "mxfp4-tp8.yaml", one)
    fleet = tmp_path / "fleet.yaml"
    shutil.copy(PROFILES / "fleet-3x.yaml", fleet)
    return str(one), str(fleet), str(inv)


def _reasons(command: str, argv: list[str]) -> list[str]:
    return [v.reason for v in check(command, argv)]


def test_a_command_without_the_runs_inventory_fails(files: tuple[str, str, str]) -> None:
    one, _, inv = files
    run = ["apply", one, "-i", inv, "--host", "gpu-host", "--yes"]
    [reason] = _reasons(f"dsv4ctl plan -p {one} --host gpu-host --live", run)
    assert "no inventory" in reason and inv in reason
    # and without the run's profile: the bundled default profile's deployment
    [reason] = _reasons(f"dsv4ctl history -i {inv} --host gpu-host", run)
    assert "no profile" in reason and "bundled default" in reason


def test_the_same_command_with_the_runs_target_passes(files: tuple[str, str, str]) -> None:
    one, fleet, inv = files
    run = ["apply", one, "-i", inv, "--host", "gpu-host", "--yes"]
    assert _reasons(f"dsv4ctl plan -p {one} -i {inv} --host gpu-host --live -o PLAN.json",
                    run) == []
    assert _reasons(f"dsv4ctl rollback r0001 -p {one} -i {inv} --host gpu-host --yes", run) == []
    # a fleet's run: a command about one of its members acts on the same deployment
    frun = ["apply", "-p", fleet, "-i", inv, "--yes"]
    assert _reasons(f"dsv4ctl history -p {fleet} -i {inv} --host gpu-b", frun) == []


def test_another_profile_host_or_a_typo_fails(files: tuple[str, str, str], tmp_path: Path
                                               ) -> None:
    one, fleet, inv = files
    run = ["status", "-p", one, "-i", inv, "--host", "gpu-host"]
    [reason] = _reasons(f"dsv4ctl status -p {fleet} -i {inv} --host gpu-host", run)
    assert "names profile" in reason
    [reason] = _reasons(f"dsv4ctl status -p {one} -i {inv} --host HOST", run)
    assert "--host HOST" in reason
    [reason] = _reasons(f"dsv4ctl status -p {one} -i {inv} --host gpu-host --no-such", run)
    assert "does not parse" in reason
    # an operand beside -p (a placeholder left in: `apply ... --yes`) is a usage error when run
    [reason] = _reasons(f"dsv4ctl apply -p {one} -i {inv} --host gpu-host ... --yes", run)
    assert "names the profile twice" in reason
    # a member the fleet does not have: resolving its targets refuses it
    frun = ["apply", "-p", fleet, "-i", inv, "--yes"]
    [reason] = _reasons(f"dsv4ctl apply -p {fleet} -i {inv} --host gpu-host --yes", frun)
    assert "names no deployment" in reason and "not a host of fleet" in reason
    # the same profile under another name is the same deployment only if it is that file
    other = tmp_path / "copy.yaml"
    shutil.copy(one, other)
    [reason] = _reasons(f"dsv4ctl plan {other} -i {inv} --host gpu-host", run)
    assert "names profile" in reason


def test_a_profile_placeholder_stands_only_for_what_the_run_did_not_name(
        files: tuple[str, str, str]) -> None:
    one, _, inv = files
    alone = ["status", "-i", inv, "--host", "gpu-host"]
    assert _reasons(f"dsv4ctl plan -p PROFILE -i {inv} --host gpu-host --live", alone) == []
    [reason] = _reasons(f"dsv4ctl plan -i {inv} --host gpu-host --live", alone)
    assert "bundled default profile" in reason  # another deployment on the host
    [reason] = _reasons(f"dsv4ctl plan -p PROFILE -i {inv} --host gpu-host",
                        ["status", "-p", one, "-i", inv, "--host", "gpu-host"])
    assert "names profile PROFILE" in reason


def test_quotations_synopses_and_prose_are_not_commands() -> None:
    text = ('host \'box\' is locked by another dsv4ctl run: ops@vm pid 7, running: '
            '"dsv4ctl apply other-plan.json"; fix: `dsv4ctl unlock --force --host box`\n'
            "Usage: dsv4ctl plan [OPTIONS] [PROFILE]\n"
            "Try 'dsv4ctl plan --help' for help.\n"
            "dsv4ctl plan: default (host box)\n"
            "role env sets a variable dsv4ctl owns; dsv4ctl sets CUDA_VISIBLE_DEVICES itself\n"
            "  dsv4ctl plan x.yaml      prove it fits\n"
            "re-plan: dsv4ctl plan --host box --live -o PLAN.json (never edit a saved plan)\n")
    assert list(commands_in(text)) == [
        "dsv4ctl unlock --force --host box", "dsv4ctl plan --help", "dsv4ctl plan x.yaml",
        "dsv4ctl plan --host box --live -o PLAN.json"]


def test_the_hook_sees_a_runs_fix_line_without_its_target(
        files: tuple[str, str, str], monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A run of the real CLI whose printed commands are not completed (the issue-32 symptom,
    simulated by turning the completion off) is caught; with the completion it passes."""
    one, _, inv = files
    bad = Path(one).with_name("bad.yaml")
    bad.write_text(Path(one).read_text().replace("    ep: 8\n", "    ep: 4\n"))
    argv = ["validate", str(bad), "-i", inv]
    COLLECTOR.take()
    assert main(argv) == 1  # prints "`dsv4ctl plan` would refuse it too"
    assert "dsv4ctl plan -p" in capsys.readouterr().out
    assert COLLECTOR.take() == []

    import orchestrator.cli.rerun as rerun

    monkeypatch.setattr(rerun, "complete", lambda text, *a, **k: text)
    assert main(argv) == 1
    found = COLLECTOR.take()
    assert {(v.command, v.printed_by) for v in found} == {("dsv4ctl plan", tuple(argv))}
    assert sorted(v.reason.split(";")[0] for v in found) == [
        "it names no inventory", "it names no profile"]
