"""Past one machine's Spark: the pageviews job on two processors whose queries run on a Spark standalone cluster
(a master and a worker started from the pip-installed PySpark, `tests/support/spark_cluster.py`), not in
``local[*]``.

The job's first stage calls a Python UDF from a module next to the job's config (``pagenames.py``): executors
start their Python workers from the cluster's worker, which has no such directory on its path, so the UDF
unpickles only because the processor ships the job's code with the application (`weirflow.spark.session.
ship_job_code`). Counts must equal pandas, and the master must have run both processors' applications.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.integration.example_job import EXAMPLE, generate, results
from tests.support import spark_jvm
from tests.support.spark_cluster import StandaloneCluster
from weirflow.config import load_config
from weirflow.local.launcher import start_processor
from weirflow.testing import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.spark]

EVENTS = 3000


PIPELINE = """
from pyspark.sql import functions as F

import pipeline as pageviews
import weirflow
from pagenames import canonical  # only in the job's directory: reaches executors with the job's code


def tidy(views):
    return views.withColumn("page", F.udf(canonical, "string")("page"))


def cluster_pipeline(app):
    views = app.input("page-views").transform(tidy)
    counts = (
        views.partition_by("page", name="views-by-page")
        .aggregate("page", window="1 minute", views=weirflow.agg.count())
        .transform(pageviews.per_minute)
    )
    key = F.concat_ws("|", "page", F.date_format("window_start", "yyyy-MM-dd'T'HH:mm"))
    counts.send_to("page-counts", key=key)
"""

PAGENAMES = """
def canonical(page):
    return page.strip().lower() if page is not None else None
"""


def test_the_pageviews_job_runs_on_a_standalone_cluster_with_exact_counts(
    tmp_path: Path, measure, monkeypatch: pytest.MonkeyPatch
) -> None:
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    for name in ("job.yaml", "pipeline.py"):
        shutil.copy(EXAMPLE / name, job_dir / name)
    (job_dir / "clusterjob.py").write_text(PIPELINE)
    (job_dir / "pagenames.py").write_text(PAGENAMES)
    jvm_options = spark_jvm.driver_options()
    monkeypatch.setenv("SPARK_DAEMON_JAVA_OPTS", jvm_options)  # the master's and the worker's
    cluster = StandaloneCluster(tmp_path / "cluster").start()
    try:
        overrides = [
            f"job.state.dir={tmp_path / 'state'}",
            "app.pipeline=clusterjob:cluster_pipeline",
            f"spark.master={cluster.master_url}",
            "spark.cores.max=1",  # each processor is one application: one core each, both run at once
            "spark.executor.cores=1",
            "spark.executor.memory=512m",
        ]
        if jvm_options:
            overrides.append(f"spark.executor.extraJavaOptions={jvm_options}")
        config = load_config(job_dir / "job.yaml", overrides)
        events = generate.write(config, EVENTS)
        procs = [
            start_processor(job_dir / "job.yaml", name, overrides, log_dir=tmp_path / "logs")
            for name in ("p0", "p1")
        ]
        try:
            wait_until(lambda: not any(p.alive() for p in procs), 300, "the job to finish on the cluster", 0.5)
            for p in procs:
                assert p.popen.wait() == 0, p.log_text()[-4000:]
        except Exception:
            for p in procs:
                print(p.log_text()[-4000:])
            raise
        finally:
            for p in procs:
                if p.alive():
                    p.kill()
        apps = [a for a in cluster.applications() if a.get("name") == "weirflow-pageviews-1"]
    finally:
        cluster.stop()
    assert len(apps) == 2, f"the master ran {[a.get('name') for a in apps]}"
    for p in procs:
        assert "shipped the job's code to the cluster's executors: clusterjob.py, pagenames.py, pipeline.py" in (
            p.log_text()
        )
        assert f"session ready ({cluster.master_url})" in p.log_text()
    assert results.read_counts(config) == results.expected_counts(events)
    measure(
        f"pageviews on a standalone cluster (2 processors = 2 applications, a UDF from the job's directory): "
        f"{len(results.expected_counts(events))} windows over {EVENTS} events equal pandas"
    )
