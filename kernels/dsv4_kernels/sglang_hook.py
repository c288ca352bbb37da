"""Activation in SGLang 0.5.23: route its sm_120 sparse-decode and MQA-logits paths to this package.

Mechanism (no SGLang file is edited): ``python -m dsv4_kernels.sglang_hook install`` writes
``dsv4_kernels_sglang.pth`` into the engine environment's site-packages. Python runs that line
at every interpreter start; it does nothing unless the rendered unit sets
``DSV4_KERNELS_SGLANG=1``. Then :func:`activate` checks that the installed SGLang is exactly
0.5.23 (the entry points below are pinned to it; any other version is refused with a message
on stderr and left untouched) and installs an import hook that, right after each target module
executes, checks the original function's parameter list and replaces it:

* ``sglang.kernels.ops.attention.flash_mla_sm120_triton.flash_mla_sparse_decode_triton``
  (reached when ``SGLANG_SM120_FLASHMLA_BACKEND=triton``; ``flash_mla_sm120`` imports it
  lazily at call time, so replacing the module attribute is enough);
* ``sglang.srt.layers.attention.dsv4.indexer.fp8_paged_mqa_logits_torch_sm120`` (reached on
  sm_120 with ``SGLANG_FP8_PAGED_MQA_LOGITS_TORCH=1`` *and* ``SGLANG_OPT_USE_TILELANG_INDEXER=0``:
  the indexer tests TileLang first, indexer.py L862-872, and SGLang's V4 model hook turns it on
  unless set, model_hook.py L495-502; dsv4ctl renders both; looked up as a module global per
  call);
* ``sglang.kernels.ops.layernorm.mhc.mhc_fused_post_pre`` (every mHC sublayer boundary on
  sm_120; ``deepseek_v4.get_mhc_ops`` imports it on first use) by ``sglang_mhc``, the bf16
  tensor-core mHC pre GEMM.

Which of the three ops are patched: ``DSV4_KERNELS_OPS`` (comma list of ``attention``,
``indexer``, ``mhc_pre``), which dsv4ctl renders per role from its decision of which path each op
runs (orchestrator/kernel_paths.py); an op not listed keeps SGLang's function. Unset (an env
file of a release made before per-op choices), the hook patches attention and indexer, and
mhc_pre only with ``DSV4_KERNELS_BF16_GEMMS=1``, as those releases expect.

This module imports neither torch nor triton until a target module is actually loaded, so the
``.pth`` line costs microseconds in every other Python process of that environment.
"""

from __future__ import annotations

import argparse
import importlib.abc
import importlib.machinery
import importlib.metadata
import inspect
import json
import os
import pathlib
import sys
import sysconfig
import types
from collections.abc import Sequence
from typing import Any

ENV_VAR = "DSV4_KERNELS_SGLANG"
OPS_ENV = "DSV4_KERNELS_OPS"
BF16_GEMMS_ENV = "DSV4_KERNELS_BF16_GEMMS"  # releases before OPS_ENV: mhc_pre on/off
SUPPORTED_VERSION = "0.5.23"
PTH_NAME = "dsv4_kernels_sglang.pth"
# the engine log line dsv4ctl status reads (orchestrator/apply/kernels_seen.py spells it too)
ACTIVE_LOG = "[dsv4_kernels] active"
PTH_LINE = (
    "import os; os.environ.get('DSV4_KERNELS_SGLANG', '0') not in ('', '0') and "
    "__import__('dsv4_kernels.sglang_hook').sglang_hook.activate()\n"
)

# module -> {function name: (replacement attribute in sglang_compat, pinned parameter names)}
TARGETS: dict[str, dict[str, str]] = {
    "sglang.kernels.ops.attention.flash_mla_sm120_triton": {
        "flash_mla_sparse_decode_triton": "flash_mla_sparse_decode_triton",
    },
    "sglang.srt.layers.attention.dsv4.indexer": {
        "fp8_paged_mqa_logits_torch_sm120": "fp8_paged_mqa_logits_sm120",
    },
    "sglang.kernels.ops.layernorm.mhc": {
        "mhc_fused_post_pre": "sglang_mhc.mhc_fused_post_pre",
    },
}
# the op (DSV4_KERNELS_OPS) each target module belongs to
OPS: dict[str, str] = {
    "sglang.kernels.ops.attention.flash_mla_sm120_triton": "attention",
    "sglang.srt.layers.attention.dsv4.indexer": "indexer",
    "sglang.kernels.ops.layernorm.mhc": "mhc_pre",
}

_state: dict[str, Any] = {"active": False, "patched": [], "refused": []}


def _log(msg: str) -> None:
    print(msg if msg.startswith(ACTIVE_LOG) else f"[dsv4_kernels] {msg}", file=sys.stderr,
          flush=True)


def sglang_version() -> str | None:
    """Installed SGLang version, or None when SGLang is not installed."""
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return None


def _pinned_params(replacement: str) -> tuple[str, ...]:
    from . import sglang_compat, sglang_mhc

    return {
        "flash_mla_sparse_decode_triton": sglang_compat.DECODE_PARAMS,
        "fp8_paged_mqa_logits_sm120": sglang_compat.LOGITS_PARAMS,
        "sglang_mhc.mhc_fused_post_pre": sglang_mhc.MHC_PARAMS,
    }[replacement]


def _replacement(name: str) -> Any:
    """``name`` in ``sglang_compat``, or ``module.attr`` in another module of this package."""
    import importlib

    mod, _, attr = name.rpartition(".")
    return getattr(importlib.import_module(f"{__package__}.{mod or 'sglang_compat'}"), attr)


