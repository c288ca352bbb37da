"""The launch scripts' secret shim (orchestrator/render/secrets.py) against the REAL entry points:
``sglang.cli.main:main`` (what ``bin/sglang`` runs) and ``sglang_router.launch_router:main`` parse
the secret flag the shim appends in-process, with the value read from the environment, while the
process's own command line carries only the variable's name. Needs requirements/parsers.txt."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from orchestrator.render.secrets import ENGINE_ENTRY, ROUTER_ENTRY, SHIM

KEY = "sk-shim-CANARY-9d1f"

# Replaces the function that would start a server with one that reports what was parsed.
_SITE = '''
import sys
if {module!r} in sys.argv:
    import {patch_module} as m
    def fake(*args):
        {report}
    m.{patch_name} = fake
'''


def _run(tmp_path: Path, entry: tuple[str, str], site: str, argv: list[str]) -> str:
    (tmp_path / "sitecustomize.py").write_text(site)
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "DSV4_SECRET_API_KEY": KEY}
    res = subprocess.run([sys.executable, "-c", SHIM, *entry, "1", "--api-key",
                          "DSV4_SECRET_API_KEY", *argv], env=env, capture_output=True, text=True,
                         timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    assert KEY not in res.stderr  # what the process logs has the value redacted
    return res.stdout + res.stderr


def test_sglang_serve_gets_the_key(tmp_path: Path) -> None:
    report = ("from sglang.srt.server_args import prepare_server_args\n"
              "        sa = prepare_server_args(list(args[1]))\n"
              "        cmd = open('/proc/self/cmdline', 'rb').read().decode()\n"
              "        print('KEY', sa.api_key, sa.port, 'LEAK' if sa.api_key in cmd else 'CLEAN')\n"
              "        import logging\n"
              # engine.py's _server_args_for_logging, without importing engine.py (uvloop, ...)
              "        from sglang.srt.sampling.watermarking.core import redact_watermark_secrets\n"
              "        logging.basicConfig()\n"
              "        logging.getLogger('sglang').warning("
              "f'server_args={redact_watermark_secrets(sa.resolved_dict())}')")
    site = _SITE.format(module=ENGINE_ENTRY[0], patch_module="sglang.cli.serve",
                        patch_name="serve", report=report)
    out = _run(tmp_path, ENGINE_ENTRY, site, ["serve", "--model-path", str(tmp_path),
                                              "--port", "30123"])
    assert f"KEY {KEY} 30123 CLEAN" in out
    # SGLang's own startup line (engine.py:311) would carry the key; the shim redacts it
    assert "server_args=" in out and "'api_key': '<redacted>'" in out


def test_router_gets_the_key(tmp_path: Path) -> None:
    report = ("cmd = open('/proc/self/cmdline', 'rb').read().decode()\n"
              "        print('KEY', args[0].api_key, 'LEAK' if args[0].api_key in cmd else 'CLEAN')")
    site = _SITE.format(module=ROUTER_ENTRY[0], patch_module="sglang_router.launch_router",
                        patch_name="launch_router", report=report)
    out = _run(tmp_path, ROUTER_ENTRY, site, ["--pd-disaggregation", "--prefill",
                                              "http://127.0.0.1:30001", "8998", "--decode",
                                              "http://127.0.0.1:30002", "--port", "8123"])
    assert f"KEY {KEY} CLEAN" in out
