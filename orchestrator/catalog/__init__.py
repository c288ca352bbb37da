"""Knowledge catalog of dsv4ctl: GPUs, quant formats, model variants and per-engine-version rules.

The catalog is data (YAML under ``orchestrator/catalog/data/``) with a source on every number,
loaded into pydantic models. It sits on the ``dsv4ctl plan`` path, so it imports only the
standard library, pydantic and PyYAML. (Work in progress: the API lands in the next commits.)
"""

from __future__ import annotations

__all__: list[str] = []
