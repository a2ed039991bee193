"""Cheaper Spark JVMs for the suite: every processor a test starts runs its own driver JVM, and on a 2-core
machine their start-up (class loading and JIT compilation) is most of the suite's CPU time.

The suite therefore starts drivers with options a short-lived test JVM wants and a long-running processor does
not, through PySpark's ``PYSPARK_SUBMIT_ARGS`` (read by every process PySpark launches a gateway from, the
processors a test spawns included):

- ``-XX:TieredStopAtLevel=1``: the quick (C1) compiler only; a JVM that lives a minute never earns back what
  the optimising compiler costs;
- ``-XX:+UseSerialGC``: one collector thread instead of one per core;
- ``-XX:SharedArchiveFile``: the class-data-sharing archive processors use too (`weirflow.spark.class_archive`),
  dumped once per Java runtime and PySpark install; here it also reaches JVMs a test starts by other means.

Measured on the 2-core machine, one Spark session running one small job: 34 s of CPU with Spark's defaults,
17 s with the first two options, 9 s with all three. Nothing about what a test checks depends on the JIT or the
collector. Processors use the quick compiler too (``spark.driver.defaultJavaOptions``, docs/pipelines.md); the
archive too (`task.spark.class.archive`); the serial collector stays the suite's own.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import warnings

from weirflow.errors import JavaMissingError, StartupError
from weirflow.spark import class_archive

BASE_OPTIONS = ["-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC"]
ENV = "PYSPARK_SUBMIT_ARGS"


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
        archive = class_archive.find_archive()
    except (JavaMissingError, OSError, subprocess.CalledProcessError) as exc:  # the Spark tests report it too
        warnings.warn(f"no class-data-sharing archive for the suite's Spark JVMs: {exc}", stacklevel=1)
        archive, build = None, False
    if archive is None and build:
        print("dumping the Spark class archive (weirflow spark-archive, once per venv)", flush=True)
        try:
            archive = class_archive.dump(" ".join(options))
        except (StartupError, OSError, subprocess.SubprocessError) as exc:
            warnings.warn(str(exc), stacklevel=1)
    if archive is not None and archive.exists():
        options.append(f"-XX:SharedArchiveFile={archive}")
    os.environ[ENV] = _submit_args(options)


if __name__ == "__main__":  # `make test` dumps the archive while npm installs Azurite
    prepare(build=True)
