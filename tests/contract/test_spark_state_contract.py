"""Spark-state-store contract (`weirflow.testing.contracts.spark_state`) on each backend: the local disk
(which keeps no copies) and Blob Storage."""

from weirflow.testing import SparkStateStoreContract


class TestSparkStateStore(SparkStateStoreContract):
    pass
