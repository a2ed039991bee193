"""Cheaper Spark JVMs for the suite: every processor a test starts runs its own driver JVM, and on a 2-core
machine their start-up (class loading and JIT compilation) is most of the suite's CPU time.

The suite therefore starts drivers with options a short-lived test JVM wants and a long-running processor does
not, through PySpark's ``PYSPARK_SUBMIT_ARGS`` (read by every process PySpark launches a gateway from, the
processors a test spawns included):

- ``-XX:TieredStopAtLevel=1``: the quick (C1) compiler only; a JVM that lives a minute never earns back what
  the optimising compiler costs;
- ``-XX:+UseSerialGC``: one collector thread instead of one per core;
- ``-XX:SharedArchiveFile``: a class-data-sharing archive of the classes a Spark session loads, dumped once per
  Java runtime and PySpark version into the virtual environment (``<venv>/spark-cds/``); each JVM maps it
  instead of parsing and verifying those classes again.

Measured on the 2-core machine, one Spark session running one small job: 34 s of CPU with Spark's defaults,
17 s with the first two options, 9 s with all three. Nothing about what a test checks depends on the JIT or the
collector. Processors use the quick compiler too (``spark.driver.defaultJavaOptions``, docs/pipelines.md); the
serial collector and the archive stay the suite's own.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import subprocess
import sys
import warnings
from pathlib import Path

from weirflow.errors import JavaMissingError

BASE_OPTIONS = ["-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC"]
ENV = "PYSPARK_SUBMIT_ARGS"

# What the archive is dumped from: a session that plans and runs a shuffle, as every test job does.
_DUMP = """
from weirflow.spark.session import prepare_environment
prepare_environment()
from pyspark.sql import SparkSession
spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
         .config("spark.sql.shuffle.partitions", "1").getOrCreate())
spark.range(1000).selectExpr("id % 7 AS k").groupBy("k").count().collect()
gateway = spark.sparkContext._gateway
spark.stop()
gateway.shutdown()
gateway.proc.stdin.close()  # the JVM exits on EOF, writing the archive on its way out: wait for it
gateway.proc.wait()
"""


def _archive_path() -> Path:
    """Where the archive of this Java runtime and PySpark install lives (another of either needs its own)."""
    import pyspark

    from weirflow.spark.session import check_java

    java = subprocess.run([check_java(), "-version"], capture_output=True, text=True, check=True).stderr
    key = hashlib.sha256(f"{java}\0{pyspark.__version__}\0{Path(pyspark.__file__).parent}".encode()).hexdigest()
    return Path(sys.prefix) / "spark-cds" / f"{key[:16]}.jsa"


def _submit_args(options: list[str]) -> str:
    return f"--driver-java-options {shlex.quote(' '.join(options))} pyspark-shell"


def driver_options() -> str:
    """The driver JVM options of this run's ``PYSPARK_SUBMIT_ARGS`` (the suite's, or the caller's own), for other
    Spark JVMs a test starts (a standalone cluster's master, worker and executors); "" when none are set."""
    args = shlex.split(os.environ.get(ENV, ""))
    return args[args.index("--driver-java-options") + 1] if "--driver-java-options" in args[:-1] else ""


def prepare(build: bool) -> None:
    """Put the suite's driver options in the environment, unless the caller set ``PYSPARK_SUBMIT_ARGS``
    themselves. With ``build``, dump the class archive first if it is missing (the controlling pytest process
    does, before its workers start); a failed dump leaves the other options in place and says why."""
    if ENV in os.environ:
        return
    options = list(BASE_OPTIONS)
    try:
        archive = _archive_path()
    except (JavaMissingError, OSError, subprocess.CalledProcessError) as exc:  # the Spark tests report it too
        warnings.warn(f"no class-data-sharing archive for the suite's Spark JVMs: {exc}", stacklevel=1)
        archive = None
    if archive is not None and not archive.exists() and build:
        print(f"dumping the Spark class archive for the suite's JVMs into {archive.parent} (once)", flush=True)
        archive.parent.mkdir(parents=True, exist_ok=True)
        partial = archive.with_suffix(f".{os.getpid()}.partial")
        env = {**os.environ, ENV: _submit_args([*options, f"-XX:ArchiveClassesAtExit={partial}"])}
        done = subprocess.run(
            [sys.executable, "-c", _DUMP], env=env, capture_output=True, text=True, timeout=600, check=False
        )
        if done.returncode == 0 and partial.exists():
            partial.rename(archive)
        else:
            partial.unlink(missing_ok=True)
            warnings.warn(
                f"dumping the Spark class archive failed (exit {done.returncode}): {done.stderr[-2000:]}",
                stacklevel=1,
            )
    if archive is not None and archive.exists():
        options.append(f"-XX:SharedArchiveFile={archive}")
    os.environ[ENV] = _submit_args(options)


if __name__ == "__main__":  # `make test` dumps the archive while npm installs Azurite
    prepare(build=True)
