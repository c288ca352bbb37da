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
