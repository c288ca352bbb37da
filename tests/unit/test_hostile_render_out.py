"""Issue 31, Deliver 5 and 7: ``render -o DIR`` touches only what is its own, with explicit modes.

Before: render deleted every path a planted ``DIR/manifest.json`` listed, ``../`` and absolute paths
included, and the files ``plan -o`` and ``render -o`` wrote followed the operator's umask (up to
0666). Now render writes into an empty directory or one it made, removes only files it wrote there
(recorded with their sha256 in ``DIR/.dsv4ctl-render.json``), and refuses anything else before a
file is written or removed.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.unit.test_render_cli import _invoke
from tests.validate.helpers import INVENTORY, PROFILES

DEFAULT = str(PROFILES / "default.yaml")


def _victims(tmp_path: Path) -> list[Path]:
    v = tmp_path / "victim"
    v.mkdir()
    (v / "keep.txt").write_text("mine")
    return [v / "keep.txt"]


def test_a_planted_manifest_deletes_nothing(tmp_path: Path) -> None:
    victims = _victims(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    (out / "manifest.json").write_text(json.dumps({"files": {
        "../victim/keep.txt": {"sha256": "0" * 64}, str(victims[0]): {"sha256": "0" * 64}}}))
    rc, _, err = _invoke("render", DEFAULT, "-o", str(out))
    assert rc == 1 and "render did not make it" in " ".join(err.split())
    assert victims[0].read_text() == "mine"


def test_a_planted_marker_deletes_nothing_outside_or_inside(tmp_path: Path) -> None:
    victims = _victims(tmp_path)
    out = tmp_path / "out"
    assert _invoke("render", DEFAULT, "-o", str(out))[0] == 0
    marker = out / ".dsv4ctl-render.json"
    for planted in ({"../victim/keep.txt": "0" * 64}, {str(victims[0]): "0" * 64},
                    {"units//x": "0" * 64}):
        doc = json.loads(marker.read_text())
        doc["files"].update(planted)
        marker.write_text(json.dumps(doc))
        rc, _, err = _invoke("render", str(PROFILES / "mxfp4-tp8.yaml"), "-o", str(out))
        assert rc == 1 and "not render's" in err, err
        assert victims[0].read_text() == "mine"


def test_a_file_the_operator_edited_is_not_removed(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert _invoke("render", DEFAULT, "-o", str(out))[0] == 0
    router = out / "units" / "dsv4-default-router.service"
    router.write_text("# my notes\n")
    rc, _, err = _invoke("render", str(PROFILES / "mxfp4-tp8.yaml"), "-o", str(out))
    assert rc == 1 and "changed since render wrote it" in " ".join(err.split())
    assert router.read_text() == "# my notes\n"


def test_a_link_in_the_output_is_never_followed(tmp_path: Path) -> None:
    victims = _victims(tmp_path)
    out = tmp_path / "out"
    assert _invoke("render", DEFAULT, "-o", str(out))[0] == 0
    (out / "units").rename(out / "units.real")
    (out / "units").symlink_to(victims[0].parent)
    rc, _, err = _invoke("render", DEFAULT, "-o", str(out))
    assert rc == 1
    assert sorted(p.name for p in victims[0].parent.iterdir()) == ["keep.txt"]
    link_out = tmp_path / "link-out"
    link_out.symlink_to(victims[0].parent)
    rc, _, err = _invoke("render", DEFAULT, "-o", str(link_out))
    assert rc == 1 and "symbolic link" in err
    assert sorted(p.name for p in victims[0].parent.iterdir()) == ["keep.txt"]


@pytest.fixture
def wide_umask() -> Iterator[None]:
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


def test_render_and_plan_files_have_explicit_modes_whatever_the_umask(
        tmp_path: Path, wide_umask: None) -> None:
    out = tmp_path / "out"
    assert _invoke("render", DEFAULT, "-o", str(out))[0] == 0
    modes = {p.relative_to(out).as_posix(): stat.S_IMODE(os.lstat(p).st_mode)
             for p in out.rglob("*")}
    assert modes[".dsv4ctl-render.json"] == 0o600
    assert all(m & 0o022 == 0 for m in modes.values()), modes
    plan = tmp_path / "plan.json"
    rc, _, err = _invoke("plan", DEFAULT, "-i", str(INVENTORY), "-o", str(plan))
    assert rc in (0, 2), err
    assert stat.S_IMODE(os.stat(plan).st_mode) == 0o644
