"""Spark's Python worker daemon for weirflow processors (`spark.python.daemon.module`).

Spark starts Python workers by forking them from a daemon process (`pyspark.daemon`). This module is that
daemon with two changes, made once before any worker is forked:

* the modules every weirflow worker needs (PySpark's worker and data source reader, pyarrow, pandas, the
  weirflow source and sink) are imported here, so a new worker starts with them instead of importing them;
* the garbage collector's view of all those objects is frozen (`gc.freeze`), so that the full collection
  PySpark runs after every task does not walk them (see `weirflow.spark.workergc`, which keeps it so).

Everything else is PySpark's own daemon (`pyspark.daemon.manager`).

Spark also runs PySpark's daemon, with a module name as argument, for the driver-side processes that look up,
create and plan Python data sources' reads and writes (``pyspark.sql.worker.*``): PySpark imports that module in
each forked process, after the fork, so every one paid for pyarrow and pandas again (1 to 2 s of CPU at each
query start). weirflow's launcher (`weirflow.spark.session.worker_python`) starts those daemons from this module
too, which imports the named module before forking.
"""

from __future__ import annotations

import gc
import importlib
import sys

import pandas  # noqa: F401  (PySpark's data source reader imports it in every new worker otherwise)
import pyarrow.compute
import pyarrow.json  # noqa: F401
import pyspark.daemon
import pyspark.sql.pandas.types
import pyspark.sql.worker.plan_data_source_read
import pyspark.worker

import weirflow.spark.sink
import weirflow.spark.source  # noqa: F401

if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1].startswith("pyspark.sql.worker."):
        importlib.import_module(sys.argv[1])  # what `pyspark.daemon.worker` imports after each fork otherwise
    gc.freeze()
    pyspark.daemon.manager()
