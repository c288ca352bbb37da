"""Where dsv4ctl finds its bundled data: profiles, templates and playbooks.

In a source checkout (editable install) they sit at the top of the repository; a wheel carries copies
inside the package (``orchestrator/_data/``, see pyproject's force-include). Everything that reads them
goes through :func:`data_dir`, so ``pip install .`` and a checkout behave the same.
"""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


def data_dir(name: str) -> Path:
    """The bundled directory ``name`` (``profiles``, ``templates`` or ``playbooks``)."""
    installed = _PACKAGE / "_data" / name
    if installed.is_dir():
        return installed
    checkout = _PACKAGE.parent / name
    if checkout.is_dir():
        return checkout
    raise FileNotFoundError(
        f"dsv4ctl's bundled '{name}' directory is missing (looked in {installed} and {checkout}); "
        "reinstall dsv4ctl"
    )


def default_profile() -> Path:
    return data_dir("profiles") / "default.yaml"
