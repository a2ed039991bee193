"""The `eventhub` system (admin, consumer, producer) over the SDK, against the emulator."""

from __future__ import annotations

import base64
import json
import random
from collections.abc import Iterator

import pytest

from weirflow.base.errors import ConfigError, RecordTooLargeError, StreamExistsError, StreamNotFoundError
from weirflow.config.loader import Config
from weirflow.interfaces.system import OutgoingRecord, StreamSpec, SystemStreamPartition
from weirflow.job.systems import Systems
from weirflow.spark.fence import Fence
from weirflow.spark.sink import WeirflowStreamWriter
from weirflow_azure.eventhubs.clients import EventHubSystemConsumer, _PartitionReader
from weirflow_azure.eventhubs.lookup3 import partition_for_key

pytestmark = pytest.mark.integration


def make_config(connection_string: str, **extra: object) -> Config:
    return Config.from_dict(
        {
            "job.name": "eh-test",
            "systems.eh.factory": "eventhub",
            "systems.eh.connection.string": connection_string,
            "streams.views.system": "eh",
            "streams.views.partitions": 4,
            **extra,
        },
        source="job.yaml",
    )


@pytest.fixture
def systems(eventhubs_emulator) -> Iterator[Systems]:
    emulator = eventhubs_emulator({"views": 4, "small": 2, "small.dlq": 2})
    systems = Systems(make_config(emulator.connection_string()))
    yield systems
    systems.close()


def test_admin_checks_hubs_instead_of_creating_them(systems: Systems) -> None:
    admin = systems.admin("eh")
    assert admin.create_stream(StreamSpec("views", 4)) is False
    assert admin.list_streams() == {"views": 4}
    with pytest.raises(StreamExistsError, match="'small' has 2 partitions, the job needs 8"):
        admin.create_stream(StreamSpec("small", 8))
    with pytest.raises(StreamNotFoundError, match="event hub 'missing'.*--hub missing:N"):
        admin.create_stream(StreamSpec("missing", 1))
    meta = admin.partition_metadata("views")
    assert all(m.newest is None and m.oldest == m.upcoming == "0" for m in meta.values())


