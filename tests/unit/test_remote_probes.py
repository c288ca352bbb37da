"""Remote-layer probe parsers (orchestrator.remote.probes) on recorded real output.

pyinfra-style: command + recorded output -> fact.

Recordings in tests/data/probes/: `nvidia-smi.h200.txt` is the probe's exact query run on an NVIDIA
H200 (driver 580.159.04); the `*.json` files hold the command, exit code and output of each probe
run by the orchestrator over SSH against a fake host (real OpenSSH, real systemd 252 `--user`, the
engine simulator serving), recorded with `orchestrator.remote.probes` commands.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from orchestrator.errors import RemoteError
from orchestrator.profile.inventory import Host
from orchestrator.remote import probes as P
from orchestrator.remote.probes import CommandResult

DATA = Path(__file__).resolve().parents[1] / "data" / "probes"


def rec(name: str) -> dict[str, Any]:
    return json.loads((DATA / name).read_text())


def test_gpus_real_h200() -> None:
    gpus, driver = P.parse_gpus((DATA / "nvidia-smi.h200.txt").read_text())
    assert driver == "580.159.04"
    assert [(g.index, g.name, g.memory_mib, g.compute_cap) for g in gpus] == [
        (0, "NVIDIA H200", 143771, "9.0")]
    assert gpus[0].uuid == "GPU-7a4c3862-a357-ea97-3b2a-f14f261c83f0"


def test_gpus_sorted_na_fields_and_errors() -> None:
    out = ("1, NVIDIA RTX PRO 6000 Blackwell Server Edition, 97887, 12.0, GPU-b, 580.95.05\n"
           "0, NVIDIA RTX PRO 6000 Blackwell Server Edition, [N/A], [N/A], [N/A], 580.95.05\n")
    gpus, driver = P.parse_gpus(out)
    assert [g.index for g in gpus] == [0, 1] and driver == "580.95.05"
    assert gpus[0].memory_mib is None and gpus[0].compute_cap is None and gpus[0].uuid is None
    with pytest.raises(RemoteError, match="expected 6"):
        P.parse_gpus("0, NVIDIA H200, 143771\n")
    with pytest.raises(RemoteError, match="several driver versions"):
        P.parse_gpus("0, a, 1, 9.0, u, 1.0\n1, a, 1, 9.0, v, 2.0\n")
    with pytest.raises(RemoteError, match="cannot read"):
        P.parse_gpus("x, a, 1, 9.0, u, 1.0\n")


class FakeShell:
    def __init__(self, results: dict[str, CommandResult]) -> None:
        self.results = results

    def run(self, command: str, *, timeout: float | None = None) -> CommandResult:
        return self.results[command]


def test_gpu_probe_missing_tool_vs_broken_driver() -> None:
    missing = FakeShell({P.GPU_COMMAND: CommandResult(P.GPU_COMMAND, 127, "", "not found")})
    assert P.probe_gpus(missing) == ([], None)
    broken = FakeShell({P.GPU_COMMAND: CommandResult(
        P.GPU_COMMAND, 9, "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA "
        "driver.", "")})
    with pytest.raises(RemoteError, match=r"exit 9.*couldn.t communicate"):
        P.probe_gpus(broken)


def test_disks_recorded_rounds_free_down_to_gib() -> None:
    r = rec("disks.json")
    assert r["command"] == P.disk_command(["/srv/dsv4", "/models/DeepSeek-V4-Flash-NVFP4",
                                           "/models/not-yet-here/x"])
    disks = P.parse_disks(r["stdout"])
    assert [d.path for d in disks] == ["/srv/dsv4", "/models/DeepSeek-V4-Flash-NVFP4",
                                       "/models/not-yet-here/x"]
    raw_free = int(r["stdout"].splitlines()[1].split()[1])
    assert disks[0].size_bytes == 270553174016
    assert disks[0].free_bytes == raw_free // 2**30 * 2**30 <= raw_free
    with pytest.raises(RemoteError, match="expected 'SIZE AVAIL'"):
        P.parse_disks("==> /x\nMounted on  1B-blocks\n")


def test_df_table_real_device_output() -> None:
    text = "Mounted on    1B-blocks       Avail\n/          270553174016 68701593600\n"
    (d,) = P.parse_df_table(text)
    assert (d.path, d.size_bytes, d.free_bytes) == ("/", 270553174016, 68701593600)


def test_models_exact_size_from_index() -> None:
    r = rec("models.json")
    models = P.parse_models(r["stdout"], {"/models/DeepSeek-V4-Flash-NVFP4": "dsv4-flash-nvfp4"})
    assert [(m.path, m.size_bytes, m.variant) for m in models] == [
        ("/models/DeepSeek-V4-Flash-NVFP4", 158_000_000_000, "dsv4-flash-nvfp4")]


def test_index_total_size_variants() -> None:
    assert P.parse_index_total_size('{"metadata": {"total_size": 1.6e11}}') == 160_000_000_000
    # a truncated index still names its size
    assert P.parse_index_total_size('{"metadata": {"total_size": 123}, "weight_map": {"a') == 123
    with pytest.raises(RemoteError, match=r"no metadata\.total_size"):
        P.parse_index_total_size('{"weight_map": {}}')
    with pytest.raises(RemoteError, match="names no total_size"):
        P.parse_index_total_size("garbage")


def test_ports_recorded_and_ephemeral_range_excluded() -> None:
    r = rec("ports.json")
    assert r["command"] == P.PORTS_COMMAND
    assert P.parse_ports(r["stdout"]) == [22, 8000, 8998, 29000, 30001]
    text = ("32768\t60999\nLISTEN 0 4096 [::]:22 [::]:*\nLISTEN 0 5 127.0.0.53%lo:53 0.0.0.0:*\n"
            "LISTEN 0 128 *:40001 *:*\nLISTEN 0 128 [::ffff:127.0.0.1]:30000 *:*\n")
    assert P.parse_ports(text) == [22, 53, 30000]
    assert P.parse_ports("LISTEN 0 128 *:40001 *:*\n") == [40001]  # no range line: keep all
    with pytest.raises(RemoteError):
        P.parse_ports("LISTEN 0 128 nonsense\n")


def test_units_recorded_real_systemd() -> None:
    r = rec("units.user.json")
    units = {u.name: u.active for u in P.parse_units(r["stdout"])}
    assert units == {"dsv4-itest-decode.service": "activating",
                     "dsv4-itest-prefill.service": "active",
                     "dsv4-itest-router.service": "active"}
    assert P.units_command("system").startswith("systemctl list-units")
    assert P.units_command("user").startswith("systemctl --user list-units")


def test_show_recorded_crashing_unit() -> None:
    r = rec("show.user.json")
    blocks = P.parse_show(r["stdout"])
    assert blocks["dsv4-itest-decode.service"]["SubState"] == "auto-restart"
    assert blocks["dsv4-itest-decode.service"]["Result"] == "exit-code"
    assert blocks["dsv4-itest-prefill.service"]["ActiveState"] == "active"


def test_current_release_and_manifest() -> None:
    rel, files = P.parse_current(rec("current.json")["stdout"])
    assert rel is not None and rel.startswith("r0001-")
    assert "units/dsv4-itest-decode.service" in files
    assert all(len(h) == 64 for h in files.values())
    assert P.parse_current(rec("current.none.json")["stdout"]) == (None, {})
    with pytest.raises(RemoteError, match=r"manifest\.json is unreadable"):
        P.parse_current("release=releases/r0001-x\n{not json")


def test_probe_paths_stable_and_deduplicated() -> None:
    host = Host(address="h", gpus={"model": "x", "count": 1},
                disks=[{"path": "/models", "size": "1TB", "free": "1GB"}],
                models=[{"path": "/models/a", "size": 1}])
    disks, models = P.probe_paths(host, ["/models/b", "/models/a"])
    assert models == ["/models/a", "/models/b"]
    assert disks == ["/models", "/models/a", "/models/b", "/srv/dsv4"]


def test_commands_quote_hostile_paths() -> None:
    cmd = P.disk_command(["/models/x; rm -rf /"])
    assert "'/models/x; rm -rf /'" in cmd
    assert "'/srv/$(reboot)'" in P.current_command("/srv/$(reboot)")


def test_newest_release_is_probed_with_current() -> None:
    """Issue 20 #8: the newest release (a failed attempt included) is a fact, so a plan made after
    a failed attempt differs from the one made before it; parse_current ignores the listing."""
    cur = rec("current.json")["stdout"]
    listing = ("\n" + P.LATEST + "\nr0009-20260101T000000Z-0000000a\n"
               "r0010-20260101T000000Z-0000000b\n.tmp-x\nr0002-20260101T000000Z-0000000c\n")
    assert P.parse_current(cur + listing) == P.parse_current(cur)
    assert P.parse_latest(cur + listing) == "r0010-20260101T000000Z-0000000b"
    assert P.parse_latest(P.LATEST + "\n") is None and P.parse_latest(cur) is None
    assert P.parse_current("\n" + P.LATEST + "\n") == (None, {})


def test_batched_probe_gives_each_command_its_own_result() -> None:
    """Issue 20 #10: the probes run in one round trip; each command still gets exactly the
    stdout, stderr and exit status it would get alone (run here by a local sh)."""
    import subprocess

    commands = ["echo a; echo b >&2; exit 3", "printf 'no newline'", "true",
                "cat /nonexistent/x", "printf 'two\\n\\n'", P.model_command([]),
                "printf '%s\\n' '@@dsv4-x out 9'"]
    token = "@@dsv4-0123456789abcdef"
    got = subprocess.run(["sh", "-c", P.batch_command(commands, token)], capture_output=True,
                         text=True, check=True).stdout
    results = P.parse_batch(got, commands, token)
    for c in commands:
        alone = subprocess.run(["sh", "-c", c], capture_output=True, text=True)
        r = results[c]
        assert (r.rc, r.stdout, r.stderr) == (alone.returncode, alone.stdout, alone.stderr), c
    with pytest.raises(RemoteError, match="no result for 1 of"):
        P.parse_batch(got, [*commands, "echo never"], token)


def test_batched_probe_refuses_an_output_past_its_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    """The cap is read from one `wc -c` of every output after the batch (not a `wc` per
    command): a command that prints past it is refused by name, the others within it pass."""
    import subprocess

    monkeypatch.setattr(P, "BATCH_MAX_OUTPUT", 10)
    token = "@@dsv4-0123456789abcdef"
    small, big = "printf 0123456789", "printf %s 0123456789x"
    got = subprocess.run(["sh", "-c", P.batch_command([small], token)], capture_output=True,
                         text=True, check=True).stdout
    assert P.parse_batch(got, [small], token)[small].stdout == "0123456789"
    got = subprocess.run(["sh", "-c", P.batch_command([small, big], token)],
                         capture_output=True, text=True, check=True).stdout
    with pytest.raises(RemoteError, match=r"cut it there and stopped: 'printf %s 0123456789x'"):
        P.parse_batch(got, [small, big], token)
