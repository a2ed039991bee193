"""Reading and publishing the job model document, and the names the protocol gives to latches and locks.

The model is the JSON of `JobModel.to_json()` stored under key ``job-model`` in the MetadataStore. Only the
leader writes it, always conditionally on the etag it read, so a deposed leader's write fails.
"""

from __future__ import annotations

from weirflow.interfaces.metadata import MetadataStore
from weirflow.job_model import JobModel

JOB_MODEL_KEY = "job-model"


def read_job_model(store: MetadataStore) -> tuple[JobModel, str | None]:
    """The published model and its etag, or (`JobModel.empty()`, None) before the first publication."""
    document = store.get(JOB_MODEL_KEY)
    if document is None:
        return JobModel.empty(), None
    return JobModel.from_json(document.value), document.etag


def publish_job_model(store: MetadataStore, model: JobModel, etag: str | None) -> str:
    """Write ``model`` if the stored document still has ``etag`` (absent when None); `EtagMismatchError` else."""
    if etag is None:
        return store.put(JOB_MODEL_KEY, model.to_json(), if_none_match=True)
    return store.put(JOB_MODEL_KEY, model.to_json(), if_match=etag)


def latch_name(version: int) -> str:
    return f"jobmodel-{version}"


def task_lock_name(task: str) -> str:
    return f"task-{task}"
