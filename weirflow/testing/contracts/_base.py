"""Fixtures every contract class shares, all built from the user's ``weirflow_backend`` fixture.

They are methods of the contract classes (not a plugin's fixtures), so a test module that subclasses a
contract needs nothing but ``weirflow_backend``; and a user's own fixtures of the same names elsewhere are
left alone.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator

import pytest

from weirflow.interfaces.coordination import CoordinationUtils
from weirflow.testing.backend import Backend

# Cross-process contracts hold leases this long at least, so that a lease never expires under a holder
# that a loaded machine merely paused (they test exclusion, not expiry).
PROCESS_LEASE_MS = 5000


def new_job_name() -> str:
    """A job name no other test (nor an earlier run against the same real service) uses."""
    return f"contract-{uuid.uuid4().hex[:10]}"


def require_processes(backend: Backend) -> None:
    if not backend.processes:
        pytest.skip(f"{type(backend).__name__}.processes is False: its state cannot be shared with a process")


class Contract:
    """Base of the contract classes: ``job_name`` is a fresh job per test."""

    @pytest.fixture
    def job_name(self) -> str:
        return new_job_name()


class CoordinationContract(Contract):
    """``coordination(owner)`` -> the primitives of the test's job for ``owner`` (several owners share the
    job, as processors do); ``lease_ms`` the backend's lease. Everything opened is closed after the test."""

    @pytest.fixture
    def lease_ms(self, weirflow_backend: Backend) -> int:
        return weirflow_backend.lease_ms

    @pytest.fixture
    def coordination(
        self, weirflow_backend: Backend, job_name: str, lease_ms: int
    ) -> Iterator[Callable[..., CoordinationUtils]]:
        """``coordination(owner, instance="")``: the primitives of the test's job for that holder."""
        opened: list[CoordinationUtils] = []

        def make(owner: str, instance: str = "") -> CoordinationUtils:
            utils = weirflow_backend.coordination(job_name, owner, lease_ms, instance)
            opened.append(utils)
            return utils

        yield make
        for utils in opened:
            utils.close()
