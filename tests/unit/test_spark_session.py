"""The Spark bootstrap: environment PySpark needs, settings from `spark.*` keys, a clear missing-Java error."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from weirflow.base.errors import ConfigError, JavaMissingError
from weirflow.config.loader import Config
from weirflow.spark import class_archive
from weirflow.spark.java import check_java
from weirflow.spark.session import prepare_environment, spark_settings, worker_python


def test_environment_defaults_to_this_interpreter_and_loopback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    monkeypatch.delenv("SPARK_LOCAL_IP", raising=False)
    monkeypatch.setenv("PYSPARK_DRIVER_PYTHON", "/custom/python")
    prepare_environment()

    assert os.environ["PYSPARK_PYTHON"] == worker_python()
    assert os.environ["SPARK_LOCAL_IP"] == "127.0.0.1"
    assert os.environ["PYSPARK_DRIVER_PYTHON"] == "/custom/python"  # what the user set wins


def test_the_drivers_python_defaults_to_the_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Spark's JVM runs its driver-side Python (the data source lookup) with PYSPARK_DRIVER_PYTHON: the launcher
    too, so that process comes from the fork server like the others."""
    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    monkeypatch.delenv("PYSPARK_DRIVER_PYTHON", raising=False)
    prepare_environment()

    assert os.environ["PYSPARK_DRIVER_PYTHON"] == os.environ["PYSPARK_PYTHON"] == worker_python()


def test_workers_run_this_interpreter_and_import_the_installed_pyspark_not_its_archives(tmp_path: Path) -> None:
    """Spark puts pyspark.zip (no bytecode cache) first on every Python worker's path; the launcher drops it
    and keeps every other entry, so workers import the installed package."""
    import pyspark

    package = Path(pyspark.__file__).resolve().parent
    archives = [str(p) for p in (package / "python" / "lib").glob("*.zip")]
    if not archives:
        pytest.skip("this PySpark install ships no archives")
    probe = (
        "import json, os, sys, pyspark; "
        "print(json.dumps([sys.executable, os.environ['PYTHONPATH'], pyspark.__file__]))"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([*archives, str(tmp_path), archives[0]]))
    done = subprocess.run([worker_python(), "-c", probe], env=env, capture_output=True, text=True, check=True)
    executable, path, imported = json.loads(done.stdout)
    assert Path(executable).resolve() == Path(sys.executable).resolve()
    assert path == str(tmp_path)
    assert ".zip" not in imported and Path(imported).resolve().parent == package


def test_settings_overlay_the_jobs_spark_keys_on_the_defaults() -> None:
    config = Config.from_dict({"job": {"name": "j"}, "spark": {"master": "local[1]", "sql.shuffle.partitions": 8}})
    settings = spark_settings(config)
    assert settings["spark.master"] == "local[1]"
    assert settings["spark.sql.shuffle.partitions"] == "8"
    assert settings["spark.ui.enabled"] == "false"
    assert settings["spark.app.name"] == "weirflow-j-1"


def test_a_job_may_not_let_spark_reuse_a_shuffle_between_two_branches_of_an_aggregation() -> None:
    """With the exchange reused, a stateful stage's second output wrote nothing (docs/pipelines.md)."""
    assert spark_settings(Config.from_dict({"job": {"name": "j"}}))["spark.sql.exchange.reuse"] == "false"
    reused = Config.from_dict({"job": {"name": "j"}, "spark": {"sql.exchange.reuse": True}})
    with pytest.raises(ConfigError, match="spark.sql.exchange.reuse.*must stay false"):
        spark_settings(reused)


def test_the_jvm_compiles_with_c1_only_and_a_jobs_own_java_options_add_to_that() -> None:
    """Spark's planner runs every micro-batch; the optimising compiler kept a core busy for minutes
    (docs/pipelines.md). The option is the launcher's *default* one, so a job's extra options keep it."""
    no_archive = {"task": {"spark": {"class": {"archive": "off"}}}}
    config = Config.from_dict({"job": {"name": "j"}, "spark": {"driver.extraJavaOptions": "-Dx=1"}, **no_archive})
    settings = spark_settings(config)
    assert settings["spark.driver.defaultJavaOptions"] == "-XX:TieredStopAtLevel=1"
    assert settings["spark.driver.extraJavaOptions"] == "-Dx=1"
    own = {"job": {"name": "j"}, "spark": {"driver.defaultJavaOptions": ""}, **no_archive}
    opted_out = spark_settings(Config.from_dict(own))
    assert opted_out["spark.driver.defaultJavaOptions"] == ""


def test_the_jvm_maps_the_class_archive_when_one_was_dumped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Spark starts in about half the time with it (weirflow/spark/class_archive.py); `auto` uses the archive of
    this Java and PySpark when there is one, `off` none, a path that archive."""
    monkeypatch.setattr(class_archive, "_folders", lambda: [tmp_path / "venv", tmp_path / "cache"])

    def options(setting: str) -> str:
        job = {"job": {"name": "j"}, "task": {"spark": {"class": {"archive": setting}}}}
        return spark_settings(Config.from_dict(job))["spark.driver.defaultJavaOptions"]

    assert options("auto") == "-XX:TieredStopAtLevel=1"  # none dumped yet
    dumped = tmp_path / "cache" / class_archive.archive_name()
    dumped.parent.mkdir()
    dumped.write_bytes(b"archive")
    assert options("auto") == f"-XX:TieredStopAtLevel=1 -XX:SharedArchiveFile={dumped}"
    assert options("off") == "-XX:TieredStopAtLevel=1"
    assert options("/elsewhere/spark.jsa") == "-XX:TieredStopAtLevel=1 -XX:SharedArchiveFile=/elsewhere/spark.jsa"


def test_missing_java_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(JavaMissingError, match="apt-get install default-jre-headless"):
        check_java()
