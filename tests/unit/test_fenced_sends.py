"""Every system's fenced send checks the fence within the fence's margin of the write it lets through
(docs/guarantees.md, "The fence"). The embedded log checks once its write lock is held
(`LocalSystemProducer.send_fenced`): taking the lock can wait out SQLite's busy timeout (10 s) behind another
process's write, longer than the margin (a third of the lease, 5 s by default), so a check made before the
wait would let a writer whose lease ran out meanwhile write after the task's next holder read back what was
written. Kinesis and Event Hubs check before every attempt and bound an attempt by `FENCED_ATTEMPT_S`."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from weirflow.base.errors import LockLostError
from weirflow.config.keys import KEYS
from weirflow.config.loader import Config
from weirflow.interfaces.system import FENCED_ATTEMPT_S, OutgoingRecord, StreamSpec, SystemStreamPartition
from weirflow.job.systems import Systems


def test_a_send_that_waited_for_the_log_s_lock_checks_the_fence_after_the_wait(tmp_path: Path) -> None:
    config = Config.from_dict({"job.name": "fenced", "job.state.dir": str(tmp_path)})
    systems = Systems(config)
    try:
        systems.admin("local").create_stream(StreamSpec("out", 1))
        producer = systems.producer("local")
        path = producer._store.path  # type: ignore[attr-defined]
        lost = threading.Event()
        checks: list[bool] = []

        def check() -> None:
            checks.append(lost.is_set())
            if lost.is_set():
                raise LockLostError("task-0", "p0")

        # another process's long write holds the log's lock
        other = sqlite3.connect(path, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")
        # the sender reaches the log's transaction (and waits there for the lock): any check made before the wait
        # is made by then
        store = producer._store  # type: ignore[attr-defined]
        taking, transaction = threading.Event(), store.db.transaction

        @contextmanager
        def observed() -> Iterator[sqlite3.Connection]:
            taking.set()
            with transaction() as conn:
                yield conn

        store.db.transaction = observed
        failure: list[BaseException] = []

        def send() -> None:
            try:
                producer.send_fenced([OutgoingRecord("out", b"late", partition=0)], check)
            except BaseException as exc:  # handed to the test thread
                failure.append(exc)

        sender = threading.Thread(target=send)
        sender.start()
        assert taking.wait(10)
        lost.set()  # the lease ran out while the sender waited
        other.execute("COMMIT")
        other.close()
        sender.join(30)
        assert not sender.is_alive()
        assert failure and isinstance(failure[0], LockLostError), (failure, checks)
        assert checks[-1] is True, "the fence was checked after the lock was taken"
        written = systems.consumer("local").read(SystemStreamPartition("local", "out", 0), "0", 10)
        assert written == [], "nothing written by a sender whose lease ran out while it waited"
    finally:
        systems.close()


def test_a_fenced_send_writes_while_the_fence_holds(tmp_path: Path) -> None:
    config = Config.from_dict({"job.name": "fenced", "job.state.dir": str(tmp_path)})
    systems = Systems(config)
    try:
        systems.admin("local").create_stream(StreamSpec("out", 1))
        calls = []
        systems.producer("local").send_fenced([OutgoingRecord("out", b"v", partition=0)], lambda: calls.append(1))
        assert calls == [1]
        written = systems.consumer("local").read(SystemStreamPartition("local", "out", 0), "0", 10)
        assert [r.value for r in written] == [b"v"]
        with pytest.raises(LockLostError):
            systems.producer("local").send_fenced([], lambda: (_ for _ in ()).throw(LockLostError("t", "p")))
    finally:
        systems.close()


def test_one_attempt_of_a_fenced_send_fits_in_the_default_margin() -> None:
    lease_ms = next(k.default for k in KEYS if k.name == "job.coordinator.lease.duration.ms")
    assert FENCED_ATTEMPT_S * 1000 < lease_ms / 3, "the default margin is a third of the lease"


def test_kinesis_fenced_sends_make_one_bounded_attempt_per_check() -> None:
    from weirflow_kinesis.clients import KinesisClients
    from weirflow_kinesis.settings import KinesisSettings

    config = Config.from_dict(
        {
            "job.name": "j",
            "systems.ks.factory": "kinesis",
            "systems.ks.endpoint": "http://localhost:4567",
            "systems.ks.region": "us-east-1",
        }
    )
    clients = KinesisClients(KinesisSettings.from_config("ks", config))
    try:
        fenced = clients.fenced_client.meta.config
        assert fenced.retries["total_max_attempts"] == 1, "boto3 retrying would skip the fence's check"
        assert fenced.connect_timeout + fenced.read_timeout <= FENCED_ATTEMPT_S
        assert clients.client.meta.config.retries["total_max_attempts"] > 1, "unfenced calls keep boto3's retries"
    finally:
        clients.close()
