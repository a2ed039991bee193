"""Kinesis as a weirflow system (``systems.<name>.factory: kinesis``), installed as `weirflow_kinesis`.

Tasks are a fixed number of virtual tasks over the MD5 hash space of partition keys, so splitting and merging
shards never moves a task's state (docs/kinesis.md)."""
