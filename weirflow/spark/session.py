"""The processor's one SparkSession, built from the job's `spark.*` keys.

PySpark needs two environment variables that users should never have to know about: ``PYSPARK_PYTHON`` (the
interpreter Spark starts for Python workers and for the data sources' driver-side process; it must be the one
running the processor, or the workers cannot import the job's code) and ``SPARK_LOCAL_IP`` (Spark otherwise
resolves the host name, which on many laptops and containers points at an unreachable address). Both are
set here unless the user already set them.

**Worker start-up.** A pip-installed PySpark carries its Python code twice: as the ``pyspark`` package and as
``pyspark/python/lib/pyspark.zip`` (plus py4j's zip and the spark-core jar), which Spark puts *first* on the
``PYTHONPATH`` of every Python process it starts. Python caches no bytecode for modules imported from a zip,
so every data-source planner process compiled PySpark from source (measured: ~5 s of CPU per task query
start), and every new worker re-read those archives' directories (``importlib.invalidate_caches``). Unless the
user chose their own ``PYSPARK_PYTHON``, Spark therefore starts Python through `worker_python`: a two-line
launcher that drops those archives from ``PYTHONPATH`` and runs this interpreter, which imports the very same
PySpark from its installed package, bytecode cached.
"""

from __future__ import annotations

import hashlib
import logging
import os
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from weirflow.interfaces.config import ConfigView

if TYPE_CHECKING:
    from weirflow.config.loader import Config  # `spark_settings` reads a whole prefix (`Config.subset`)
from weirflow.runtime.fault_points import PROCESSOR_PID
from weirflow.spark import forkserver
from weirflow.spark.class_archive import java_options
from weirflow.spark.java import check_java

log = logging.getLogger("weirflow.spark")

# Defaults for a processor; every one can be overridden by the same `spark.*` key in the job config.
# One shuffle partition: each task query holds one task's data, so more partitions only multiply the state-store
# and writer tasks of every micro-batch (a stateful query fixes the count in its checkpoint at its first batch).
SPARK_DEFAULTS: dict[str, str] = {
    "spark.master": "local[*]",
    "spark.app.name": "weirflow",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "1",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.streaming.stopTimeout": "30s",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.driver.memory": "2g",
    "spark.log.level": "ERROR",
    # PySpark's worker daemon, started with weirflow's modules loaded and its heap frozen (see the module).
    "spark.python.daemon.module": "weirflow.spark.daemon",
    # The JVM's quick compiler only. Every micro-batch runs Spark's planner, thousands of methods that the
    # optimising compiler (C2) was still compiling a minute into a job: 0.7 of this machine's 2 cores, while
    # the batches it was meant to speed up waited (docs/pipelines.md, "Performance"). `defaultJavaOptions`, so
    # that a job's own `spark.driver.extraJavaOptions` adds to it rather than replacing it.
    "spark.driver.defaultJavaOptions": "-XX:TieredStopAtLevel=1",
    # No shuffle reused between two stateful operators. A stage's outputs are one union
    # (`StageBuilder.sink_frame`), so a stateful stage with two outputs has its aggregation in both branches; with
    # the exchange reused (Spark's default), the second branch's aggregation wrote nothing in append mode, ever: a
    # `send_to` beside a `partition_by` of the same counts lost every row of the intermediate stream (pyspark 4.x,
    # measured). Off, each branch shuffles and aggregates on its own, with its own state: right, at the cost of
    # doing it twice.
    "spark.sql.exchange.reuse": "false",
}
# Settings a job may not change: with them changed, results are lost (the comments above say how).
REQUIRED_SETTINGS = {"spark.sql.exchange.reuse": "false"}


