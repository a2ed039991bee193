"""LeaderElector contract (`weirflow.testing.contracts.leader_elector`) on each backend."""

from weirflow.testing import LeaderElectorContract


class TestLeaderElector(LeaderElectorContract):
    pass
