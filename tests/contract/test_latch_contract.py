"""Latch contract (`weirflow.testing.contracts.latch`) on each backend."""

from weirflow.testing import LatchContract


class TestLatch(LatchContract):
    pass
