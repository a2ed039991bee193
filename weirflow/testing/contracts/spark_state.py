"""Spark-state-store contract: a task's Spark checkpoint directory mirrored as of a committed batch, restored
on another processor, replaced by newer copies, fenced by the holder's epoch, and discarded.

The runner (`weirflow.spark.runner`) mirrors a stateful task's directory after each committed micro-batch and
restores it before the task's query starts; a drained task starting a new run discards it. The directories
here are small fakes of Spark's layout (the file names `weirflow.interfaces.spark_state` describes), so the
contract needs no Spark.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from weirflow.base.errors import FencedOffError
from weirflow.interfaces.spark_state import MirrorReport, SparkStateStore
from weirflow.testing.backend import Backend
from weirflow.testing.contracts._base import Contract


def write_batches(
    local: Path, last_planned: int, last_committed: int, purged_before: int = 0, history: str = "query"
) -> None:
    """A Spark checkpoint directory of a stateful query: batches ``purged_before..last_planned`` planned
    (offset log), up to ``last_committed`` committed (commit log), state version ``b + 1`` of every planned
    batch ``b``, Spark's metadata file (naming the directory's ``history``: Spark's query id) and its hidden
    checksums. Files before ``purged_before`` are removed, as Spark's maintenance does. Files of two histories
    have the same names and sizes and other contents."""
    metadata = local / "metadata"
    if not metadata.exists() or metadata.read_text() != f'{{"id":"{history}"}}':
        metadata.parent.mkdir(parents=True, exist_ok=True)
        metadata.write_text(f'{{"id":"{history}"}}')
    for batch in range(last_planned + 1):
        files = {
            f"offsets/{batch}": f"offsets of {batch}{_mark(history)}",
            f"state/0/0/{batch + 1}.delta": f"state {batch + 1}{_mark(history)}",
        }
        if batch <= last_committed:
            files[f"commits/{batch}"] = f"commit {batch}{_mark(history)}"
        for rel, text in files.items():
            path = local / rel
            if batch < purged_before:
                path.unlink(missing_ok=True)
                continue
            if path.exists() and path.read_text() == text:
                continue  # Spark writes a batch's files once: an unchanged file is not written again
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            (path.parent / f".{path.name}.crc").write_text("checksum")


def _mark(history: str) -> str:
    """What a file's text carries of its history (nothing for the default one): one character, so that files of
    two histories have equal sizes."""
    return "" if history == "query" else history[-1]


def contents(local: Path) -> dict[str, str]:
    """Relative path -> text of every file under ``local``, hidden ones left out."""
    if not local.exists():
        return {}
    return {
        p.relative_to(local).as_posix(): p.read_text()
        for p in local.rglob("*")
        if p.is_file() and not p.name.startswith(".")
    }


def committed_contents(batch: int, first: int = 0, history: str = "query") -> dict[str, str]:
    """What `write_batches` leaves that belongs to committed ``batch`` (batches ``first..batch``)."""
    mark = _mark(history)
    expected = {"metadata": f'{{"id":"{history}"}}'}
    for b in range(first, batch + 1):
        expected |= {f"offsets/{b}": f"offsets of {b}{mark}", f"commits/{b}": f"commit {b}{mark}"}
        expected[f"state/0/0/{b + 1}.delta"] = f"state {b + 1}{mark}"
    return expected


class SparkStateStoreContract(Contract):
    """`weirflow.interfaces.spark_state.SparkStateStore`, through ``Backend.spark_state_store``. ``store()``
    opens another store of the test's job each call, as another processor would; all are closed after the
    test. A backend with ``spark_state_copies = False`` (one disk shared by every processor) is checked to
    keep nothing and to leave local directories alone."""

    @pytest.fixture
    def store(self, weirflow_backend: Backend, job_name: str) -> Iterator[Callable[[], SparkStateStore]]:
        opened: list[SparkStateStore] = []

        def make() -> SparkStateStore:
            opened.append(weirflow_backend.spark_state_store(job_name))
            return opened[-1]

        yield make
        for one in opened:
            one.close()

    @pytest.fixture
    def copies(self, weirflow_backend: Backend) -> bool:
        return weirflow_backend.spark_state_copies

    @staticmethod
    def _keeps_copies(copies: bool) -> None:
        if not copies:
            pytest.skip("spark_state_copies is False: the store keeps no copy (test_a_store_of_one_disk...)")

    def test_a_store_of_one_disk_keeps_nothing_and_leaves_the_directory_alone(
        self, store, copies, tmp_path: Path
    ) -> None:
        if copies:
            pytest.skip("spark_state_copies is True: the store keeps copies (the other tests)")
        local = tmp_path / "task-1"
        write_batches(local, 2, 1)
        before = contents(local)
        assert isinstance(store().mirror("task-1", local, 1, 1), MirrorReport)
        assert store().restore("task-1", tmp_path / "elsewhere") is None
        assert store().restore("task-1", local) is None
        store().discard("task-1")
        assert contents(local) == before

    def test_restoring_a_task_never_mirrored_returns_none_and_leaves_the_directory_alone(
        self, store, tmp_path: Path
    ) -> None:
        local = tmp_path / "task-1"
        assert store().restore("task-1", local) is None
        assert not local.exists()
        write_batches(local, 1, 0)
        before = contents(local)
        assert store().restore("task-1", local) is None
        assert contents(local) == before

    def test_another_processor_restores_the_directory_as_of_the_mirrored_batch(
        self, store, copies, tmp_path: Path
    ) -> None:
        self._keeps_copies(copies)
        local = tmp_path / "here" / "task-1"
        write_batches(local, 3, 2)  # batch 3 planned, not committed: its files are left out
        report = store().mirror("task-1", local, 2, 1)
        expected = committed_contents(2)
        assert report.uploaded == len(expected) and report.uploaded_bytes == sum(map(len, expected.values()))
        assert report.deleted == 0
        elsewhere = tmp_path / "there" / "task-1"
        assert store().restore("task-1", elsewhere) == 2
        assert contents(elsewhere) == expected, "exactly Spark's directory as of the committed batch"

    def test_a_newer_copy_replaces_the_older_sending_only_new_files_and_dropping_purged_ones(
        self, store, copies, tmp_path: Path
    ) -> None:
        self._keeps_copies(copies)
        local, holder = tmp_path / "here" / "task-1", store()
        write_batches(local, 1, 1)
        holder.mirror("task-1", local, 1, 1)
        write_batches(local, 3, 3, purged_before=1)  # two batches on; Spark purged batch 0's files
        report = holder.mirror("task-1", local, 3, 1)
        assert report.uploaded == 6, "only the files of batches 2 and 3 are sent"
        assert report.deleted == 3, "batch 0's offsets, commit and state files are gone"
        elsewhere = tmp_path / "there" / "task-1"
        assert store().restore("task-1", elsewhere) == 3
        assert contents(elsewhere) == committed_contents(3, first=1)

    def test_a_restore_replaces_a_directory_behind_the_copy_and_keeps_one_as_far_on(
        self, store, copies, tmp_path: Path
    ) -> None:
        self._keeps_copies(copies)
        local = tmp_path / "here" / "task-1"
        write_batches(local, 4, 4)
        store().mirror("task-1", local, 4, 1)
        behind = tmp_path / "there" / "task-1"
        write_batches(behind, 2, 1)
        (behind / "state" / "0" / "0" / "stale.delta").write_text("stale")
        assert store().restore("task-1", behind) == 4
        assert contents(behind) == committed_contents(4), "the directory is replaced, not merged"

        ahead = tmp_path / "ahead" / "task-1"
        write_batches(ahead, 6, 5)
        before = contents(ahead)
        assert store().restore("task-1", ahead) == 4, "the stored copy's batch"
        assert contents(ahead) == before, "a directory as far on or further is left alone"

    def test_a_directory_of_another_spark_history_is_replaced_by_the_copy_even_when_further_on(
        self, store, copies, tmp_path: Path
    ) -> None:
        self._keeps_copies(copies)
        current = tmp_path / "here" / "task-1"
        write_batches(current, 2, 2, history="run-2")
        store().mirror("task-1", current, 2, 1)
        left_over = tmp_path / "there" / "task-1"  # this machine ran the task before a drain, further on
        write_batches(left_over, 6, 6, history="run-1")
        assert store().restore("task-1", left_over) == 2
        assert contents(left_over) == committed_contents(2, history="run-2"), "batch 6 of an older history won"

    def test_a_new_history_is_sent_whole_even_where_names_and_sizes_repeat(
        self, store, copies, tmp_path: Path
    ) -> None:
        self._keeps_copies(copies)
        local, holder = tmp_path / "here" / "task-1", store()
        write_batches(local, 1, 1, history="run-1")
        holder.mirror("task-1", local, 1, 1)
        shutil.rmtree(local)
        write_batches(local, 1, 1, history="run-2")  # a fresh Spark checkpoint: same names, same sizes
        report = holder.mirror("task-1", local, 1, 1)
        assert report.uploaded == len(committed_contents(1)), "every file of the new history is sent"
        elsewhere = tmp_path / "there" / "task-1"
        assert store().restore("task-1", elsewhere) == 1
        assert contents(elsewhere) == committed_contents(1, history="run-2")

    def test_a_file_rewritten_under_its_name_and_size_is_sent_again(self, store, copies, tmp_path: Path) -> None:
        """Spark runs a batch again after a crash and rewrites its state file under the same name; the size may
        well repeat. The copy must take the new file, or a restore elsewhere returns the old state."""
        self._keeps_copies(copies)
        local, holder = tmp_path / "here" / "task-1", store()
        write_batches(local, 1, 1)
        holder.mirror("task-1", local, 1, 1)
        rewritten = local / "state" / "0" / "0" / "2.delta"
        before = rewritten.stat().st_mtime_ns
        rewritten.write_text("STATE 2")  # same size, other content
        # written seconds later in life; here within the file system's timestamp granularity, so say so
        os.utime(rewritten, ns=(before + 1_000_000_000, before + 1_000_000_000))
        report = holder.mirror("task-1", local, 1, 1)
        assert report.uploaded == 1, "the rewritten file, and nothing else"
        elsewhere = tmp_path / "there" / "task-1"
        assert store().restore("task-1", elsewhere) == 1
        assert contents(elsewhere)["state/0/0/2.delta"] == "STATE 2"
        assert store().mirror("task-1", elsewhere, 1, 2).uploaded == 0, "what a restore fetched is not sent back"

    def test_tasks_are_independent(self, store, copies, tmp_path: Path) -> None:
        self._keeps_copies(copies)
        one, two = tmp_path / "one", tmp_path / "two"
        write_batches(one, 1, 1)
        write_batches(two, 3, 3)
        store().mirror("task-1", one, 1, 1)
        store().mirror("task-2", two, 3, 1)
        assert store().restore("task-1", tmp_path / "r1") == 1
        assert store().restore("task-2", tmp_path / "r2") == 3
        assert contents(tmp_path / "r1") == committed_contents(1)
        assert contents(tmp_path / "r2") == committed_contents(3)
        assert store().restore("task-3", tmp_path / "r3") is None

    def test_a_holder_of_an_earlier_epoch_is_fenced_off(self, store, copies, tmp_path: Path) -> None:
        self._keeps_copies(copies)
        local = tmp_path / "here" / "task-1"
        write_batches(local, 1, 1)
        old = store()
        old.mirror("task-1", local, 1, 1)
        new = store()
        assert new.restore("task-1", tmp_path / "there" / "task-1") == 1  # the next holder takes over
        write_batches(tmp_path / "there" / "task-1", 2, 2)
        new.mirror("task-1", tmp_path / "there" / "task-1", 2, 2)
        write_batches(local, 3, 3)
        with pytest.raises(FencedOffError):
            old.mirror("task-1", local, 3, 1)
        with pytest.raises(FencedOffError):
            store().mirror("task-1", local, 3, 1)
        assert store().restore("task-1", tmp_path / "check") == 2, "the fenced writes changed nothing"
        assert contents(tmp_path / "check") == committed_contents(2)

    def test_a_discarded_copy_is_gone_and_a_new_run_mirrors_afresh(self, store, copies, tmp_path: Path) -> None:
        self._keeps_copies(copies)
        local, holder = tmp_path / "here" / "task-1", store()
        write_batches(local, 3, 3)
        holder.mirror("task-1", local, 3, 1)
        holder.discard("task-1")
        assert store().restore("task-1", tmp_path / "gone") is None
        assert not (tmp_path / "gone").exists()
        store().discard("task-1")  # nothing stored: nothing happens
        store().discard("never-mirrored")

        fresh = tmp_path / "fresh" / "task-1"  # the new run's fresh Spark checkpoint
        write_batches(fresh, 0, 0)
        report = holder.mirror("task-1", fresh, 0, 1)
        assert report.uploaded == len(committed_contents(0)), "nothing of the discarded copy counts as stored"
        assert store().restore("task-1", tmp_path / "again") == 0
        assert contents(tmp_path / "again") == committed_contents(0)

    def test_close_is_idempotent(self, weirflow_backend: Backend, job_name: str) -> None:
        store = weirflow_backend.spark_state_store(job_name)
        store.close()
        store.close()
