"""Every command dsv4ctl prints for the operator is runnable as printed: it carries the -p, -i
and --host of the run that printed it, and run as printed it acts on the same deployment.

The symptom: fix lines dropped -p/-i (`fix: re-plan: dsv4ctl plan --host box --live -o
PLAN.json`, `dsv4ctl history --host box`); run as printed they fell back to the bundled default
profile, and with -i one of them planned deployment `default` onto the host (3 stops).

Here the real flows produce the lines (a stale saved plan, a rollback to a release that does not
exist, plan -o), over real sshd and `systemd --user`; then each printed command is run.
"""

from __future__ import annotations

import re
import shlex

import pytest

from orchestrator.cli import main
from tests.integration.test_apply import Env, decode_knob, env, first_release  # noqa: F401

pytestmark = pytest.mark.integration
COMMAND = re.compile(r"dsv4ctl [^`;()\n]*")


def _commands(text: str) -> list[list[str]]:
    out = []
    for m in COMMAND.finditer(text):
        words = shlex.split(m.group(0).split("  #")[0])
        if len(words) > 1 and words[1] in ("plan", "history", "status", "apply", "rollback"):
            out.append(words)
    return out


def test_every_printed_command_acts_on_the_same_deployment(
        env: Env, capsys: pytest.CaptureFixture[str], tmp_path) -> None:  # noqa: F811
    first_release(env)
    profile = env.profile_file(env.profile(), "my-profile.yaml")
    inv = str(env.inventory_path)
    printed: list[str] = []

    def run(*argv: str) -> int:
        rc = main(list(argv))
        cap = capsys.readouterr()
        printed.append(cap.out + cap.err)
        return rc

    # a saved plan, made stale by another apply, applied anyway
    stale = tmp_path / "stale.json"
    assert run("plan", "-p", str(profile), "-i", inv, "--host", "h", "--live", "-o",
               str(stale)) == 0
    assert run("apply", "-p", str(env.profile_file(decode_knob(env, 32), "other.yaml")),
               "-i", inv, "--host", "h", "--yes") == 0
    assert run("apply", str(stale), "-i", inv, "--host", "h", "--yes") == 6
    # a rollback to a release the host does not have
    assert run("rollback", "r9999-20000101T000000Z-deadbeef", "-p", str(profile), "-i", inv,
               "--host", "h", "--yes") == 1
    commands = [c for text in printed for c in _commands(text)]
    assert commands, printed
    ran = 0
    for argv in commands:
        positional = [w for i, w in enumerate(argv[2:], 2) if not w.startswith("-")
                      and not argv[i - 1].startswith("-")]
        if argv[1] in ("plan", "apply"):  # the subject named once: -p or an operand, not both
            assert ("-p" in argv) != bool(positional), argv
        assert "-i" in argv and argv[argv.index("-i") + 1] == inv, argv
        assert "--host" in argv and argv[argv.index("--host") + 1] == "h", argv
        if argv[1] in ("plan", "history", "status"):
            assert "-p" in argv or (argv[1] == "plan" and len(argv) > 2 and
                                    not argv[2].startswith("-")), argv
            argv = [("%s" % (tmp_path / "replan.json") if w == "PLAN.json" else w)
                    for w in argv[1:]]
            rc = main(argv)
            out = capsys.readouterr()
            assert rc in (0, 1, 2), (argv, out)
            text = out.out + out.err
            # the same deployment: never the bundled default profile's
            assert "'default'" not in text and "dsv4-default-" not in text, (argv, text)
            ran += 1
    assert ran >= 2, commands
