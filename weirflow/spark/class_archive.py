"""A class-data-sharing archive of the classes a Spark session loads, so a processor's JVM maps them instead of
parsing and verifying some 20,000 classes again at every start.

Measured on the 2-core machine (docs/pipelines.md, "Performance"): a Spark session took 9.3 s to start and its
first small job 5.9 s with the JVM's defaults; with the archive 4.4 s and 2.2 s. Start-up is what a user feels
at `weirflow run`, at every restart after a failure, and when a new processor joins a running job.

The archive is a dynamic CDS archive (Java 13+): one run of a small Spark workload with
``-XX:ArchiveClassesAtExit`` writes it, and every later JVM started with ``-XX:SharedArchiveFile`` uses it. It
belongs to one Java runtime and one PySpark install (the jars' paths are part of it), so its name is a hash of
both and another runtime simply does not find it. A JVM that cannot use an archive (another JVM build, a moved
jar) says so in one warning line and starts as if there were none: the archive is never needed for correctness.

`weirflow spark-archive` dumps it (``make run``, ``make test`` and the Docker image do, at install time); a
processor uses it when `task.spark.class.archive` is ``auto`` (the default) and it exists, and logs how to make it
when it does not.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

from weirflow.base.errors import StartupError
from weirflow.spark.java import check_java, java_version_text

log = logging.getLogger("weirflow.spark")

SUBMIT_ARGS = "PYSPARK_SUBMIT_ARGS"

# What the archive is dumped from: a session that plans and runs a shuffle and a stateful streaming query with a
# watermark writing through foreachBatch, which between them load the classes a processor's queries load.
_WORKLOAD = """
import json, os, sys, tempfile
from weirflow.spark.session import prepare_environment
prepare_environment()
from pyspark.sql import SparkSession, functions as F
spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
         .config("spark.sql.shuffle.partitions", "1").getOrCreate())
spark.range(1000).selectExpr("id % 7 AS k").groupBy("k").count().collect()
work = tempfile.mkdtemp(prefix="weirflow-cds-")
os.makedirs(os.path.join(work, "in"))
with open(os.path.join(work, "in", "0.json"), "w") as out:
    for i in range(1000):
        out.write(json.dumps({"k": i % 7, "ts": 1700000000 + i}) + "\\n")
events = (spark.readStream.schema("k LONG, ts LONG").json(os.path.join(work, "in"))
          .withColumn("t", F.col("ts").cast("timestamp")).withWatermark("t", "1 second"))
counts = events.groupBy(F.window("t", "1 minute"), "k").count()
query = (counts.writeStream.outputMode("append").trigger(availableNow=True)
         .option("checkpointLocation", os.path.join(work, "cp"))
         .foreachBatch(lambda frame, _batch: frame.collect()).start())
query.awaitTermination()
gateway = spark.sparkContext._gateway
spark.stop()
gateway.shutdown()
gateway.proc.stdin.close()  # the JVM exits on EOF and writes the archive on its way out: wait for it
gateway.proc.wait()
"""


def _folders() -> list[Path]:
    """Where archives live, most preferred first: beside the installation (a virtual environment or an image's
    prefix, where the PySpark it belongs to is), else the user's cache directory."""
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return [Path(sys.prefix) / "spark-cds", Path(cache) / "weirflow" / "spark-cds"]


def archive_name() -> str:
    """The archive's file name for this Java runtime and PySpark install."""
    import pyspark

    java = java_version_text(check_java())
    key = hashlib.sha256(f"{java}\0{pyspark.__version__}\0{Path(pyspark.__file__).parent}".encode()).hexdigest()
    return f"{key[:16]}.jsa"


def find_archive() -> Path | None:
    """The archive of this Java runtime and PySpark install, if one was dumped."""
    name = archive_name()
    for folder in _folders():
        if (folder / name).is_file():
            return folder / name
    return None


def java_options(setting: str) -> str:
    """The JVM option that maps the archive, for `task.spark.class.archive` = ``setting``: ``auto`` uses the
    dumped archive when there is one, ``off`` none, anything else is the path of an archive to use."""
    if setting == "off":
        return ""
    if setting != "auto":
        return f"-XX:SharedArchiveFile={setting}"
    try:
        archive = find_archive()
    except Exception as exc:  # no Java (reported by the session), an unreadable folder: start without it
        log.debug("no Spark class archive: %s", exc)
        return ""
    if archive is None:
        log.info(
            "no class-data-sharing archive of Spark's classes for this Java and PySpark: Spark starts in about "
            "twice the time. `weirflow spark-archive` makes one (once, about half a minute)"
        )
        return ""
    return f"-XX:SharedArchiveFile={archive}"


def dump(java_options: str = "", timeout_s: float = 600) -> Path:
    """Run the workload above in a JVM that writes the archive at exit, and move it into place; returns its path.
    ``java_options`` are the JVM options the processors run with (the archive records some of them). Raises
    `StartupError` with Spark's output when the dump fails."""
    name = archive_name()
    errors: list[str] = []
    for folder in _folders():
        try:
            folder.mkdir(parents=True, exist_ok=True)
            partial = Path(tempfile.mkstemp(prefix=f".{name}.", suffix=".partial", dir=folder)[1])
        except OSError as exc:
            errors.append(f"{folder}: {exc}")
            continue
        partial.unlink()  # the JVM creates it; only the name was wanted
        options = f"{java_options} -XX:ArchiveClassesAtExit={partial}".strip()
        env = {**os.environ, SUBMIT_ARGS: f"--driver-java-options {shlex.quote(options)} pyspark-shell"}
        done = subprocess.run(
            [sys.executable, "-c", _WORKLOAD],
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
        if done.returncode != 0 or not partial.is_file():
            partial.unlink(missing_ok=True)
            why = done.stderr[-3000:]
            raise StartupError(f"dumping the Spark class archive failed (exit {done.returncode}): {why}")
        target = folder / name
        os.replace(partial, target)
        return target
    raise StartupError(f"no folder to write the Spark class archive in: {'; '.join(errors)}")