def active_ops() -> frozenset[str]:
    """The ops this process patches (``DSV4_KERNELS_OPS``; unset: the pre-per-op behaviour)."""
    listed = os.environ.get(OPS_ENV)
    if listed is None:
        legacy = {"attention", "indexer"}
        if os.environ.get(BF16_GEMMS_ENV, "0") not in ("", "0"):
            legacy.add("mhc_pre")
        return frozenset(legacy)
    ops = {o.strip() for o in listed.split(",") if o.strip()}
    unknown = sorted(ops - set(OPS.values()))
    if unknown:
        _log(f"{OPS_ENV} names unknown ops {unknown}; known: {sorted(set(OPS.values()))}")
    return frozenset(ops & set(OPS.values()))


def _gated_off(module_name: str) -> bool:
    op = OPS.get(module_name)
    return op is not None and op not in active_ops()


def patch_module(module: types.ModuleType) -> list[str]:
    """Replace the pinned entry points of an already-executed SGLang module; return what changed.

    A function whose parameters differ from the pinned 0.5.23 list is left alone and reported.
    """
    done: list[str] = []
    if _gated_off(module.__name__):
        return done
    for fname, repl in TARGETS.get(module.__name__, {}).items():
        orig = getattr(module, fname, None)
        if orig is None:
            _state["refused"].append(f"{module.__name__}.{fname}: missing")
            _log(f"not patching {module.__name__}.{fname}: it does not exist in this SGLang")
            continue
        if getattr(orig, "__dsv4_kernels__", False):
            continue
        params = tuple(inspect.signature(orig).parameters)
        want = _pinned_params(repl)
        if params != want:
            _state["refused"].append(f"{module.__name__}.{fname}: signature {params}")
            _log(f"not patching {module.__name__}.{fname}: parameters {params} differ from the "
                 f"pinned SGLang {SUPPORTED_VERSION} list {want}")
            continue
        new = _replacement(repl)
        new.__dsv4_kernels__ = True
        new.__dsv4_original__ = orig
        setattr(module, fname, new)
        done.append(f"{module.__name__}.{fname}")
    _state["patched"].extend(done)
    return done


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, inner: importlib.abc.Loader) -> None:
        self.inner = inner

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return self.inner.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        self.inner.exec_module(module)
        patch_module(module)


class _Finder(importlib.abc.MetaPathFinder):
    """Wraps the normal loader of the target modules so they are patched right after import."""

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: types.ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in TARGETS:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and not isinstance(spec.loader, _PatchingLoader):
                    spec.loader = _PatchingLoader(spec.loader)
                return spec
        return None


def activate(force: bool = False) -> bool:
    """Install the patches if ``DSV4_KERNELS_SGLANG`` is set (or ``force``) and SGLang is 0.5.23."""
    if not force and os.environ.get(ENV_VAR, "0") in ("", "0"):
        return False
    if _state["active"]:
        return True
    version = sglang_version()
    if version != SUPPORTED_VERSION:
        _state["refused"].append(f"sglang version {version}")
        _log(f"{ENV_VAR} is set but the installed SGLang is {version!r}; these kernels are pinned "
             f"to SGLang {SUPPORTED_VERSION}'s entry points, so nothing is patched. Fix: install "
             f"sglang=={SUPPORTED_VERSION} or unset {ENV_VAR}.")
        return False
    sys.meta_path.insert(0, _Finder())
    _state["active"] = True
    # which kernels this engine runs: dsv4ctl ships them inside each release and the engine
    # imports them through `current`, so the resolved path names the release (issue 20 item 6)
    _log(f"{ACTIVE_LOG} (pid {os.getpid()}): kernels from {loaded_from()}")
    # on its own line: dsv4ctl reads the one above up to its end (apply/kernels_seen.py)
    _log(f"ops {','.join(sorted(active_ops())) or 'none'} (from {OPS_ENV})")
    for name in TARGETS:
        mod = sys.modules.get(name)
        if mod is not None:
            patch_module(mod)
    return True


def loaded_from() -> str:
    """The directory this package was imported from, symlinks (``current``) resolved."""
    return str(pathlib.Path(__file__).resolve().parent.parent)


def status() -> dict[str, Any]:
    """What the hook did in this process."""
    return {"env": os.environ.get(ENV_VAR), "ops": sorted(active_ops()), "sglang": sglang_version(),
            "supported": SUPPORTED_VERSION, "loaded_from": loaded_from(), **_state}


def _site_dir(explicit: str | None) -> pathlib.Path:
    return pathlib.Path(explicit or sysconfig.get_paths()["purelib"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Install or remove the SGLang 0.5.23 .pth hook.")
    ap.add_argument("action", choices=["install", "uninstall", "status"])
    ap.add_argument("--site", help="site-packages directory (default: this interpreter's)")
    args = ap.parse_args(argv)
    pth = _site_dir(args.site) / PTH_NAME
    if args.action == "install":
        version = sglang_version()
        if version != SUPPORTED_VERSION:
            err = f"sglang {version!r} installed; the hook is pinned to {SUPPORTED_VERSION}"
            print(json.dumps({"ok": False, "error": err, "fix": "install the pinned SGLang"}))
            return 1
        pth.write_text(PTH_LINE)
        print(json.dumps({"ok": True, "installed": str(pth), "enable_with": f"{ENV_VAR}=1"}))
        return 0
    if args.action == "uninstall":
        existed = pth.exists()
        pth.unlink(missing_ok=True)
        print(json.dumps({"ok": True, "removed": str(pth) if existed else None}))
        return 0
    print(json.dumps({"pth": str(pth), "pth_installed": pth.exists(), **status()}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
