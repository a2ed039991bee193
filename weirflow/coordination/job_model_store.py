"""Reading and publishing the job model document, and the names the protocol gives to latches and locks.

The model is the JSON of `JobModel.to_json()` stored under key ``job-model`` in the MetadataStore. Only the
leader writes it, always conditionally on the etag it read, so a deposed leader's write fails.
"""

from __future__ import annotations

from weirflow.base import malformed
from weirflow.base.errors import MalformedDocumentError
from weirflow.interfaces.metadata import MetadataStore
from weirflow.job.model import JobModel

JOB_MODEL_KEY = "job-model"


def read_job_model(store: MetadataStore) -> tuple[JobModel, str | None]:
    """The published model and its etag, or (`JobModel.empty()`, None) before the first publication."""
    document = store.get(JOB_MODEL_KEY)
    if document is None:
        return JobModel.empty(), None
    return JobModel.from_json(document.value), document.etag


# what every reader does with a malformed model; one text, since the first reader's report is the one logged
MALFORMED_MODEL_ACTION = (
    "not used: each processor keeps the job model it runs and waits, and the leader publishes none until the "
    "document is readable again"
)


def read_job_model_or_report(store: MetadataStore) -> tuple[JobModel | None, str | None]:
    """Like `read_job_model`, but a malformed document is reported (`weirflow.base.malformed.report`, logged once)
    and the model returned is None: a reader never acts on a model it cannot read, and never fails for it
    either (`MALFORMED_MODEL_ACTION` says what the readers do instead)."""
    try:
        document = store.get(JOB_MODEL_KEY)
    except MalformedDocumentError as exc:  # not JSON
        malformed.report(JOB_MODEL_KEY, exc, action=MALFORMED_MODEL_ACTION)
        return None, None
    if document is None:
        return JobModel.empty(), None
    try:
        return JobModel.from_json(document.value), document.etag
    except MalformedDocumentError as exc:
        malformed.report(JOB_MODEL_KEY, exc, document.value, action=MALFORMED_MODEL_ACTION)
        return None, document.etag


def publish_job_model(store: MetadataStore, model: JobModel, etag: str | None) -> str:
    """Write ``model`` if the stored document still has ``etag`` (absent when None); `EtagMismatchError` else."""
    if etag is None:
        return store.put(JOB_MODEL_KEY, model.to_json(), if_none_match=True)
    return store.put(JOB_MODEL_KEY, model.to_json(), if_match=etag)
