"""Secret-leak golden test: a profile whose secrets resolve to a canary token, from the environment
and from a file, through every command that shows or writes derived text (render -o, render
--stdout/--textconv, diff text/markdown -v, plan text/markdown/json and a saved plan). The token
must appear nowhere; the units must point at the 0600 secrets file by path only."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from orchestrator.cli import main
from tests.validate.helpers import INVENTORY, PROFILES

CANARY = "hf_CANARY_5e1c7a0d9b2f4e8a_do_not_leak"


def _invoke(*args: str) -> tuple[int, str]:
    import click

    box: dict[str, int] = {}

    @click.command()
    def _cmd() -> None:
        box["rc"] = main(list(args))

    res = CliRunner().invoke(_cmd, [], catch_exceptions=False)
    return box["rc"], res.stdout + res.stderr


@pytest.fixture
def secret_profiles(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    monkeypatch.setenv("DSV4_TEST_HF_TOKEN", CANARY)
    token_file = tmp_path / "token"
    token_file.write_text(CANARY + "\n")
    token_file.chmod(0o600)
    data = yaml.safe_load((PROFILES / "default.yaml").read_text())
    data["secrets"] = {"HF_TOKEN": {"env": "DSV4_TEST_HF_TOKEN"},
                       "EXTRA_TOKEN": {"file": str(token_file)}}
    (tmp_path / "inventory.yaml").write_text(INVENTORY.read_text())
    a = tmp_path / "a.yaml"
    a.write_text(yaml.safe_dump(data, sort_keys=False))
    data["attention"]["index_topk"] = 512
    data["secrets"]["HF_TOKEN"] = {"file": str(token_file)}
    b = tmp_path / "b.yaml"
    b.write_text(yaml.safe_dump(data, sort_keys=False))
    return a, b


def test_no_command_output_or_file_contains_the_secret(secret_profiles: tuple[Path, Path],
                                                       tmp_path: Path) -> None:
    a, b = secret_profiles
    outputs: dict[str, str] = {}
    out_dir = tmp_path / "release"
    plan_file = tmp_path / "plan.json"
    runs = {
        "render -o": ("render", str(a), "-o", str(out_dir)),
        "render --stdout": ("render", str(a), "--stdout"),
        "render --textconv": ("render", str(b), "--textconv"),
        "diff": ("diff", str(a), str(b), "-v"),
        "diff markdown": ("diff", str(a), str(b), "-v", "--format", "markdown"),
        "plan": ("plan", str(a), "-v"),
        "plan markdown": ("plan", str(a), "--format", "markdown"),
        "plan json": ("plan", str(a), "--format", "json", "-o", str(plan_file)),
    }
    for name, argv in runs.items():
        rc, text = _invoke(*argv)
        assert rc == 0, (name, text)
        outputs[name] = text
    files = {str(p): p.read_text() for p in [*out_dir.rglob("*"), plan_file] if p.is_file()}
    assert len(files) > 10
    for where, text in {**outputs, **files}.items():
        assert CANARY not in text, f"secret leaked into {where}"
        # (rollout.strategy.canary, a profile field, is the one legitimate "canary: N")
        assert "CANARY" not in text.upper().replace("DSV4_TEST_HF_TOKEN", "").replace(
            "CANARY: ", ""), where
    # the secret is referenced by name and path only
    unit = (out_dir / "units" / "dsv4-default-decode.service").read_text()
    assert "EnvironmentFile=-/srv/dsv4/secrets/default.env" in unit.splitlines()
    resolved = yaml.safe_load((out_dir / "profile.yaml").read_text())
    assert resolved["secrets"]["HF_TOKEN"] == {"env": "DSV4_TEST_HF_TOKEN", "file": None}
    # and the diff still reports the change of where the secret comes from
    assert "secrets.HF_TOKEN.env" in outputs["diff"]
