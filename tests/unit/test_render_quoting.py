"""Quoting helpers: bash words survive real bash unchanged; unit/env-file escapes follow systemd's
rules; what cannot be made safe fails with a RenderError naming the field."""

from __future__ import annotations

import shlex
import subprocess

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.errors import RenderError
from orchestrator.render.quoting import (
    env_file_line,
    exec_line,
    exec_word,
    sh_join,
    sh_quote,
    unit_path,
    unit_value,
)

HOSTILE = [
    "", " ", "a b", "'", '"', "$(touch /tmp/pwned)", "`id`", "${HOME}", "$HOME", "a;b", "a && b",
    "a|b", "a\nb", "a\\", "\\n", "%h", "%n%%", "-rf", "--x=y", "*", "~", "!", "#c", "é ü 中",
    "a\tb", "'\"'\"'", "\\'", "$'\\x41'",
]


@given(st.text(alphabet=st.characters(blacklist_characters="\x00"), max_size=40))
@settings(max_examples=400)
def test_sh_quote_round_trips_through_shlex(value: str) -> None:
    assert shlex.split(sh_quote(value, "f")) == [value]


def test_sh_quote_round_trips_through_real_bash() -> None:
    words = [*HOSTILE, *(chr(c) for c in range(1, 128))]
    script = "printf '%s\\0' " + sh_join(words, "f")
    out = subprocess.run(["bash", "-c", script], capture_output=True, check=True).stdout
    assert out.decode("utf-8").split("\0")[:-1] == words


def test_sh_quote_rejects_nul_naming_the_field() -> None:
    with pytest.raises(RenderError, match=r"topology\.engine\.extra_args"):
        sh_quote("a\x00b", "topology.engine.extra_args")


@pytest.mark.parametrize(("raw", "expected"), [
    ("plain", "plain"),
    ("100%", "100%%"),
    ("%h/x", "%%h/x"),
    ("$HOME", "$HOME"),  # unit settings other than Exec* do not expand $
])
def test_unit_value_escapes_specifiers(raw: str, expected: str) -> None:
    assert unit_value(raw, "f") == expected


@pytest.mark.parametrize("raw", ["a\nb", "a\rb", "tab\there", "x\x1b[0m", " lead", "trail ",
                                 "nel\x85", "ls\u2028", "ps\u2029", "c1\x9b"])
def test_unit_value_refuses_what_systemd_would_misread(raw: str) -> None:
    with pytest.raises(RenderError, match=r"^description"):
        unit_value(raw, "description")


def test_unit_path_requires_absolute_and_no_spaces() -> None:
    assert unit_path("/srv/dsv4/%i", "f") == "/srv/dsv4/%%i"
    for bad in ("relative/x", "/with space", "/new\nline"):
        with pytest.raises(RenderError):
            unit_path(bad, "host.install_root")


@pytest.mark.parametrize(("raw", "expected"), [
    ("/usr/bin/x", "/usr/bin/x"),
    ("a b", '"a b"'),
    ("%h", "%%h"),
    ("$X", '"$$X"'),
    ('say "hi"', '"say \\"hi\\""'),
    ("back\\slash", '"back\\\\slash"'),
    (";", '";"'),
    ("-leading", '"-leading"'),
])
def test_exec_word(raw: str, expected: str) -> None:
    assert exec_word(raw, "f") == expected


def test_exec_line_needs_an_absolute_program() -> None:
    assert exec_line(["/srv/x/launch.sh"], "f") == "/srv/x/launch.sh"
    with pytest.raises(RenderError, match="absolute"):
        exec_line(["launch.sh"], "f")
    with pytest.raises(RenderError):
        exec_line(["/x", "a\nb"], "f")


@pytest.mark.parametrize(("value", "line"), [
    ("0,1,2,3", 'X="0,1,2,3"'),
    ('a"b', 'X="a\\"b"'),
    ("a\\b", 'X="a\\\\b"'),
    ("$(id) `id` ${HOME}", 'X="\\$(id) \\`id\\` \\${HOME}"'),
    ("%h", 'X="%h"'),  # env files are not specifier-expanded
    ("a b #c", 'X="a b #c"'),
])
def test_env_file_line(value: str, line: str) -> None:
    assert env_file_line("X", value, "f") == line


def test_env_file_line_rejects_bad_names_and_newlines() -> None:
    for value in ("a\nb", "a\x85b", "a\u2028b"):
        with pytest.raises(RenderError, match=r"topology\.decode\.env\.X"):
            env_file_line("X", value, "topology.decode.env.X")
    with pytest.raises(RenderError, match="environment variable name"):
        env_file_line("1X", "v", "f")
