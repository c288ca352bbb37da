"""Calibration: what the engine really did, read from its own reports, kept as a fact of the host.

Owns three things, all pure: reading SGLang 0.5.23's reports of the KV pool it allocated (the
scheduler's startup log line and ``/server_info``), the host-side calibration file
(``<install_root>/calibration.json``: the last :class:`PoolMeasurement` per role, engine version
and model variant, or a reset), and picking the measurement that applies to a role being planned.

Why a host-side file read back as a fact: a plan must depend only on the profile and the facts
(byte-identical plans). A measurement is a fact about the host, like its free disk: ``plan --live``
and ``apply`` probe it with the other facts (``remote.probes``), it enters the facts' fingerprint
(so a saved plan made before a new measurement is refused as stale), and a plan from declared facts
(no host) is uncalibrated and says nothing about it.

The SGLang 0.5.23 sources of what is parsed:

- ``srt/managers/scheduler.py`` L1264-1276, logged once by TP rank 0 after the pools exist::

      max_total_num_tokens=..., chunked_prefill_size=..., max_prefill_tokens=...,
      max_running_requests=..., context_len=..., available_gpu_mem=XX.XX GB

  (``available_cpu_mem`` on CPU), behind the logger's ``[time TP0]`` prefix.
- ``/server_info`` (``srt/entrypoints/http_server.py`` L863-892, ``utils/common.py::
  build_server_info`` L3584-3593): the resolved server args (``mem_fraction_static``,
  ``chunked_prefill_size``, ...), the scheduler's init info (``max_total_num_tokens``,
  ``max_req_input_len``; ``scheduler.py::get_init_info`` L1941-1950) and ``version``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from orchestrator.errors import DsvError
from orchestrator.facts import PoolMeasurement

CALIBRATION_FILE = "calibration.json"
CALIBRATION_FORMAT = 1

#: The live pool may differ this much from the plan before ``dsv4ctl status`` calls it drift.
POOL_DRIFT_THRESHOLD = 0.05

# Numbers bounded in digits (issue 31: a log line is host data, and max_total_num_tokens=10**5000
# was a traceback): a line with a longer number is not SGLang's and is not read.
_SCHED_RE = re.compile(
    r"max_total_num_tokens=(?P<max_total_num_tokens>\d{1,13}), "
    r"chunked_prefill_size=(?P<chunked_prefill_size>-?\d{1,13}|None), "
    r"max_prefill_tokens=(?P<max_prefill_tokens>\d{1,13}|None), "
    r"max_running_requests=(?P<max_running_requests>\d{1,13}|None), "
    r"context_len=(?P<context_len>\d{1,13}|None), "
    r"available_(?:gpu|cpu)_mem=(?P<available_mem_gb>[0-9]{1,9}(?:\.[0-9]{1,9})?) GB")


class SchedulerLine(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    max_total_num_tokens: int
    chunked_prefill_size: int | None
    max_prefill_tokens: int | None
    max_running_requests: int | None
    context_len: int | None
    available_gpu_mem_gib: float  # SGLang's "GB" are GiB: get_available_gpu_memory / (1 << 30)


def _int(v: str) -> int | None:
    return None if v == "None" else int(v)


def parse_scheduler_lines(text: str) -> list[SchedulerLine]:
    """Every scheduler startup line in an engine log, oldest first (a log appends restarts)."""
    out = []
    for m in _SCHED_RE.finditer(text):
        out.append(SchedulerLine(
            max_total_num_tokens=int(m["max_total_num_tokens"]),
            chunked_prefill_size=_int(m["chunked_prefill_size"]),
            max_prefill_tokens=_int(m["max_prefill_tokens"]),
            max_running_requests=_int(m["max_running_requests"]),
            context_len=_int(m["context_len"]),
            available_gpu_mem_gib=float(m["available_mem_gb"])))
    return out


def last_scheduler_line(text: str, *, where: str) -> SchedulerLine:
    lines = parse_scheduler_lines(text)
    if not lines:
        raise DsvError(
            f"{where}: no SGLang scheduler startup line found (the line SGLang 0.5.23 logs as "
            "'max_total_num_tokens=N, chunked_prefill_size=C, max_prefill_tokens=P, "
            "max_running_requests=R, context_len=L, available_gpu_mem=X.XX GB')",
            fix="pass the log of an engine that finished starting (the line comes after the KV "
                "pool is allocated; journalctl -u UNIT or the role's log file)")
    return lines[-1]


def server_info_pool(info: Any) -> tuple[int | None, str | None]:
    """(max_total_num_tokens, version) from a ``/server_info`` answer; None where absent."""
    if not isinstance(info, dict):
        return None, None
    tokens = info.get("max_total_num_tokens")
    version = info.get("version")
    return (tokens if isinstance(tokens, int) and 0 < tokens <= 1 << 40 else None,
            version if isinstance(version, str) else None)


# --- the host-side file ---------------------------------------------------------------------------


class CalibrationFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    format: int = CALIBRATION_FORMAT
    measurements: list[PoolMeasurement] = Field(default_factory=list)


def _key(m: PoolMeasurement) -> tuple[str, str, str]:
    return (m.role, m.engine_version, m.model_variant)


def merge(existing: Iterable[PoolMeasurement], new: Iterable[PoolMeasurement]
          ) -> list[PoolMeasurement]:
    """The last measurement per (role, engine version, model variant), sorted (deterministic)."""
    latest: dict[tuple[str, str, str], PoolMeasurement] = {}
    for m in [*existing, *new]:
        if _key(m) not in latest or m.measured_at >= latest[_key(m)].measured_at:
            latest[_key(m)] = m
    return [latest[k] for k in sorted(latest)]


def render_file(measurements: Iterable[PoolMeasurement]) -> str:
    doc = CalibrationFile(measurements=list(measurements))
    return json.dumps(doc.model_dump(mode="json"), indent=2, sort_keys=True) + "\n"


def parse_file(text: str, *, where: str) -> list[PoolMeasurement]:
    if not text.strip():
        return []
    from orchestrator.host_data import HostDataError, bounded_json

    try:  # host data (issue 31): bounded, finite, then the model
        doc = CalibrationFile.model_validate(bounded_json(text, where))
    except HostDataError as exc:
        raise DsvError(exc.message, fix=f"reset it with `dsv4ctl calibrate --host HOST --reset` "
                                        f"(removes {where})") from None
    except ValidationError as exc:
        raise DsvError(f"{where} is not a dsv4ctl calibration file: {exc.errors()[0]['msg']}",
                       fix=f"reset it with `dsv4ctl calibrate --host HOST --reset` (removes {where})"
                       ) from None
    if doc.format != CALIBRATION_FORMAT:
        raise DsvError(f"{where} has format {doc.format}, this dsv4ctl reads {CALIBRATION_FORMAT}",
                       fix="reset it with `dsv4ctl calibrate --host HOST --reset`")
    return merge([], doc.measurements)


def lookup(measurements: Iterable[PoolMeasurement], role: str, engine_version: str,
           model_variant: str) -> PoolMeasurement | None:
    """The host's last measurement for this role, engine version and model, if any."""
    found = [m for m in measurements if _key(m) == (role, engine_version, model_variant)]
    return max(found, key=lambda m: m.measured_at) if found else None


def drift(live_tokens: int, planned_tokens: int) -> float:
    """Relative difference of the live pool to the plan's (negative: smaller)."""
    return (live_tokens - planned_tokens) / planned_tokens if planned_tokens else 0.0
