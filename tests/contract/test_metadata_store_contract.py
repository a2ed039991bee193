"""MetadataStore contract: JSON documents with etag compare-and-set."""

from __future__ import annotations

import pytest

from weirflow.errors import EtagMismatchError


def test_a_missing_document_reads_as_none(metadata_store) -> None:
    assert metadata_store.get("job-model") is None


def test_put_then_get_returns_the_value_and_its_etag(metadata_store) -> None:
    etag = metadata_store.put("job-model", {"version": 1, "tasks": {"a": [1, 2]}})
    doc = metadata_store.get("job-model")
    assert doc.value == {"version": 1, "tasks": {"a": [1, 2]}}
    assert doc.etag == etag and doc.key == "job-model"


def test_if_none_match_fails_when_the_document_exists_and_changes_nothing(metadata_store) -> None:
    metadata_store.put("doc", {"v": 1}, if_none_match=True)
    with pytest.raises(EtagMismatchError):
        metadata_store.put("doc", {"v": 2}, if_none_match=True)
    assert metadata_store.get("doc").value == {"v": 1}


def test_if_match_succeeds_with_the_current_etag_only(metadata_store) -> None:
    first = metadata_store.put("doc", {"v": 1})
    second = metadata_store.put("doc", {"v": 2}, if_match=first)
    with pytest.raises(EtagMismatchError):
        metadata_store.put("doc", {"v": 3}, if_match=first)
    doc = metadata_store.get("doc")
    assert doc.value == {"v": 2} and doc.etag == second


def test_if_match_on_a_missing_document_fails(metadata_store) -> None:
    with pytest.raises(EtagMismatchError):
        metadata_store.put("doc", {"v": 1}, if_match="anything")
    assert metadata_store.get("doc") is None


def test_etags_never_repeat_even_after_delete_and_recreate(metadata_store) -> None:
    etags = [metadata_store.put("doc", {"v": i}) for i in range(5)]
    metadata_store.delete("doc")
    etags.append(metadata_store.put("doc", {"v": 0}))
    assert len(set(etags)) == len(etags)


def test_conditional_delete(metadata_store) -> None:
    etag = metadata_store.put("doc", {"v": 1})
    metadata_store.put("doc", {"v": 2})
    with pytest.raises(EtagMismatchError):
        metadata_store.delete("doc", if_match=etag)
    metadata_store.delete("doc", if_match=metadata_store.get("doc").etag)
    assert metadata_store.get("doc") is None
    metadata_store.delete("doc")  # missing: a no-op


def test_list_returns_documents_under_a_prefix_sorted_by_key(metadata_store) -> None:
    for key in ("drain/b", "drain/a", "job-model", "drainage"):
        metadata_store.put(key, {"k": key})
    assert [d.key for d in metadata_store.list("drain/")] == ["drain/a", "drain/b"]
    assert [d.key for d in metadata_store.list()] == ["drain/a", "drain/b", "drainage", "job-model"]
