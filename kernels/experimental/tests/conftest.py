"""The experiments' tests: the Triton interpreter (set before Triton is imported, as in
``kernels/tests/conftest.py``), ``kernels/experimental`` and ``kernels/tests`` on the import
path (the experiments are not an installed package; their tests reuse the shipped tests'
oracles), and the same fresh-seed generator fixture."""

from __future__ import annotations

import os
import secrets
import sys
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "1"
# Appended, not prepended: kernels/experimental holds a folder named ``tests`` too, and ahead of the
# repository root it would capture the ``tests`` namespace package (``tests.conftest`` and friends)
# for every test module collected after this one.
sys.path.append(str(Path(__file__).resolve().parents[1]))
sys.path.append(str(Path(__file__).resolve().parents[2] / "tests"))

import pytest
import torch


@pytest.fixture
def gen(request: pytest.FixtureRequest) -> torch.Generator:
    seed = secrets.randbits(32)
    request.node.user_properties.append(("seed", seed))
    print(f"seed={seed}")
    return torch.Generator().manual_seed(seed)