_LAUNCHER = """#!/bin/sh
# Written by weirflow (weirflow/spark/session.py): runs {python} without the copies of PySpark that Spark
# puts on PYTHONPATH as archives ({archives}/...), so the installed package, bytecode cached, is imported.
set -f
kept=""
IFS=:
for entry in $PYTHONPATH; do
  case "$entry" in
    "{archives}"/*) ;;
    *) kept="${{kept:+$kept:}}$entry" ;;
  esac
done
unset IFS
PYTHONPATH="$kept"
export PYTHONPATH
# The daemons that fork the driver's data source planners preload their module (weirflow/spark/daemon.py).
if [ "$1" = "-m" ] && [ "$2" = "pyspark.daemon" ] && [ $# -eq 3 ]; then
  case "$3" in
    pyspark.sql.worker.*) set -- -m "{daemon}" "$3" ;;
  esac
fi
# A query's planner process and every worker daemon come from the processor's fork server when it runs
# (weirflow/spark/forkserver.py).
case "$1 $2" in
  "-m {runner}"|"-m {daemon}")
    if [ -S "${{WEIRFLOW_FORK_SERVER:-}}" ]; then exec "{python}" -I -S "{client}" "$@"; fi ;;
esac
exec "{python}" "$@"
"""


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "weirflow"


def worker_python() -> str:
    """The interpreter Spark should start for Python processes: this one, through the launcher described in
    the module docstring when the installed PySpark ships its code as archives too (else this one as is)."""
    import pyspark

    package = Path(pyspark.__file__).resolve().parent
    if os.name != "posix" or not (package / "python" / "lib" / "pyspark.zip").exists():
        return sys.executable
    client_name = f"fork-client-{hashlib.sha256(forkserver.CLIENT.encode()).hexdigest()[:16]}.py"
    for folder in (_cache_dir(), Path(tempfile.gettempdir()) / f"weirflow-{os.getuid()}"):
        try:
            client = _write_once(folder, client_name, forkserver.CLIENT, 0o644)
            text = _LAUNCHER.format(
                python=sys.executable,
                archives=str(package),
                runner=forkserver.RUNNER,
                daemon=forkserver.DAEMON,
                client=str(client),
            )
            name = f"python-{hashlib.sha256(text.encode()).hexdigest()[:16]}"
            return str(_write_once(folder, name, text, 0o755))
        except OSError as exc:
            log.debug("cannot write the worker launcher in %s: %s", folder, exc)
    return sys.executable


def _write_once(folder: Path, name: str, text: str, mode: int) -> Path:
    """``folder/name`` holding ``text`` (its name is a hash of it, so an existing file is the same one)."""
    path = folder / name
    if not path.exists():
        folder.mkdir(parents=True, exist_ok=True)
        partial = folder / f".{name}.{os.getpid()}"
        partial.write_text(text)
        partial.chmod(mode)
        os.replace(partial, path)
    return path


def _spark_runs_the_launcher() -> bool:
    """Whether Spark starts Python through `worker_python`'s launcher (not the user's own ``PYSPARK_PYTHON``)."""
    python = os.environ.get("PYSPARK_PYTHON")
    return os.name == "posix" and python is not None and python != sys.executable and python == worker_python()


def prepare_environment() -> None:
    """Set ``PYSPARK_PYTHON`` / ``PYSPARK_DRIVER_PYTHON`` and ``SPARK_LOCAL_IP`` unless the user did."""
    os.environ.setdefault("PYSPARK_PYTHON", worker_python())
    # Spark's JVM runs the data source lookup at a session's first query with this one (else PYSPARK_PYTHON):
    # through the launcher, it too is forked warm.
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", os.environ["PYSPARK_PYTHON"])
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ[PROCESSOR_PID] = str(os.getpid())  # whose Spark this is, for its workers' fault points


# Spark checkpoints on a local disk: write them through Hadoop's FileSystem API. Its default, the FileContext API,
# makes Hadoop's local file system (without its native library, as in a pip install) start a `chmod` process for
# every file and directory it creates and a `readlink` for every rename: measured 1,177 process starts (forks of
# the JVM) in 50 s of the example job, several per micro-batch of every task. Renames on a local disk are atomic
# either way.
LOCAL_CHECKPOINT_SETTINGS: dict[str, str] = {
    "spark.sql.streaming.checkpointFileManagerClass": (
        "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager"
    ),
}


