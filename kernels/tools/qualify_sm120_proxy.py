"""``dsv4_kernels.qualify`` on an H200 standing in for sm_120 (the proxy of sm120_proxy.py).

``python kernels/tools/qualify_sm120_proxy.py --shape JSON --role R --host NAME``: sets
``TRITON_OVERRIDE_ARCH=sm89`` before Triton loads (every Triton kernel of the process lowers through
the pre-Hopper ``mma.sync`` path, as on sm_120) and makes the bundled decode's dispatcher see
sm_120's 101,376 B of shared memory per block and capability 12.0, then runs the qualify runner
unchanged. FlashInfer's sm_120 kernel stays unavailable (the runner asks the real device). The
proxy ranks variants; it does not predict the card. Not part of the package.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("TRITON_OVERRIDE_ARCH", "sm89")

SM120_SMEM = 101376


def main() -> int:
    from dsv4_kernels import qualify
    from dsv4_kernels import sparse_decode as sd

    sd.device_max_shared = lambda t: SM120_SMEM  # type: ignore[assignment]
    sd.device_arch = lambda t: 120  # type: ignore[assignment]
    return qualify.main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
