"""The unmodified azure-eventhub SDK against the emulator: properties, sends, every starting position, epoch
stealing, big events, durability. Every expectation is exact (sequence numbers and payloads)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from azure.eventhub import EventData, EventHubConsumerClient, EventHubProducerClient
from azure.eventhub._buffered_producer._partition_resolver import PartitionResolver
from azure.eventhub.exceptions import EventHubError

from weirflow.testing import wait_until
from weirflow_azure.eventhubs.lookup3 import partition_for_key

pytestmark = pytest.mark.integration


class Receiver:
    """One SDK consumer on one partition, collecting events in a background thread."""

    def __init__(self, connection_string: str, partition: str, start: Any, **kwargs: Any) -> None:
        self.events: list[Any] = []
        self.errors: list[BaseException] = []
        self.client = EventHubConsumerClient.from_connection_string(connection_string, consumer_group="$Default")
        self.thread = threading.Thread(
            target=self.client.receive,
            kwargs={
                "on_event": lambda _ctx, event: self.events.append(event),
                "on_error": lambda _ctx, error: self.errors.append(error),
                "partition_id": partition,
                "starting_position": start,
                **kwargs,
            },
            daemon=True,
        )
        self.thread.start()

    def wait_for(self, count: int, timeout_s: float = 30) -> list[Any]:
        wait_until(lambda: len(self.events) >= count, timeout_s, f"{count} events")
        return self.events

    def close(self) -> None:
        self.client.close()
        self.thread.join(10)


@pytest.fixture
def hub(eventhubs_emulator) -> Iterator[tuple[Any, EventHubProducerClient]]:
    emulator = eventhubs_emulator({"views": 4})
    producer = EventHubProducerClient.from_connection_string(emulator.connection_string("views"))
    yield emulator, producer
    producer.close()


def receive(emulator: Any, partition: str, start: Any, count: int, **kwargs: Any) -> list[Any]:
    receiver = Receiver(emulator.connection_string("views"), partition, start, **kwargs)
    try:
        return list(receiver.wait_for(count))
    finally:
        receiver.close()


def send(producer: EventHubProducerClient, bodies: list[str], **batch_args: Any) -> None:
    batch = producer.create_batch(**batch_args)
    for body in bodies:
        batch.add(EventData(body))
    producer.send_batch(batch)


def test_hub_and_partition_properties(hub) -> None:
    _, producer = hub
    props = producer.get_eventhub_properties()
    assert props["eventhub_name"] == "views" and props["partition_ids"] == ["0", "1", "2", "3"]
    empty = producer.get_partition_properties("2")
    assert (empty["is_empty"], empty["beginning_sequence_number"], empty["last_enqueued_sequence_number"]) == (
        True,
        0,
        -1,
    )
    send(producer, ["a", "bb", "ccc"], partition_id="2")
    after = producer.get_partition_properties("2")
    assert (after["is_empty"], after["last_enqueued_sequence_number"]) == (False, 2)
    assert int(after["last_enqueued_offset"]) > 0


def test_a_missing_hub_is_an_error_naming_it(eventhubs_emulator) -> None:
    emulator = eventhubs_emulator({"views": 1})
    # one attempt: the SDK retries a management call's "not found" like any failure, which tests nothing here
    producer = EventHubProducerClient.from_connection_string(emulator.connection_string("nope"), retry_total=0)
    try:
        with pytest.raises(EventHubError, match="nope"):
            producer.get_eventhub_properties()
    finally:
        producer.close()


def test_sends_by_partition_by_key_and_round_robin_land_where_the_service_puts_them(hub) -> None:
    emulator, producer = hub
    send(producer, [f"p1-{i}" for i in range(5)], partition_id="1")
    send(producer, [f"key-{i}" for i in range(7)], partition_key="user-42")
    for i in range(8):
        producer.send_event(EventData(f"rr-{i}"))
    keyed = str(partition_for_key("user-42", 4))
    assert keyed == PartitionResolver(["0", "1", "2", "3"]).get_partition_id_by_partition_key("user-42")
    counts = {p: producer.get_partition_properties(p)["last_enqueued_sequence_number"] + 1 for p in "0123"}
    expected = {p: 2 for p in "0123"}  # round robin spread 8 events over 4 partitions
    expected["1"] += 5
    expected[keyed] += 7
    assert counts == expected
    events = receive(emulator, keyed, "-1", counts[keyed])
    keyed_events = [e for e in events if e.body_as_str().startswith("key-")]
    assert [e.body_as_str() for e in keyed_events] == [f"key-{i}" for i in range(7)]
    assert all(e.partition_key == b"user-42" for e in keyed_events)


def test_receiving_from_every_kind_of_starting_position(hub) -> None:
    emulator, producer = hub
    for i in range(10):
        producer.send_event(EventData(f"e{i}"), partition_id="0")
    everything = receive(emulator, "0", "-1", 10)
    assert [(e.sequence_number, e.body_as_str()) for e in everything] == [(i, f"e{i}") for i in range(10)]
    offsets = [e.offset for e in everything]
    assert offsets == sorted(offsets, key=int) and len(set(offsets)) == 10

    def bodies(start: Any, count: int, **kwargs: Any) -> list[str]:
        return [e.body_as_str() for e in receive(emulator, "0", start, count, **kwargs)]

    assert bodies(3, 6) == [f"e{i}" for i in range(4, 10)]  # sequence number, exclusive
    assert bodies(3, 7, starting_position_inclusive=True) == [f"e{i}" for i in range(3, 10)]
    assert bodies(offsets[4], 5) == [f"e{i}" for i in range(5, 10)]  # offset, exclusive
    assert bodies(offsets[4], 6, starting_position_inclusive=True) == [f"e{i}" for i in range(4, 10)]
    when = everything[5].enqueued_time
    later = [f"e{i}" for i, e in enumerate(everything) if e.enqueued_time > when]
    assert bodies(when, len(later)) == later  # enqueued time, exclusive

    latest = Receiver(emulator.connection_string("views"), "0", "@latest")
    try:
        wait_until(lambda: emulator.receivers("views", 0) == 1, 30, "the receiver to attach")
        producer.send_event(EventData("new-1"), partition_id="0")
        producer.send_event(EventData("new-2"), partition_id="0")
        assert [e.body_as_str() for e in latest.wait_for(2)] == ["new-1", "new-2"]
    finally:
        latest.close()


@pytest.mark.parametrize("level", [2, 1], ids=["higher", "equal"])
def test_an_equal_or_higher_epoch_steals_the_partition(hub, level: int) -> None:
    """The service's rule; the SDK's load balancer relies on the equal case when it claims a partition."""
    emulator, producer = hub
    send(producer, ["a", "b"], partition_id="3")
    first = Receiver(emulator.connection_string("views"), "3", "-1", owner_level=1)
    try:
        assert [e.body_as_str() for e in first.wait_for(2)] == ["a", "b"]
        second = Receiver(
            emulator.connection_string("views"), "3", 1, owner_level=level, starting_position_inclusive=True
        )
        try:
            wait_until(lambda: first.errors, 30, "the first receiver to be disconnected")
            assert "amqp:link:stolen" in str(first.errors[0])
            send(producer, ["c"], partition_id="3")
            assert [e.body_as_str() for e in second.wait_for(2)] == ["b", "c"]
            assert [e.body_as_str() for e in first.events] == ["a", "b"]
            lower = Receiver(emulator.connection_string("views"), "3", "-1", owner_level=0)
            try:
                wait_until(lambda: lower.errors, 30, "a lower epoch to be refused")
                assert lower.events == [] and emulator.receivers("views", 3) == 1
            finally:
                lower.close()
        finally:
            second.close()
    finally:
        first.close()


def test_an_event_of_300_kb_round_trips_byte_for_byte(hub) -> None:
    emulator, producer = hub
    body = bytes(range(256)) * 1200  # 307,200 bytes
    event = EventData(body)
    event.properties = {"kind": "big"}
    producer.send_event(event, partition_id="2")
    (received,) = receive(emulator, "2", "-1", 1)
    assert b"".join(received.body) == body
    assert received.properties == {b"kind": b"big"}


def test_with_a_data_dir_events_survive_a_restart(eventhubs_emulator, tmp_path) -> None:
    first = eventhubs_emulator({"views": 2}, data_dir=tmp_path / "eh")
    producer = EventHubProducerClient.from_connection_string(first.connection_string("views"))
    send(producer, ["x", "y"], partition_id="1")
    producer.close()
    first.stop()
    second = eventhubs_emulator({"views": 2}, data_dir=tmp_path / "eh")
    events = receive(second, "1", "-1", 2)
    assert [(e.sequence_number, e.body_as_str()) for e in events] == [(0, "x"), (1, "y")]
    producer = EventHubProducerClient.from_connection_string(second.connection_string("views"))
    try:
        send(producer, ["z"], partition_id="1")
        assert producer.get_partition_properties("1")["last_enqueued_sequence_number"] == 2
    finally:
        producer.close()
