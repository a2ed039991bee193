"""MetadataStore contract: JSON documents with etag compare-and-set."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from weirflow.base.errors import EtagMismatchError
from weirflow.interfaces.metadata import MetadataStore
from weirflow.testing.backend import Backend
from weirflow.testing.contracts._base import Contract, new_job_name


class MetadataStoreContract(Contract):
    """`weirflow.interfaces.metadata.MetadataStore`, through ``Backend.metadata_store``."""

    @pytest.fixture
    def metadata_store(self, weirflow_backend: Backend, job_name: str) -> Iterator[MetadataStore]:
        store = weirflow_backend.metadata_store(job_name)
        store.start()
        yield store
        store.stop()

    def test_a_missing_document_reads_as_none(self, metadata_store) -> None:
        assert metadata_store.get("job-model") is None

    def test_put_then_get_returns_the_value_and_its_etag(self, metadata_store) -> None:
        etag = metadata_store.put("job-model", {"version": 1, "tasks": {"a": [1, 2]}})
        doc = metadata_store.get("job-model")
        assert doc.value == {"version": 1, "tasks": {"a": [1, 2]}}
        assert doc.etag == etag and doc.key == "job-model"

    def test_if_none_match_fails_when_the_document_exists_and_changes_nothing(self, metadata_store) -> None:
        metadata_store.put("doc", {"v": 1}, if_none_match=True)
        with pytest.raises(EtagMismatchError):
            metadata_store.put("doc", {"v": 2}, if_none_match=True)
        assert metadata_store.get("doc").value == {"v": 1}

    def test_if_match_succeeds_with_the_current_etag_only(self, metadata_store) -> None:
        first = metadata_store.put("doc", {"v": 1})
        second = metadata_store.put("doc", {"v": 2}, if_match=first)
        with pytest.raises(EtagMismatchError):
            metadata_store.put("doc", {"v": 3}, if_match=first)
        doc = metadata_store.get("doc")
        assert doc.value == {"v": 2} and doc.etag == second

    def test_if_match_on_a_missing_document_fails(self, metadata_store) -> None:
        with pytest.raises(EtagMismatchError):
            metadata_store.put("doc", {"v": 1}, if_match="anything")
        assert metadata_store.get("doc") is None

    def test_etags_never_repeat_even_after_delete_and_recreate(self, metadata_store) -> None:
        etags = [metadata_store.put("doc", {"v": i}) for i in range(5)]
        metadata_store.delete("doc")
        etags.append(metadata_store.put("doc", {"v": 0}))
        assert len(set(etags)) == len(etags)

    def test_conditional_delete(self, metadata_store) -> None:
        etag = metadata_store.put("doc", {"v": 1})
        metadata_store.put("doc", {"v": 2})
        with pytest.raises(EtagMismatchError):
            metadata_store.delete("doc", if_match=etag)
        metadata_store.delete("doc", if_match=metadata_store.get("doc").etag)
        assert metadata_store.get("doc") is None
        metadata_store.delete("doc")  # missing: a no-op

    def test_list_returns_documents_under_a_prefix_sorted_by_key(self, metadata_store) -> None:
        for key in ("drain/b", "drain/a", "job-model", "drainage"):
            metadata_store.put(key, {"k": key})
        assert [d.key for d in metadata_store.list("drain/")] == ["drain/a", "drain/b"]
        assert [d.key for d in metadata_store.list()] == ["drain/a", "drain/b", "drainage", "job-model"]

    def test_another_store_of_the_job_sees_the_document_and_other_jobs_do_not(
        self, weirflow_backend: Backend, job_name: str, metadata_store
    ) -> None:
        etag = metadata_store.put("job-model", {"version": 1})
        same, other = weirflow_backend.metadata_store(job_name), weirflow_backend.metadata_store(new_job_name())
        for store in (same, other):
            store.start()
        try:
            seen = same.get("job-model")
            assert seen is not None and seen.etag == etag
            assert other.get("job-model") is None and other.list() == []
        finally:
            same.stop()
            other.stop()
