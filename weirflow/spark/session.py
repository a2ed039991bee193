"""The processor's one SparkSession, built from the job's `spark.*` keys.

PySpark needs two environment variables that users should never have to know about: ``PYSPARK_PYTHON`` (the
interpreter Spark starts for Python workers and for the data sources' driver-side process; it must be the one
running the processor, or the workers cannot import the job's code) and ``SPARK_LOCAL_IP`` (Spark otherwise
resolves the host name, which on many laptops and containers points at an unreachable address). Both are
set here unless the user already set them.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
from typing import Any

from weirflow.errors import WeirflowError

log = logging.getLogger("weirflow.spark")

# Defaults for a processor; every one can be overridden by the same `spark.*` key in the job config.
SPARK_DEFAULTS: dict[str, str] = {
    "spark.master": "local[*]",
    "spark.app.name": "weirflow",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "4",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.streaming.stopTimeout": "30s",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.driver.memory": "2g",
    "spark.log.level": "ERROR",
}


class JavaMissingError(WeirflowError):
    """No Java runtime: Spark cannot start."""


def check_java() -> str:
    """The `java` that Spark will use; raise `JavaMissingError` with the way to install one."""
    java_home = os.environ.get("JAVA_HOME")
    java = os.path.join(java_home, "bin", "java") if java_home else shutil.which("java")
    if not java or not os.path.exists(java):
        raise JavaMissingError(
            "Spark needs a Java runtime (17 or newer) and none was found "
            f"({'JAVA_HOME=' + java_home if java_home else 'no java on PATH'}). Install one, e.g. "
            "`sudo apt-get install default-jre-headless` (Debian/Ubuntu), `brew install openjdk@17` (macOS), "
            "or run `make run`, which installs it when missing."
        )
    try:
        subprocess.run([java, "-version"], capture_output=True, check=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as exc:
        raise JavaMissingError(f"'{java} -version' failed ({exc}); install a working Java 17+ runtime") from exc
    return java


def prepare_environment() -> None:
    """Set ``PYSPARK_PYTHON`` / ``PYSPARK_DRIVER_PYTHON`` and ``SPARK_LOCAL_IP`` unless the user did."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


def spark_settings(config: Any) -> dict[str, str]:
    """`SPARK_DEFAULTS` overlaid with the job's `spark.*` keys (values as strings)."""
    settings = dict(SPARK_DEFAULTS)
    settings["spark.app.name"] = f"weirflow-{config.get('job.name')}-{config.get('job.id')}"
    for name, value in config.subset("spark").items():
        settings[f"spark.{name}"] = str(value).lower() if isinstance(value, bool) else str(value)
    return settings


def build_spark_session(config: Any) -> Any:
    """Start (or reuse) this process's SparkSession, configured for the job; quiet logs unless asked."""
    check_java()
    prepare_environment()
    from pyspark.sql import SparkSession

    builder = SparkSession.builder
    for key, value in spark_settings(config).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(spark_settings(config)["spark.log.level"])
    log.info("spark %s session ready (%s)", spark.version, spark.sparkContext.master)
    return spark
