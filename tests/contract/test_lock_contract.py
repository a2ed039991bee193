"""Lock contract (`weirflow.testing.contracts.lock`) on each backend."""

from weirflow.testing import LockContract


class TestLock(LockContract):
    pass
