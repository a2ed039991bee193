"""The Blob Storage copy of tasks' Spark checkpoint directories (`weirflow_azure.coordinator.spark_state`) on
Azurite, on a directory laid out as Spark lays it out: what a mirror sends, what a restore brings back, and the
fence. (`test_spark_state_moves.py` proves it on a running job.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import unique_job_name
from weirflow.base.errors import FencedOffError
from weirflow.config.loader import Config
from weirflow.interfaces.spark_checkpoint import committed_files
from weirflow_azure.coordinator.spark_state import BlobSparkStateStore
from weirflow_azure.coordinator.storage import Storage

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def spark_dir(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


LAYOUT = {
    "metadata": '{"id":"q"}',
    "sources/0/0": "v1",
    "offsets/0": "o0",
    "offsets/1": "o1",
    "offsets/2": "o2 (planned, not committed)",
    "commits/0": "c0",
    "commits/1": "c1",
    "state/0/0/_metadata/schema": "s",
    "state/0/0/1.delta": "d1",
    "state/0/0/2.delta": "d2",
    "state/0/0/3.delta": "d3 (batch 2, running)",
    "state/0/0/.2.delta.crc": "hidden",
}


@pytest.fixture
def store(azure_storage: str):
    settings = {"job.name": unique_job_name("sstate"), "azure.storage.connection.string": azure_storage}
    config = Config.from_dict(settings)
    store = BlobSparkStateStore(Storage.from_config(config))
    yield store
    store.close()


def test_a_mirror_sends_the_committed_batch_and_a_restore_brings_back_exactly_it(store, tmp_path: Path) -> None:
    local = spark_dir(tmp_path / "a", LAYOUT)
    first = store.mirror("views-0", local, batch=1, epoch=3)
    expected = set(LAYOUT) - {"offsets/2", "state/0/0/3.delta", "state/0/0/.2.delta.crc"}
    assert set(committed_files(local, 1)) == expected and first.uploaded == len(expected)
    again = store.mirror("views-0", local, batch=1, epoch=3)
    assert again.uploaded == 0, "files already stored are not sent again"

    # batch 2 commits; Spark purges batch 0's log entries: only the new files go, the purged ones are deleted
    (local / "commits" / "2").write_text("c2")
    (local / "offsets" / "0").unlink()
    (local / "commits" / "0").unlink()
    step = store.mirror("views-0", local, batch=2, epoch=3)
    assert (step.uploaded, step.deleted) == (3, 2)  # offsets/2, commits/2, state 3.delta

    other = tmp_path / "b" / "views-0"  # another machine
    assert store.restore("views-0", other) == 2
    assert {p.relative_to(other).as_posix(): p.read_text() for p in other.rglob("*") if p.is_file()} == {
        rel: text
        for rel, text in LAYOUT.items()
        if rel not in ("offsets/0", "commits/0", "state/0/0/.2.delta.crc")
    } | {"commits/2": "c2"}
    assert store.restore("views-0", other) == 2  # level with the copy: left as it is


def test_a_former_holder_is_fenced_off(store, azure_storage: str, tmp_path: Path) -> None:
    local = spark_dir(tmp_path / "a", LAYOUT)
    store.mirror("views-1", local, batch=1, epoch=5)
    with pytest.raises(FencedOffError):
        store.mirror("views-1", local, batch=1, epoch=4)
    assert store.restore("views-1", tmp_path / "b") == 1

    # the next holder, on another machine (its own store), restores and mirrors with a later epoch: the former
    # holder's next mirror is refused by the manifest's changed ETag, though it never read the manifest again
    former = store
    store.mirror("views-2", local, batch=1, epoch=5)
    nxt = BlobSparkStateStore(Storage(former._storage.settings))
    try:
        assert nxt.restore("views-2", tmp_path / "c") == 1
        nxt.mirror("views-2", tmp_path / "c", batch=1, epoch=6)
    finally:
        nxt.close()
    with pytest.raises(FencedOffError):
        former.mirror("views-2", local, batch=1, epoch=5)


def test_nothing_stored_restores_nothing(store, tmp_path: Path) -> None:
    assert store.restore("never-mirrored", tmp_path / "x") is None
    assert not (tmp_path / "x").exists()
