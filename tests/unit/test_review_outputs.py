"""Machine and review outputs stay whole: markdown and unified diffs are never folded to the
terminal, `-v` means one thing, library logs are `--debug`'s, and a plan apply would refuse is
not advertised as one to apply.

Each test is a symptom an operator hit: `diff --format markdown > comment.md` split table rows
and gave `- - stop router`; unified diffs got continuation lines and no longer applied; `-v` was
info checks on plan, every file diff on diff and paramiko's key exchange on `plan --live`; a plan
with errors or from declared facts was saved and advertised as `Apply it with: ...`.
"""

from __future__ import annotations

import difflib
import json
import re
import shlex
from pathlib import Path

import pytest
import yaml
from markdown_it import MarkdownIt

from orchestrator.cli import cli, main
from orchestrator.paths import data_dir

PROFILES = data_dir("profiles")


def _pair(tmp_path: Path) -> tuple[Path, Path]:
    """A change whose table cells, bullets and diff lines are longer than a 100-column pipe."""
    (tmp_path / "inventory.yaml").write_text((PROFILES / "inventory.yaml").read_text())
    old = yaml.safe_load((PROFILES / "default.yaml").read_text())
    new = yaml.safe_load((PROFILES / "default.yaml").read_text())
    old["attention"]["index_topk"] = 512
    long = "a-very-long-description-word " * 8
    new["description"] = long.strip()
    new["topology"]["decode"]["extra_args"] = ["--log-level", "debug"]
    new["topology"]["decode"]["env"] = {"SOME_LONG_VARIABLE_NAME_FOR_A_TEST": "x" * 120}
    a, b = tmp_path / "old.yaml", tmp_path / "new.yaml"
    a.write_text(yaml.safe_dump(old, sort_keys=False))
    b.write_text(yaml.safe_dump(new, sort_keys=False))
    return a, b


def _cells(md: str) -> list[list[str]]:
    """The rows of the first table, as a markdown parser reads them."""
    tokens = MarkdownIt("commonmark").enable("table").parse(md)
    rows, row, in_table = [], None, False
    for t in tokens:
        if t.type == "table_open":
            if in_table or rows:
                break
            in_table = True
        elif t.type == "tr_open":
            row = []
        elif t.type == "inline" and row is not None and in_table:
            row.append("".join(c.content for c in t.children or [] if c.type in
                               ("code_inline", "text")))
        elif t.type == "tr_close" and row is not None:
            rows.append(row)
            row = None
        elif t.type == "table_close":
            break
    return rows


def test_markdown_diff_parses_to_the_json_fields(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    a, b = _pair(tmp_path)
    assert main(["diff", str(a), str(b), "--format", "markdown"]) == 0
    md = capsys.readouterr().out
    assert main(["diff", str(a), str(b), "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    header, *body = _cells(md)
    assert header == ["field", "old", "new"]

    def show(f: dict, side: str) -> str:  # the review's notation: JSON values, "(absent)"
        return "(absent)" if side in f["absent"] else json.dumps(f[side], sort_keys=True)

    want = [[f["path"], show(f, "old"), show(f, "new")] for f in data["fields"]]
    assert body == want  # every cell, however long, in one row of the parsed table
    assert "- - " not in md  # no bullet folded into a second bullet
    # every bullet and row is one line, however long
    assert any(len(line) > 100 for line in md.splitlines())


def test_unified_diffs_are_never_folded(tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    from orchestrator.planner.build import load_context, resolve_deployment
    from orchestrator.render import render_release

    a, b = _pair(tmp_path)
    assert main(["diff", str(a), str(b), "-v"]) == 0
    out = capsys.readouterr().out

    def tree(p: Path) -> dict[str, str]:
        ctx = load_context(p, None)
        return {k: f.content for k, f in render_release(ctx.profile,
                                                         resolve_deployment(ctx)).files.items()}

    ta, tb = tree(a), tree(b)
    changed = [p for p in sorted(tb) if ta.get(p) != tb[p] and p in ta]
    assert changed
    for path in changed:
        want = "".join(difflib.unified_diff(ta[path].splitlines(True), tb[path].splitlines(True),
                                            f"a/{path}", f"b/{path}", n=3))
        assert want in out, path  # byte for byte: it still applies as a patch
    assert any(len(line) > 100 for line in out.splitlines())


def test_verbose_means_one_thing_and_library_logs_are_debug(
        capsys: pytest.CaptureFixture[str]) -> None:
    helps = {}
    for name, cmd in cli.commands.items():
        for p in getattr(cmd, "params", []):
            if "-v" in getattr(p, "opts", []) and not getattr(p, "hidden", False):
                helps[name] = p.help
    assert {"validate", "plan", "diff"} <= set(helps)
    assert len(set(helps.values())) == 1, helps
    for name in ("status", "apply", "rollback", "history", "unlock", "plan"):
        assert main([name, "--help"]) == 0
        assert "--debug" in capsys.readouterr().out, name
    rc = main(["status", "-v"])
    err = capsys.readouterr().err
    assert rc != 0 and "--debug" in err


def _plan_out(tmp_path: Path, text: str, capsys: pytest.CaptureFixture[str]
              ) -> tuple[int, str, Path]:
    (tmp_path / "inventory.yaml").write_text((PROFILES / "inventory.yaml").read_text())
    prof = tmp_path / "my profile.yaml"
    prof.write_text(text)
    out = tmp_path / "plan.json"
    rc = main(["plan", "-p", str(prof), "-i", str(tmp_path / "inventory.yaml"), "-o", str(out)])
    return rc, capsys.readouterr().out, out


def test_a_plan_with_errors_is_neither_saved_nor_advertised(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = (PROFILES / "mxfp4-tp8.yaml").read_text().replace("    ep: 8\n", "    ep: 4\n")
    rc, out, saved = _plan_out(tmp_path, text, capsys)
    assert rc == 1 and not saved.exists()
    assert "Apply it with" not in out and "Not saved" in out


def test_a_plan_of_declared_facts_says_how_to_make_one_apply_takes(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, saved = _plan_out(tmp_path, (PROFILES / "mxfp4-tp8.yaml").read_text(), capsys)
    assert rc == 0 and saved.exists()
    assert "Apply it with" not in out and "declared facts" in out
    command = out.rstrip().splitlines()[-1].strip()  # the last line: the command, whole
    argv = shlex.split(command)  # whole on one line, quoted: the path has a space
    assert argv[:2] == ["dsv4ctl", "plan"] and "--live" in argv
    assert argv[argv.index("-p") + 1] == str(tmp_path / "my profile.yaml")
    assert argv[argv.index("-i") + 1] == str(tmp_path / "inventory.yaml")
    assert re.search(r"-o \S*plan\.json", command)
