"""The sink's fence (weirflow.spark.fence), on the embedded backend: a Spark worker writes a partition of a
micro-batch only while the query's processor run still holds the task's lock. The writer is driven directly,
as a Spark worker would call it, over a real SQLite job database and a real local stream."""

from __future__ import annotations

import time
from pathlib import Path

import pyarrow as pa
import pytest

from weirflow.base.errors import LockLostError
from weirflow.config.loader import Config
from weirflow.interfaces.system import StreamSpec, SystemStreamPartition
from weirflow.job.systems import Systems
from weirflow.local.coordination import SqliteCoordinationUtils
from weirflow.local.factories import job_database_path
from weirflow.spark import fence
from weirflow.spark.sink import WeirflowStreamWriter
from weirflow.testing import wait_until

LEASE_MS = 1500  # not renewed here: long enough for a first write (which opens the output stream)


def _config(tmp_path: Path) -> Config:
    return Config.from_dict(
        {
            "job.name": "fenced",
            "job.state.dir": str(tmp_path),
            "job.coordinator.lease.duration.ms": LEASE_MS,
            "streams.out.partitions": 1,
        }
    )


def _written(config: Config) -> int:
    systems = Systems(config)
    try:
        return len(systems.consumer("local").read(SystemStreamPartition("local", "out", 0), "0", 1000))
    finally:
        systems.close()


def test_a_worker_writes_only_while_the_query_s_processor_run_holds_the_lock(tmp_path: Path) -> None:
    config = _config(tmp_path)
    systems = Systems(config)
    systems.admin("local").create_stream(StreamSpec("out", 1))
    systems.close()
    db = job_database_path(config)
    holder = SqliteCoordinationUtils(db, "p1", LEASE_MS, instance="run-1")
    successor = SqliteCoordinationUtils(db, "p2", LEASE_MS, instance="run-1")
    try:
        lock = holder.lock("task-main-0")
        assert lock.try_acquire()
        sinks = [{"stream": "out", "system": "local", "physical": "out"}]
        writer = WeirflowStreamWriter(config.snapshot(), sinks, fence.Fence([fence.LockRef.of(lock)]))
        rows = pa.record_batch({"__key": pa.array([b"k"], pa.binary()), "__value": pa.array([b'{"n":1}'])})

        writer.write(iter([rows]))
        assert _written(config) == 1

        # the processor is paused: its lease runs out and another processor takes the task
        wait_until(
            lambda: successor.lock("task-main-0").try_acquire(),
            10,
            "the successor to get the lock",
            interval_s=0.05,
        )
        with pytest.raises(LockLostError):
            writer.write(iter([rows]))
        assert _written(config) == 1, "a batch was written after the lock moved"
        # the same owner in another run of the process is another holder
        other_run = SqliteCoordinationUtils(db, "p2", LEASE_MS, instance="run-2")
        try:
            ref = fence.LockRef.of(other_run.lock("task-main-0"))
            stale = WeirflowStreamWriter(config.snapshot(), sinks, fence.Fence([ref]))
            with pytest.raises(LockLostError):
                stale.write(iter([rows]))
        finally:
            other_run.close()
        assert fence.decode(fence.encode([fence.LockRef.of(lock)])).locks[0].instance == "run-1"
    finally:
        holder.close()
        successor.close()


def test_a_partition_whose_rows_arrive_over_time_is_checked_before_every_send(tmp_path: Path) -> None:
    """Spark hands a partition to the writer as a stream of Arrow batches; a slow transform upstream spreads
    them over time. The lock can move between two of them: what follows is refused, what preceded stays."""
    config = _config(tmp_path)
    systems = Systems(config)
    systems.admin("local").create_stream(StreamSpec("out", 1))
    systems.close()
    db = job_database_path(config)
    holder = SqliteCoordinationUtils(db, "p1", LEASE_MS, instance="run-1")
    successor = SqliteCoordinationUtils(db, "p2", LEASE_MS, instance="run-1")
    try:
        lock = holder.lock("task-main-0")
        assert lock.try_acquire()
        sinks = [{"stream": "out", "system": "local", "physical": "out"}]
        writer = WeirflowStreamWriter(config.snapshot(), sinks, fence.Fence([fence.LockRef.of(lock)]))

        def batches():
            for n in range(3):
                if n == 1:  # between the first and the second batch the lease runs out and the task moves
                    wait_until(
                        lambda: successor.lock("task-main-0").try_acquire(),
                        10,
                        "the successor to get the lock",
                        interval_s=0.05,
                    )
                yield pa.record_batch(
                    {"__key": pa.array([b"k"], pa.binary()), "__value": pa.array([f'{{"n":{n}}}'.encode()])}
                )

        with pytest.raises(LockLostError):
            writer.write(batches())
        assert _written(config) == 1, "the partition went on writing after its lock moved"
    finally:
        holder.close()
        successor.close()


def test_a_worker_stops_sending_at_its_keeper_s_deadline_before_the_store_says_anything(tmp_path: Path) -> None:
    """The processor publishes each held lock's ``deadline - margin`` (`fence.LeaseBoard`); a paused processor
    publishes nothing more, so its workers refuse from that moment on although the store still shows the lock
    held (its lease has not expired yet: nobody else can have it). A lock left off the board is refused at once."""
    config = _config(tmp_path)
    systems = Systems(config)
    systems.admin("local").create_stream(StreamSpec("out", 1))
    systems.close()
    holder = SqliteCoordinationUtils(job_database_path(config), "p1", 60_000, instance="run-1")
    try:
        lock = holder.lock("task-main-0")
        assert lock.try_acquire()
        board = fence.LeaseBoard(tmp_path / "_leases" / "p1.json")
        board.publish({lock.name: time.monotonic() + 30})
        sinks = [{"stream": "out", "system": "local", "physical": "out"}]
        writer = WeirflowStreamWriter(
            config.snapshot(), sinks, fence.decode(fence.encode([fence.LockRef.of(lock)], board.path))
        )
        rows = pa.record_batch({"__key": pa.array([b"k"], pa.binary()), "__value": pa.array([b'{"n":1}'])})
        writer.write(iter([rows]))
        assert _written(config) == 1

        board.publish({lock.name: time.monotonic() - 0.001})  # the last renewal confirmed is too old now
        assert lock.is_held(), "the store still shows the lock held: only the deadline can refuse"
        with pytest.raises(LockLostError, match="not renewed in time"):
            writer.write(iter([rows]))
        board.publish({})  # abandoned or released: off the board
        with pytest.raises(LockLostError):
            writer.write(iter([rows]))
        board.close()  # the processor stopped: no board, nothing sent
        with pytest.raises(LockLostError):
            writer.write(iter([rows]))
        assert _written(config) == 1, "a batch was sent past its keeper's deadline"
    finally:
        holder.close()
