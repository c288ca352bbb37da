"""Small runtime facts shared by the kernels: interpreter mode and device properties.

Under ``TRITON_INTERPRET=1`` (CPU tests) Triton runs programs on numpy, which has no bfloat16
arithmetic (Triton docs, programming-guide chapter-3 "debugging"), so the kernels take a
``DOT_F32`` constexpr that keeps their matrix products in float32 there.
"""

from __future__ import annotations

import functools
import os

import torch


def interpreting() -> bool:
    """True when Triton runs in its CPU interpreter."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@functools.cache
def num_sms(device_index: int) -> int:
    """Multiprocessor count of a CUDA device (a fixed 8 under the interpreter)."""
    if not torch.cuda.is_available():
        return 8
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def device_sms(t: torch.Tensor) -> int:
    """Multiprocessor count of the device holding ``t``."""
    if t.device.type != "cuda":
        return 8
    return num_sms(t.device.index if t.device.index is not None else torch.cuda.current_device())


@functools.cache
def _max_shared(device_index: int) -> int:
    props = torch.cuda.get_device_properties(device_index)
    optin = getattr(props, "shared_memory_per_block_optin", 0)
    if optin:
        return int(optin)
    # Older torch: 227 KB on sm_90/sm_100, 99 KB on sm_86/sm_89/sm_120 (CUDA guide, table 23).
    return 232448 if props.major in (9, 10) else 101376


def device_max_shared(t: torch.Tensor) -> int:
    """Opt-in shared memory per block of ``t``'s device (H200's 227 KB under the interpreter)."""
    if t.device.type != "cuda":
        return 232448
    index = t.device.index if t.device.index is not None else torch.cuda.current_device()
    return _max_shared(index)


def device_arch(t: torch.Tensor) -> int | None:
    """Compute capability of ``t``'s device as one number (90 for sm_90, 120 for sm_120);
    None off the GPU (CPU tensors, the interpreter)."""
    if t.device.type != "cuda" or interpreting():
        return None
    major, minor = torch.cuda.get_device_capability(t.device)
    return major * 10 + minor
