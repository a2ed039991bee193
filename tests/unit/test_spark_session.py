"""The Spark bootstrap: environment PySpark needs, settings from `spark.*` keys, a clear missing-Java error."""

from __future__ import annotations

import sys

import pytest

from weirflow.config.loader import Config
from weirflow.spark.session import JavaMissingError, check_java, prepare_environment, spark_settings


def test_environment_defaults_to_this_interpreter_and_loopback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    monkeypatch.delenv("SPARK_LOCAL_IP", raising=False)
    monkeypatch.setenv("PYSPARK_DRIVER_PYTHON", "/custom/python")
    prepare_environment()
    import os

    assert os.environ["PYSPARK_PYTHON"] == sys.executable
    assert os.environ["SPARK_LOCAL_IP"] == "127.0.0.1"
    assert os.environ["PYSPARK_DRIVER_PYTHON"] == "/custom/python"  # what the user set wins


def test_settings_overlay_the_jobs_spark_keys_on_the_defaults() -> None:
    config = Config.from_dict({"job": {"name": "j"}, "spark": {"master": "local[1]", "sql.shuffle.partitions": 8}})
    settings = spark_settings(config)
    assert settings["spark.master"] == "local[1]"
    assert settings["spark.sql.shuffle.partitions"] == "8"
    assert settings["spark.ui.enabled"] == "false"
    assert settings["spark.app.name"] == "weirflow-j-1"


def test_missing_java_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(JavaMissingError, match="apt-get install default-jre-headless"):
        check_java()
