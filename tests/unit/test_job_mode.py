"""`JobMode`: a job is a pipeline exactly when its config names one (``app.pipeline``), else a record job."""

from __future__ import annotations

from weirflow.job.mode import JobMode


def test_a_job_is_a_pipeline_exactly_when_it_names_its_pipeline_function() -> None:
    assert JobMode.of({"app.pipeline": "job:build"}) is JobMode.PIPELINE
    assert JobMode.of({"app.pipeline": None, "task.function": "job:f"}) is JobMode.RECORD
    assert JobMode.of({}) is JobMode.RECORD
