"""A failed health check names the unit's log and shows its last lines, secrets redacted (the
symptom: a never-ready decode reported only `HTTP 503 (starting or unhealthy)`)."""

from __future__ import annotations

from types import SimpleNamespace

from orchestrator.apply.steps import LOG_TAIL_LINES, show_log_tails
from orchestrator.planner.fleet import plan_from_paths
from orchestrator.remote.probes import CommandResult
from tests.validate.helpers import PROFILES


def test_the_log_tail_is_shown_with_every_secret_redacted() -> None:
    plan = plan_from_paths(PROFILES / "default.yaml", PROFILES / "inventory.yaml")
    secret = "sk-very-secret-key-0123"
    ran: list[str] = []

    def run(cmd: str, timeout: float | None = None) -> CommandResult:
        ran.append(cmd)
        return CommandResult(cmd, 0, f"INFO server_args={{'api_key': '{secret}'}}\n"
                             "ERROR CUDA out of memory\n", "")

    printed: list[str] = []
    ctx = SimpleNamespace(deployment=plan.deployment, host=SimpleNamespace(install_root="/srv/dsv4"),
                          secrets={"DSV4_SECRET_API_KEY": secret}, remote=SimpleNamespace(run=run),
                          out=printed.append)
    logs = show_log_tails(ctx, ["decode"])  # type: ignore[arg-type]
    assert logs == "/srv/dsv4/logs/decode.log"
    assert ran == [f"tail -n {LOG_TAIL_LINES} -- /srv/dsv4/logs/decode.log 2>/dev/null"]
    text = "\n".join(printed)
    assert "last 2 lines of /srv/dsv4/logs/decode.log:" in text
    assert "CUDA out of memory" in text and "<redacted>" in text and secret not in text
