"""`dsv4ctl render`: writes the tree with modes and manifest, prints it, fails with located
errors."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import yaml
from click.testing import CliRunner

from orchestrator.cli import main
from tests.validate.helpers import INVENTORY, PROFILES, render_path


def _invoke(*args: str) -> tuple[int, str, str]:
    import click

    box: dict[str, int] = {}

    @click.command()
    def _cmd() -> None:
        box["rc"] = main(list(args))

    res = CliRunner().invoke(_cmd, [], catch_exceptions=False)
    return box["rc"], res.stdout, res.stderr


def test_render_writes_tree_modes_and_manifest(tmp_path: Path) -> None:
    out = tmp_path / "out"
    rc, stdout, err = _invoke("render", str(PROFILES / "default.yaml"), "-o", str(out))
    assert rc == 0, err
    _, _, tree = render_path(PROFILES / "default.yaml")
    assert tree.digest() in stdout and "Rendered 15 files" in stdout
    written = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert written == sorted([*tree.all_files(), ".dsv4ctl-render.json"])  # + what it wrote
    for rel, f in tree.all_files().items():
        assert (out / rel).read_text() == f.content
        assert stat.S_IMODE(os.stat(out / rel).st_mode) == f.mode
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["files"]["bin/launch-decode.sh"]["mode"] == "0755"


def test_render_default_profile_and_stdout() -> None:
    rc, stdout, _ = _invoke("render", "--stdout", "-i", str(INVENTORY))
    assert rc == 0
    assert "==> units/dsv4-default-decode.service (mode 0644, restarts decode) <==" in stdout
    assert "==> manifest.json" in stdout


def test_render_without_a_destination_prints_the_tree() -> None:
    rc, out, _ = _invoke("render", str(PROFILES / "default.yaml"))
    assert rc == 0 and "units/dsv4-default-decode.service" in out


def test_render_reports_invalid_profile_with_location(tmp_path: Path) -> None:
    data = yaml.safe_load((PROFILES / "default.yaml").read_text())
    data["topology"]["decode"]["tp"] = "four"
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(data, sort_keys=False))
    (tmp_path / "inventory.yaml").write_text(INVENTORY.read_text())
    rc, _, err = _invoke("render", str(bad), "-o", str(tmp_path / "o"))
    assert rc == 1
    assert "topology.decode.tp" in err and f"{bad}:" in err and "Traceback" not in err
    assert not (tmp_path / "o").exists()


def test_render_error_names_the_field(tmp_path: Path) -> None:
    data = yaml.safe_load((PROFILES / "default.yaml").read_text())
    data["topology"]["decode"]["env"] = {"X": "two\nlines"}
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(data, sort_keys=False))
    (tmp_path / "inventory.yaml").write_text(INVENTORY.read_text())
    rc, _, err = _invoke("render", str(bad), "--stdout")
    assert rc == 1 and "topology.decode.env.X" in err and "fix:" in err


def test_unknown_inventory_host(tmp_path: Path) -> None:
    data = yaml.safe_load((PROFILES / "default.yaml").read_text())
    data["host"] = "nope"
    bad = tmp_path / "p.yaml"
    bad.write_text(yaml.safe_dump(data, sort_keys=False))
    rc, _, err = _invoke("render", str(bad), "--stdout", "-i", str(INVENTORY))
    assert rc == 1 and "'nope'" in err and "gpu-host" in err


def test_rerender_removes_stale_files_and_refuses_foreign_dirs(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert _invoke("render", str(PROFILES / "default.yaml"), "-o", str(out))[0] == 0
    assert (out / "units" / "dsv4-default-router.service").exists()
    rc, _, err = _invoke("render", str(PROFILES / "mxfp4-tp8.yaml"), "-o", str(out))
    assert rc == 0, err
    _, _, tree = render_path(PROFILES / "mxfp4-tp8.yaml")
    written = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert written == sorted([*tree.all_files(), ".dsv4ctl-render.json"])
    (out / "notes.txt").write_text("mine")
    rc, _, err = _invoke("render", str(PROFILES / "default.yaml"), "-o", str(out))
    assert rc == 1 and "notes.txt" in err
    other = tmp_path / "other"
    other.mkdir()
    (other / "x").write_text("x")
    rc, _, err = _invoke("render", str(PROFILES / "default.yaml"), "-o", str(other))
    assert rc == 1 and "render did not make it" in " ".join(err.split())
