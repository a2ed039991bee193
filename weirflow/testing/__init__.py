"""The contract suite every weirflow backend passes, for anyone's backend: `weirflow.testing`.

A backend (a coordinator, checkpoint manager, metadata store or system, ours or a third party's) proves it
behaves like the built-in ones by running these pytest classes against itself::

    import pytest
    from weirflow.testing import FactoryBackend
    from weirflow.testing.contracts import CheckpointManagerContract

    @pytest.fixture
    def weirflow_backend(tmp_path):
        return FactoryBackend({"job.state.dir": str(tmp_path)}, checkpoints=MyCheckpointManagerFactory())

    class TestMyCheckpoints(CheckpointManagerContract):
        pass

The hook is the ``weirflow_backend`` fixture (in a conftest, the test module, or the class): it returns a
`Backend`, whose methods build the objects under test. docs/testing-backends.md has the whole guide.

Test suites wait with `wait_until` (``from weirflow.testing import wait_until``), which polls a condition
instead of sleeping. Its one implementation is in `weirflow.base.waiting`, where the demo and the benchmarks,
which run without pytest, import it from.

This package imports pytest and is imported only by test suites: nothing else in weirflow imports it.
"""

import pytest

# Before the contracts are imported, so that their asserts explain failures as a test module's do.
pytest.register_assert_rewrite("weirflow.testing.contracts")

from weirflow.base.waiting import wait_until  # noqa: E402
from weirflow.testing.backend import Backend, FactoryBackend, SystemClients  # noqa: E402
from weirflow.testing.contracts import (  # noqa: E402
    CheckpointManagerContract,
    JobCoordinatorContract,
    LatchContract,
    LeaderElectorContract,
    LockContract,
    MetadataStoreContract,
    ProcessorRegistryContract,
    SparkStateStoreContract,
    SystemContract,
    SystemUnderTest,
)

__all__ = [
    "Backend",
    "CheckpointManagerContract",
    "FactoryBackend",
    "JobCoordinatorContract",
    "LatchContract",
    "LeaderElectorContract",
    "LockContract",
    "MetadataStoreContract",
    "ProcessorRegistryContract",
    "SparkStateStoreContract",
    "SystemClients",
    "SystemContract",
    "SystemUnderTest",
    "wait_until",
]
