"""Unit tests of the probes' pure parts: prompts, scoring, percentiles, the PNG writer, the CLI's
argument handling, and that `dsv4ctl plan`'s import path stays free of the probes."""

from __future__ import annotations

import struct
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from orchestrator.cli import main
from orchestrator.cli.probe_cmd import _lengths
from orchestrator.errors import DsvError
from orchestrator.probes import png, text
from orchestrator.probes.client import Endpoint
from orchestrator.probes.recall import (
    Calibration,
    Cell,
    RecallReport,
    _prompt,
    needle,
)
from orchestrator.probes.stats import percentile

REPO = Path(__file__).resolve().parents[2]


def test_percentile_interpolates() -> None:
    assert percentile([], 50) is None
    assert percentile([3.0], 99) == 3.0
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile([1, 2, 3, 4, 5], 90) == pytest.approx(4.6)
    assert percentile([5, 1, 4, 2, 3], 0) == 1 and percentile([5, 1, 4, 2, 3], 100) == 5


def test_needles_are_distinct_and_well_formed() -> None:
    seen = set()
    for n in (1000, 2000, 4000):
        for d in (0.0, 0.5, 1.0):
            key, value = needle(n, d)
            assert " is " not in f" {key} " and value.replace("-", "").isalnum()
            seen.add(value)
    assert len(seen) == 9


def test_filler_never_contains_the_needle_phrase() -> None:
    body = " ".join(text.sentences(0)) + " ".join(text.sentences(99))
    assert "secret code" not in body.lower()
    assert sum(text.estimate_tokens(s) for s in text.filler(500)) >= 500


@pytest.mark.parametrize("depth", [0.0, 0.5, 1.0])
def test_needle_sits_at_its_depth(depth: float) -> None:
    sentences = text.filler(2000, seed=1)
    key, value = needle(2000, depth)
    prompt = _prompt(sentences, depth, key, value)
    doc = prompt.split("\n\n")[1]
    pos = doc.index(f"The secret code for {key} is {value}.") / len(doc)
    assert abs(pos - depth) < 0.02
    assert prompt.rstrip().endswith(f"What is the secret code for {key}? Reply with the code only.")


def test_calibration_sizes_prompts() -> None:
    cal = Calibration(per_est_token=1.0, overhead=0.0)
    for target in (1000, 5000):
        key, value = needle(target, 0.5)
        p = _prompt(cal.sentences_for(target, seed=target), 0.5, key, value)
        assert abs(text.estimate_tokens(p) - target) <= 0.02 * target
    # A tokenizer that counts 1.3 tokens per estimated token and adds 20 of template gets fewer.
    skew = Calibration(1.3, 20.0)
    est = sum(text.estimate_tokens(s) for s in skew.sentences_for(13020, 1))
    assert abs(est * 1.3 + 20 - 13020) < 0.03 * 13020


def test_longest_full_recall_is_monotone() -> None:
    rep = RecallReport([1000, 2000, 4000, 8000], [0.0, 1.0])
    ok = {1000: (True, True), 2000: (True, False), 4000: (True, True), 8000: (False, False)}
    rep.cells = [Cell(n, d, n, ok[n][i], "") for n in rep.lengths for i, d in enumerate(rep.depths)]
    assert rep.longest_full_recall == 1000  # 4000 is full, but 2000 is not
    assert rep.recall(2000) == 0.5
    table = rep.table()
    assert "longest length with full recall: 1000 tokens" in table
    assert "miss" in table
    rep.cells = [Cell(n, d, None, False, "", "HTTP 400") for n in rep.lengths for d in rep.depths]
    assert rep.longest_full_recall is None
    assert "none (the shortest length failed)" in rep.table() and "ERR" in rep.table()


def _decode_png(data: bytes) -> tuple[int, int, bytes]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat = 8, b""
    w = h = 0
    while pos < len(data):
        (n,) = struct.unpack(">I", data[pos:pos + 4])
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + n]
        (crc,) = struct.unpack(">I", data[pos + 8 + n:pos + 12 + n])
        assert crc == zlib.crc32(kind + body) & 0xFFFFFFFF
        if kind == b"IHDR":
            w, h = struct.unpack(">II", body[:8])
            assert body[8:] == bytes([8, 2, 0, 0, 0])
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    return w, h, zlib.decompress(idat)


def test_png_heatmap_encodes_the_grid() -> None:
    lengths, depths = [1000, 64000], [0.0, 1.0]
    values = {(1000, 0.0): True, (1000, 1.0): True, (64000, 0.0): False, (64000, 1.0): None}
    w, h, raw = _decode_png(png.heatmap(lengths, depths, values, cell=20, scale=1))
    assert raw and len(raw) == h * (1 + 3 * w)
    label_w, label_h = 20, 8

    def pixel(x: int, y: int) -> tuple[int, ...]:
        row = raw[y * (1 + 3 * w) + 1:(y + 1) * (1 + 3 * w)]
        return tuple(row[3 * x:3 * x + 3])

    centre = [(label_w + c * 20 + 10, label_h + r * 20 + 10) for r in range(2) for c in range(2)]
    assert [pixel(x, y) for x, y in centre] == [png.GREEN, png.RED, png.GREEN, png.GREY]
    assert png.short_length(64000) == "64k" and png.short_length(1_000_000) == "1M"


def test_lengths_option_parsing() -> None:
    # one convention for token counts everywhere (profiles too): K = 1024, M = 1024 * 1024
    assert _lengths("1k, 2.5k,1M,300") == [1024, 2560, 1_048_576, 300]
    with pytest.raises(DsvError):
        _lengths("1k,lots")


def test_bad_url_is_a_typed_error() -> None:
    with pytest.raises(DsvError) as exc:
        Endpoint("localhost:8000")
    assert "not an http(s) URL" in exc.value.message
    assert Endpoint("http://h:1/v1/").root == "http://h:1"


def test_cli_reports_bad_options_without_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["probe", "recall", "--url", "ftp://x", "--lengths", "1k"]) == 1
    err = capsys.readouterr().err
    assert "not an http(s) URL" in err and "Traceback" not in err
    assert main(["probe", "recall", "--url", "http://127.0.0.1:9", "--model", "m",
                 "--depths", "0,2"]) == 1
    assert "depths [2.0] are outside 0..1" in capsys.readouterr().err
    assert main(["probe", "load", "--url", "http://127.0.0.1:9", "-c", "0"]) == 1


def test_probe_help_lists_the_commands(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["probe", "--help"]) == 0
    out = capsys.readouterr().out
    for cmd in ("recall", "load", "chat"):
        assert cmd in out
    assert main(["probe", "recall", "--help"]) == 0
    assert "--plot" in capsys.readouterr().out


def test_cli_import_does_not_load_the_probes() -> None:
    code = ("import sys, orchestrator.cli; "
            "bad = [m for m in sys.modules if m.startswith('orchestrator.probes')]; "
            "assert not bad, bad")
    res = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
