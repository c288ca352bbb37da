#!/usr/bin/env bash
# Run every check CI runs: lint, then the whole pytest suite (unit, golden, real parsers, kernels under
# the Triton interpreter, integration against real sshd + systemd --user in network namespaces).
#
# The suite runs on pytest-xdist workers, one per core and at most 4 (DSV4_TEST_WORKERS=N overrides;
# 0 runs it in this one process). Most of the integration tests' time is waiting on real processes
# (sshd, systemd, the engine simulator), so two files at once take little more than one; each worker
# brings up its own fake hosts in a harness slot of its own (tests/harness/hosts.py).
#   --dist loadfile          a test file runs whole, in its order, on one worker, as in a plain run
#                            (module state and fixtures, the session hosts it leaves as it found them)
#   --no-loadscope-reorder   files are handed out in collection order, not by test count: the long
#                            integration files (tests/integration sorts first) start at once, and the
#                            CPU-bound kernel tests (kernels/, last) run after them, so they do not
#                            starve the integration tests' health and SSH timeouts
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/ruff check .
cores=$(nproc 2>/dev/null || echo 2)
workers=${DSV4_TEST_WORKERS:-$(( cores < 4 ? cores : 4 ))}
exec .venv/bin/python -m pytest -n "$workers" --dist loadfile --no-loadscope-reorder "$@"
