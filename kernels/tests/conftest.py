"""Test setup for dsv4_kernels: every kernel test runs under the Triton CPU interpreter.

``TRITON_INTERPRET`` must be set before Triton is imported (Triton docs, debugging chapter), so
it is set here, at collection time, before any test module imports the package. Inputs are
drawn fresh per test from an unseeded generator; the seed is printed on failure.
"""

from __future__ import annotations

import os
import secrets

os.environ["TRITON_INTERPRET"] = "1"

import pytest
import torch


@pytest.fixture
def gen(request: pytest.FixtureRequest) -> torch.Generator:
    """A fresh random generator per test; its seed is attached to the test report."""
    seed = secrets.randbits(32)
    request.node.user_properties.append(("seed", seed))
    print(f"seed={seed}")
    return torch.Generator().manual_seed(seed)
