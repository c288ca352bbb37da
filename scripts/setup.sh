#!/usr/bin/env bash
# Set up dsv4ctl's environment in ./.venv.
#   scripts/setup.sh base   the tool itself (enough for `dsv4ctl plan`)
#   scripts/setup.sh full   plus everything the test suite needs: Debian packages (sshd, iproute2,
#                           promtool, ...), CPU torch + Triton for the kernel tests, the real SGLang 0.5.23
#                           and sglang-router 0.3.2 argument parsers.
# Idempotent: re-running skips what is already there.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-base}
py=${PYTHON:-python3}

log() { printf '[setup] %s\n' "$*" >&2; }

if [ ! -x .venv/bin/python ]; then
  log "creating .venv with $($py --version)"
  "$py" -m venv .venv
fi
pip=(.venv/bin/python -m pip -q --disable-pip-version-check)

if ! .venv/bin/python -c 'import orchestrator, pydantic, fabric, aiohttp' 2>/dev/null; then
  log "installing dsv4ctl (editable) with the dev extra"
  "${pip[@]}" install -e '.[dev]'
fi
[ "$mode" = base ] && exit 0

# --- Debian packages the tests use (real sshd, network namespaces, systemd, promtool) ---
apt_pkgs=$(cat requirements/apt*.txt 2>/dev/null | sed 's/#.*//' | tr -s ' \n' ' ')
missing=()
for p in $apt_pkgs; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then
    log "missing Debian packages: ${missing[*]} (run as root or install them first)"; exit 1
  fi
  log "apt-get install ${missing[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# --- Python packages for the tests ---
# requirements/parsers.txt is a complete pinned closure (CPU torch from the local wheel, the real
# SGLang 0.5.23 and sglang-router 0.3.2, what their parsers import): installed with --no-deps because
# sglang's metadata would otherwise pull a multi-GB CUDA stack that a CPU machine neither needs nor runs.
if ! .venv/bin/python -c 'import torch, sglang, sglang_router' 2>/dev/null; then
  log "installing CPU torch and the real SGLang/router parsers (requirements/parsers.txt)"
  "${pip[@]}" install --no-deps -r requirements/parsers.txt
fi
for req in requirements/test.txt requirements/probes.txt requirements/kernels.txt; do
  [ -f "$req" ] && "${pip[@]}" install -r "$req"
done
if [ -f kernels/pyproject.toml ] && ! .venv/bin/python -c 'import dsv4_kernels' 2>/dev/null; then
  log "installing the bundled kernels package (editable)"
  "${pip[@]}" install --no-deps -e kernels/
fi
log "ready"