def test_a_missing_hub_is_known_from_one_answer_of_the_service_not_after_the_sdk_s_retries(
    systems: Systems, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The SDK retries every failed management request with back-off, "not found" too (13 s with its
    defaults); the first call for a hub asks once, so a wrong name fails at once and no retrying client is
    made for it, while a hub that exists gets its shared client after the same one-shot question."""
    admin = systems.admin("eh")
    settings = admin._clients.settings
    made: list[tuple[str, dict[str, object]]] = []
    real = type(settings).producer

    def producer(self: object, hub: str, **options: object) -> object:
        made.append((hub, options))
        return real(self, hub, **options)

    monkeypatch.setattr(type(settings), "producer", producer)
    with pytest.raises(StreamNotFoundError, match="event hub 'nowhere' does not exist"):
        admin.partition_count("nowhere")
    assert made == [("nowhere", {"retry_total": 0})], "only the one-shot client was made for a missing hub"
    assert admin.partition_count("views") == 4
    assert made[1:] == [("views", {"retry_total": 0}), ("views", {})]
    assert admin.partition_count("views") == 4 and len(made) == 3, "the question is asked once per hub"


def test_reads_cover_exact_ranges_with_no_gap_or_overlap(systems: Systems) -> None:
    producer, consumer = systems.producer("eh"), systems.consumer("eh")
    producer.send([OutgoingRecord("views", f"v{i}".encode(), partition=2) for i in range(1500)])
    ssp = SystemStreamPartition("eh", "views", 2)
    assert systems.admin("eh").partition_metadata("views")[2].upcoming == "1500"
    rng = random.Random(5)
    position, seen = 0, []
    while position < 1500:
        end = min(1500, position + rng.randint(1, 300))
        records = consumer.read(ssp, str(position), 10_000, end=str(end))
        assert [int(r.offset) for r in records] == list(range(position, end))
        seen += [r.value for r in records]
        position = end
    assert seen == [f"v{i}".encode() for i in range(1500)]
    assert consumer.read(ssp, "1500", 100) == []
    again = consumer.read(ssp, "700", 5)  # going back reopens the receiver at the right place
    assert [r.value for r in again] == [f"v{i}".encode() for i in range(700, 705)]


def test_a_backlog_is_read_with_catch_up_credit_and_a_live_partition_with_the_small_one(systems: Systems) -> None:
    """`systems.<name>.catch-up.prefetch` (300) while a read has a backlog; `prefetch` (20) once live."""
    producer, consumer = systems.producer("eh"), systems.consumer("eh")
    producer.send([OutgoingRecord("views", f"v{i}".encode(), partition=1) for i in range(1000)])
    ssp = SystemStreamPartition("eh", "views", 1)

    def credit() -> int:
        return consumer._readers[ssp].prefetch

    assert consumer.warm(ssp, "0", "1000") is True
    assert credit() == 300, "a planned read of 1,000 events catches up"
    position, seen = 0, []
    while position < 1000:
        records = consumer.read(ssp, str(position), 400, end="1000")
        seen += [r.value for r in records]
        position = int(records[-1].next_offset)
        assert credit() == 300, "the tail of a catch-up read keeps the receiver"
    assert seen == [f"v{i}".encode() for i in range(1000)]

    producer.send([OutgoingRecord("views", f"v{i}".encode(), partition=1) for i in range(1000, 1005)])
    consumer.warm(ssp, "1000", "1005")  # a small planned read: the partition is live
    assert credit() == 20
    assert [r.value for r in consumer.read(ssp, "1000", 100, end="1005")] == [
        f"v{i}".encode() for i in range(1000, 1005)
    ]

    fresh = EventHubSystemConsumer(consumer._settings)
    try:
        assert len(fresh.read(ssp, "0", 50)) == 50
        assert fresh._readers[ssp].prefetch == 300, "opened 1,005 events behind the end"
        assert len(fresh.read(ssp, "1000", 50)) == 5
        assert fresh._readers[ssp].prefetch == 20, "reopened near the end"
    finally:
        fresh.close()


def test_a_receiver_behind_a_read_skips_forward_to_it_and_one_far_behind_or_ahead_is_replaced(
    systems: Systems, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two consumers take turns on one partition's ranges, as two Python workers of a Spark executor do: each
    finds its receiver behind by the range the other read, and moves it forward instead of attaching another
    (after asking where the partition ends). Going back, or further ahead than `SKIP_MAX_EVENTS`, replaces
    it."""
    producer = systems.producer("eh")
    producer.send([OutgoingRecord("views", f"v{i}".encode(), partition=3) for i in range(1000)])
    ssp = SystemStreamPartition("eh", "views", 3)
    workers = [systems.consumer("eh"), EventHubSystemConsumer(systems.consumer("eh")._settings)]
    try:
        seen: list[bytes] = []
        receivers: list[set[int]] = [set(), set()]
        for n, start in enumerate(range(0, 1000, 100)):
            worker = workers[n % 2]
            records = worker.read(ssp, str(start), 10_000, end=str(start + 100))
            assert [int(r.offset) for r in records] == list(range(start, start + 100))
            seen += [r.value for r in records]
            receivers[n % 2].add(id(worker._readers[ssp]))
        assert seen == [f"v{i}".encode() for i in range(1000)]
        assert [len(r) for r in receivers] == [1, 1], "a receiver was replaced on a read ahead of it"

        first = workers[0]._readers[ssp]
        assert [r.value for r in workers[0].read(ssp, "500", 3)] == [b"v500", b"v501", b"v502"]
        assert workers[0]._readers[ssp] is not first, "going back reopens the receiver"
        monkeypatch.setattr(_PartitionReader, "SKIP_MAX_EVENTS", 100)
        second = workers[0]._readers[ssp]
        assert [r.value for r in workers[0].read(ssp, "900", 2)] == [b"v900", b"v901"]
        assert workers[0]._readers[ssp] is not second, "397 events ahead of a 100-event skip: reopened"
    finally:
        workers[1].close()


def test_a_receiver_whose_buffer_runs_dry_on_the_tail_of_a_planned_read_keeps_its_catch_up_credit(
    systems: Systems, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A busy machine: every read finds the receiver's buffer empty (events still in flight), so each read
    of the planned range asks where the partition ends; the tail of the plan still keeps the receiver."""
    producer, consumer = systems.producer("eh"), systems.consumer("eh")
    producer.send([OutgoingRecord("views", f"v{i}".encode(), partition=2) for i in range(1000)])
    ssp = SystemStreamPartition("eh", "views", 2)
    monkeypatch.setattr(_PartitionReader, "buffered", lambda self: 0)
    consumer.warm(ssp, "0", "1000")
    receiver = consumer._readers[ssp]
    seen = []
    for position, count in ((0, 400), (400, 400), (800, 100)):  # the last: 200 events from the end
        seen += [r.value for r in consumer.read(ssp, str(position), count, end="1000")]
        assert consumer._readers[ssp] is receiver, f"the receiver was replaced at {position}"
    receiver.error = RuntimeError("link detached")  # a receiver that fails on the tail is reopened ...
    seen += [r.value for r in consumer.read(ssp, "900", 400, end="1000")]
    assert consumer._readers[ssp] is not receiver
    assert consumer._readers[ssp].prefetch == 300, "... with its catch-up credit"
    assert seen == [f"v{i}".encode() for i in range(1000)]


def test_the_producer_fills_batches_and_refuses_an_event_over_the_limit(systems: Systems) -> None:
    producer, admin = systems.producer("eh"), systems.admin("eh")
    producer.send([OutgoingRecord("views", bytes(1000), partition=0) for _ in range(3000)])  # > one 1 MB batch
    assert admin.partition_metadata("views")[0].upcoming == "3000"
    big = OutgoingRecord("views", bytes(2 * 1024 * 1024), partition=1)
    small = [OutgoingRecord("views", b"ok", partition=1) for _ in range(2)]
    with pytest.raises(RecordTooLargeError) as err:
        producer.send([small[0], big, small[1]])
    assert err.value.records == [big]
    assert "exceeds the" in err.value.reasons[0] and "event hub 'views'" in err.value.reasons[0]
    assert admin.partition_metadata("views")[1].upcoming == "0", "nothing is sent when a record is refused"


def test_the_spark_sink_dead_letters_an_event_over_the_limit_and_sends_the_rest(systems: Systems) -> None:
    producer, consumer = systems.producer("eh"), systems.consumer("eh")
    big = OutgoingRecord("small", bytes(2 * 1024 * 1024), key=b"k1", partition=0)
    fine = [OutgoingRecord("small", f"r{i}".encode(), partition=0) for i in range(3)]

    class CountingFence(Fence):
        checks = 0

        def check(self, snapshot: str) -> None:
            CountingFence.checks += 1

    WeirflowStreamWriter("", [], CountingFence())._send(producer, [fine[0], big, fine[1], fine[2]])
    sent = consumer.read(SystemStreamPartition("eh", "small", 0), "0", 10)
    assert [r.value for r in sent] == [b"r0", b"r1", b"r2"]
    assert CountingFence.checks == 2, "the fence before each batch sent: the dead letter's, then the rest's"
    (letter,) = [json.loads(r.value) for r in consumer.read(SystemStreamPartition("eh", "small.dlq", 0), "0", 10)]
    assert letter["stream"] == "small" and letter["size"] == 2 * 1024 * 1024
    assert "exceeds the" in letter["error"] and base64.b64decode(letter["key_base64"]) == b"k1"


@pytest.mark.parametrize("method", ["hash", "round_robin", "key_as_partition"])
def test_partition_methods(eventhubs_emulator, method: str) -> None:
    emulator = eventhubs_emulator({"views": 4})
    systems = Systems(make_config(emulator.connection_string(), **{"systems.eh.partition.method": method}))
    try:
        keys = [b"3", b"1", b"2", b"3"] * 5
        systems.producer("eh").send([OutgoingRecord("views", b"x", key=k) for k in keys])
        counts = {p: int(m.upcoming) for p, m in systems.admin("eh").partition_metadata("views").items()}
        if method == "hash":
            expected = {p: 0 for p in range(4)}
            for key in keys:
                expected[partition_for_key(key.decode(), 4)] += 1
        elif method == "key_as_partition":
            expected = {0: 0, 1: 5, 2: 5, 3: 10}
        else:
            expected = {p: 5 for p in range(4)}
        assert counts == expected
    finally:
        systems.close()


def test_a_system_without_a_namespace_is_a_config_error_naming_the_key() -> None:
    config = Config.from_dict({"job.name": "x", "systems.eh.factory": "eventhub"}, source="job.yaml")
    with pytest.raises(ConfigError, match="systems.eh.connection.string.*job.yaml"):
        Systems(config).admin("eh")
