"""Delta Lake as a weirflow system (``systems.<name>.factory: delta``), installed as `weirflow_delta`.

Each stream of the system is a Delta table at ``<systems.<name>.path>/<physical name>``, on a local disk or in
Azure Storage. Besides the admin, consumer and producer every system has, it offers a `TableWriter`
(`weirflow_delta.writer`): one atomic commit of a micro-batch's rows and the marks that make a replay
recognisable, kept as the table's own application transactions (docs/delta.md)."""
