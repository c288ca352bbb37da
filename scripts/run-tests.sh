#!/usr/bin/env bash
# Run every check CI runs: lint, then the whole pytest suite (unit, golden, real parsers, kernels under
# the Triton interpreter, integration against real sshd + systemd --user in network namespaces).
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/ruff check .
exec .venv/bin/python -m pytest "$@"
