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

A fresh checkout has no archive yet, and dumping it takes about 36 s of one core and a half. The controlling
pytest process starts the dump in the background (`prepare`) instead of waiting for it: pytest-xdist's workers
collect meanwhile, and the run begins with files that mostly wait (`tests/conftest.py` orders them). Before each
test a worker looks for the dump's outcome (`await_archive`); a test marked ``spark`` waits for it, so no Spark
test starts its JVMs without the archive, and from then on every JVM the worker starts maps it.

Measured on the 2-core machine, one Spark session running one small job: 34 s of CPU with Spark's defaults,
17 s with the first two options, 9 s with all three. Nothing about what a test checks depends on the JIT or the
collector. Processors use the quick compiler too (``spark.driver.defaultJavaOptions``, docs/pipelines.md); the
archive too (`task.spark.class.archive`); the serial collector stays the suite's own.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

from weirflow.base.errors import JavaMissingError
from weirflow.spark import class_archive

BASE_OPTIONS = ["-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC"]
ENV = "PYSPARK_SUBMIT_ARGS"
# Where the background dump writes its outcome, {"archive": path} or {"error": why}: set by the controlling
# process for its workers.
DUMP_STATUS_ENV = "WEIRFLOW_TESTS_CLASS_ARCHIVE_STATUS"
# How long a Spark test waits for the dump: its own limit (`class_archive.dump`'s 600 s) and a minute.
DUMP_TIMEOUT_S = 660.0
_REPOSITORY = Path(__file__).resolve().parents[2]
_outcome_seen = False


def _submit_args(options: list[str]) -> str:
    return f"--driver-java-options {shlex.quote(' '.join(options))} pyspark-shell"


def driver_options() -> str:
    """The driver JVM options of this run's ``PYSPARK_SUBMIT_ARGS`` (the suite's, or the caller's own), for other
    Spark JVMs a test starts (a standalone cluster's master, worker and executors); "" when none are set."""
    args = shlex.split(os.environ.get(ENV, ""))
    return args[args.index("--driver-java-options") + 1] if "--driver-java-options" in args[:-1] else ""


def prepare(build: bool) -> None:
    """Put the suite's driver options in the environment, unless the caller set ``PYSPARK_SUBMIT_ARGS``
    themselves. With ``build`` (the controlling pytest process, before its workers start), start dumping the
    class archive in the background if it is missing; `await_archive` adds it to the options once it exists."""
    if ENV in os.environ:
        return
    options = list(BASE_OPTIONS)
    try:
        archive = class_archive.find_archive()
    except (JavaMissingError, OSError, subprocess.CalledProcessError) as exc:  # the Spark tests report it too
        warnings.warn(f"no class-data-sharing archive for the suite's Spark JVMs: {exc}", stacklevel=1)
        archive, build = None, False
    if archive is None and build:
        _start_dump()
    if archive is not None:
        options.append(f"-XX:SharedArchiveFile={archive}")
    os.environ[ENV] = _submit_args(options)


def _start_dump() -> None:
    """Run this module's ``__main__`` (the dump `weirflow spark-archive` makes) in its own session, so that it
    outlives a short pytest run and the next run finds the archive; its output goes to ``dump.log`` beside the
    status file."""
    folder = Path(tempfile.mkdtemp(prefix="weirflow-tests-cds-"))
    status = folder / "status.json"
    with (folder / "dump.log").open("w") as log:
        subprocess.Popen(
            [sys.executable, "-m", "tests.support.spark_jvm", str(status)],
            cwd=_REPOSITORY,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    os.environ[DUMP_STATUS_ENV] = str(status)
    print(
        "dumping the Spark class archive in the background (weirflow spark-archive, once per venv); "
        f"Spark tests wait for it; log: {folder / 'dump.log'}",
        flush=True,
    )


def dump_running() -> bool:
    """Whether this run started a dump (`prepare`) that has not finished yet."""
    where = os.environ.get(DUMP_STATUS_ENV)
    return bool(where) and not Path(where).exists()


def await_archive(wait: bool, timeout_s: float = DUMP_TIMEOUT_S) -> None:
    """If this run started a dump (`prepare`) and it has finished, add its archive to the driver options every
    JVM started from now on inherits, or warn once with why it failed. With ``wait``, first wait for it to
    finish (polling its status file); a dump that has not finished within ``timeout_s`` is warned about and
    the tests go on without the archive, which only makes Spark start slower."""
    global _outcome_seen
    where = os.environ.get(DUMP_STATUS_ENV)
    if _outcome_seen or not where:
        return
    status = Path(where)
    if not status.exists():
        if not wait:
            return
        deadline = time.monotonic() + timeout_s
        while not status.exists():
            if time.monotonic() > deadline:
                _outcome_seen = True
                warnings.warn(
                    f"the Spark class archive's dump did not finish within {timeout_s:.0f} s (log: "
                    f"{status.parent / 'dump.log'}): Spark tests run without it",
                    stacklevel=1,
                )
                return
            time.sleep(0.2)
    _outcome_seen = True
    outcome = json.loads(status.read_text())
    if "archive" in outcome:
        options = [*shlex.split(driver_options()), f"-XX:SharedArchiveFile={outcome['archive']}"]
        os.environ[ENV] = _submit_args(options)
    else:
        why = outcome["error"]
        warnings.warn(f"no class-data-sharing archive for the suite's Spark JVMs: {why}", stacklevel=1)


def _dump(status: Path) -> None:
    """Dump the archive as `weirflow spark-archive` does and write the outcome to ``status`` in one step (a
    waiting worker never reads half of it)."""
    from weirflow.spark.session import SPARK_DEFAULTS

    began = time.monotonic()
    try:
        outcome = {"archive": str(class_archive.dump(SPARK_DEFAULTS["spark.driver.defaultJavaOptions"]))}
    except Exception as exc:  # any failure is the waiting workers' to report; only a kill leaves no outcome
        outcome = {"error": f"{type(exc).__name__}: {exc}"}
    print(f"{outcome} after {time.monotonic() - began:.0f} s", flush=True)
    partial = status.with_suffix(".partial")
    partial.write_text(json.dumps(outcome))
    os.replace(partial, status)


if __name__ == "__main__":
    _dump(Path(sys.argv[1]))
