"""Host fixtures library for integration tests: fake target hosts with real sshd and systemd.

Owns the public names tests use; the implementation and the full API description live in
`tests.harness.hosts`.
"""

from tests.harness.hosts import (
    BRIDGE,
    DEFAULT_PRIVATE_PATHS,
    ENGINE_ENV,
    FakeHost,
    HarnessError,
    HostCluster,
    check_prerequisites,
)

__all__ = [
    "BRIDGE",
    "DEFAULT_PRIVATE_PATHS",
    "ENGINE_ENV",
    "FakeHost",
    "HarnessError",
    "HostCluster",
    "check_prerequisites",
]
