"""The host's kernel measurement file (``<install_root>/kernels-qualification.json``): pure.

``dsv4ctl qualify kernels`` runs ``python -m dsv4_kernels.qualify`` in the engine's environment on
the host's GPU (the same module runs on a development GPU), which checks every contender of each
hooked op against the reference and times it; the result is one
:class:`~orchestrator.facts.KernelQualification` per role. It is kept on the host like
``calibration.json`` and read back as a fact (``remote.probes``), so a plan stays a pure function
of the profile and the facts: ``plan --live`` decides each op's path from it
(:mod:`orchestrator.kernel_paths`), it enters the facts' fingerprint (a plan made before a new
measurement is stale), and a plan from declared facts knows none.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from orchestrator.errors import DsvError
from orchestrator.facts import KernelQualification

QUALIFICATION_FILE = "kernels-qualification.json"
QUALIFICATION_FORMAT = 1
_RESET = "reset it with `dsv4ctl qualify kernels --host HOST --reset`"


class QualificationFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    format: int = QUALIFICATION_FORMAT
    measurements: list[KernelQualification] = Field(default_factory=list)


def merge(existing: Iterable[KernelQualification], new: Iterable[KernelQualification]
          ) -> list[KernelQualification]:
    """The newest measurement per role, sorted by role (deterministic)."""
    latest: dict[str, KernelQualification] = {}
    for m in [*existing, *new]:
        if m.role not in latest or m.measured_at >= latest[m.role].measured_at:
            latest[m.role] = m
    return [latest[k] for k in sorted(latest)]


def render_file(measurements: Iterable[KernelQualification]) -> str:
    doc = QualificationFile(measurements=list(measurements))
    return json.dumps(doc.model_dump(mode="json"), indent=2, sort_keys=True) + "\n"


def parse_measurement(text: str, *, where: str) -> KernelQualification:
    """One measurement as the runner prints it (or a file holding one)."""
    from orchestrator.host_data import HostDataError, bounded_json

    try:
        return KernelQualification.model_validate(bounded_json(text, where))
    except HostDataError as exc:
        raise DsvError(exc.message, fix="re-run `dsv4ctl qualify kernels`") from None
    except ValidationError as exc:
        err = exc.errors()[0]
        raise DsvError(f"{where} is not a kernel measurement: {'.'.join(map(str, err['loc']))}: "
                       f"{err['msg']}", fix="pass the JSON `python -m dsv4_kernels.qualify` "
                                            "printed, unchanged") from None


def parse_file(text: str, *, where: str) -> list[KernelQualification]:
    if not text.strip():
        return []
    from orchestrator.host_data import HostDataError, bounded_json

    try:  # host data: bounded, finite, then the model
        doc = QualificationFile.model_validate(bounded_json(text, where))
    except HostDataError as exc:
        raise DsvError(exc.message, fix=f"{_RESET} (removes {where})") from None
    except ValidationError as exc:
        raise DsvError(f"{where} is not a dsv4ctl kernel measurement file: "
                       f"{exc.errors()[0]['msg']}", fix=f"{_RESET} (removes {where})") from None
    if doc.format != QUALIFICATION_FORMAT:
        raise DsvError(f"{where} has format {doc.format}, this dsv4ctl reads "
                       f"{QUALIFICATION_FORMAT}", fix=_RESET)
    return merge([], doc.measurements)