def _checkpoints_on_local_disk(config: ConfigView) -> bool:
    location = str(config.get("task.spark.checkpoint.dir") or "")
    return "://" not in location or location.startswith("file:")


def spark_settings(config: Config) -> dict[str, str]:
    """`SPARK_DEFAULTS` overlaid with the job's `spark.*` keys (values as strings)."""
    settings = dict(SPARK_DEFAULTS)
    if _checkpoints_on_local_disk(config):
        settings.update(LOCAL_CHECKPOINT_SETTINGS)
    settings["spark.app.name"] = f"weirflow-{config.get('job.name')}-{config.get('job.id')}"
    for name, value in config.subset("spark").items():
        settings[f"spark.{name}"] = str(value).lower() if isinstance(value, bool) else str(value)
    for key, required in REQUIRED_SETTINGS.items():
        if settings[key].lower() != required:
            raise config.error(
                key,
                f"must stay {required}: otherwise Spark reuses one shuffle for two branches of a stage that share "
                "an aggregation (two outputs of it), and the second branch writes nothing (docs/pipelines.md); "
                "remove the key",
            )
    archive = java_options(str(config.get("task.spark.class.archive")))
    if archive:  # weirflow.spark.class_archive: in the default options too, so a job's own extra options add to it
        options = settings.get("spark.driver.defaultJavaOptions", "")
        settings["spark.driver.defaultJavaOptions"] = f"{options} {archive}".strip()
    return settings


def build_spark_session(config: Config) -> Any:
    """Start (or reuse) this process's SparkSession, configured for the job; quiet logs unless asked."""
    check_java()
    prepare_environment()
    if config.get("task.spark.planner.fork") and _spark_runs_the_launcher():
        forkserver.start_fork_server()  # before the JVM starts: Spark's Python processes inherit its environment
    from pyspark.sql import SparkSession

    builder = SparkSession.builder
    settings = spark_settings(config)
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(settings["spark.log.level"])
    if not str(spark.sparkContext.master).startswith("local"):
        ship_job_code(spark, config)
    log.info("spark %s session ready (%s)", spark.version, spark.sparkContext.master)
    return spark


def job_code_archive(base_dir: Path, target: Path) -> list[str]:
    """Zip the job's own Python code — the modules and packages next to its config file, which `app.pipeline`
    and `task.function` are imported from — into ``target``; returns the names archived. Hidden entries,
    ``__pycache__`` and the state directory's usual name (``.weirflow``) are left out."""
    import zipfile

    names: list[str] = []
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as archive:
        for path in sorted(base_dir.iterdir()):
            if path.name.startswith(".") or path.name == "__pycache__":
                continue
            if path.is_file() and path.suffix == ".py":
                archive.write(path, path.name)
                names.append(path.name)
            elif path.is_dir() and (path / "__init__.py").exists():
                for file in sorted(path.rglob("*.py")):
                    if "__pycache__" not in file.parts:
                        archive.write(file, file.relative_to(base_dir).as_posix())
                names.append(path.name + "/")
    return names


def ship_job_code(spark: Any, config: ConfigView) -> None:
    """On a cluster (a `spark.master` other than ``local``), executors start their Python workers on other
    machines, where the config file's directory is not: the job's code goes to them with the application
    (``SparkContext.addPyFile``), so a UDF or transform defined in it can be unpickled there. weirflow itself
    and the job's dependencies must be installed on the workers (docs/pipelines.md, "On a Spark cluster")."""
    base = Path(config.base_dir)
    archive = Path(tempfile.mkdtemp(prefix="weirflow-job-")) / "job-code.zip"
    names = job_code_archive(base, archive)
    if names:
        spark.sparkContext.addPyFile(str(archive))
        log.info("shipped the job's code to the cluster's executors: %s", ", ".join(names))
