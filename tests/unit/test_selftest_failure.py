"""A kernel self-test traceback is shown once, whole (it was cut mid-word and printed 4 times:
the step's FAILED line, the error, the record and the summary each carried a 300-character
slice of it)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from orchestrator.apply.context import StepFailed
from orchestrator.apply.steps import selftest_outcome
from orchestrator.remote.probes import CommandResult

TRACEBACK = ["Traceback (most recent call last):"] + [
    f'  File "/srv/dsv4/releases/r1/kernels/dsv4_kernels/mod{i}.py", line {i}, in run_kernel_{i}'
    for i in range(30)] + ["RuntimeError: CUDA error: an illegal memory access was encountered"]


def test_a_traceback_is_printed_once_whole_and_the_error_carries_its_last_line() -> None:
    printed: list[str] = []
    ctx = SimpleNamespace(out=printed.append)
    res = CommandResult("selftest", 1, "", "\n".join(TRACEBACK) + "\n")
    with pytest.raises(StepFailed) as err:
        selftest_outcome(ctx, res, "abc", "/srv/dsv4/releases/r1/kernels/selftest.json")  # type: ignore[arg-type]
    shown = [p.removeprefix("    | ") for p in printed if p.startswith("    | ")]
    assert shown == TRACEBACK  # whole, in order, once
    msg = err.value.message
    assert msg.endswith(TRACEBACK[-1]) and "File " not in msg  # one line, not a cut slice
    assert "selftest.json" in (err.value.fix or "")


def test_a_failed_json_report_is_summarised_not_the_traceback() -> None:
    ctx = SimpleNamespace(out=lambda s: None)
    res = CommandResult("selftest", 1, '{"ok": false, "decode": {"ok": false}}', "")
    with pytest.raises(StepFailed) as err:
        selftest_outcome(ctx, res, "abc", "r.json")  # type: ignore[arg-type]
    assert err.value.message == 'kernel self-test failed (exit 1): {"ok":false,"decode":{"ok":false}}'
