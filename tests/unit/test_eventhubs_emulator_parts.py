"""Emulator parts without a network: key routing against the SDK's own resolver, frame padding."""

from __future__ import annotations

import random
import string
import struct

from azure.eventhub._buffered_producer._partition_resolver import PartitionResolver

from weirflow_azure.eventhubs.emulator.frames import FULL_FIELD_COUNT, FramePadder, pad_performative
from weirflow_azure.eventhubs.lookup3 import hashlittle2, partition_for_key


def test_partition_key_routing_equals_the_sdk_resolver_for_10000_keys() -> None:
    rng = random.Random(20261123)
    alphabet = string.ascii_letters + string.digits + "-_:/.@ é中"
    for count in (1, 2, 3, 4, 8, 32):
        resolver = PartitionResolver([str(p) for p in range(count)])
        for _ in range(10_000 // 6 + 1):
            key = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 48)))
            assert str(partition_for_key(key, count)) == resolver.get_partition_id_by_partition_key(key), key


def test_lookup3_known_values() -> None:
    # Jenkins' lookup3 driver: hashlittle2("", 0, 0) = (0xdeadbeef, 0xdeadbeef) and for
    # "Four score and seven years ago" with (0, 0): c = 0x17770551, b = 0xce7226e6.
    assert hashlittle2(b"") == (0xDEADBEEF, 0xDEADBEEF)
    assert hashlittle2(b"Four score and seven years ago") == (0x17770551, 0xCE7226E6)


def _frame(body: bytes) -> bytes:
    return struct.pack(">IBBH", 8 + len(body), 2, 0, 0) + body


def test_a_short_performative_is_padded_to_its_full_field_list() -> None:
    close = bytes([0x00, 0x53, 0x18, 0x45])  # close with an empty list
    padded = pad_performative(close)
    assert padded == bytes([0x00, 0x53, 0x18, 0xD0]) + struct.pack(">II", 5, 1) + b"\x40"
    transfer = bytes([0x00, 0x53, 0x14, 0xC0, 0x03, 0x02, 0x43, 0x43])  # handle 0, delivery-id 0
    payload = b"\x00\x53\x75\xa0\x03abc"
    out = pad_performative(transfer + payload)
    assert out.endswith(payload)
    assert struct.unpack(">I", out[8:12])[0] == FULL_FIELD_COUNT[0x14]
    assert out[12:14] == b"\x43\x43" and out[14 : 14 + 9] == b"\x40" * 9


def test_the_padder_reframes_a_stream_cut_anywhere() -> None:
    stream = (
        b"AMQP\x00\x01\x00\x00"
        + _frame(bytes([0x00, 0x53, 0x17, 0x45]))
        + _frame(b"")
        + _frame(bytes([0x00, 0x53, 0x18, 0x45]))
    )
    whole = FramePadder().feed(stream)
    padder = FramePadder()
    pieces = b"".join(padder.feed(stream[i : i + 3]) for i in range(0, len(stream), 3))
    assert pieces == whole
    assert whole.startswith(b"AMQP\x00\x01\x00\x00")
    first_size = struct.unpack(">I", whole[8:12])[0]
    assert first_size == 8 + 3 + 9 + 1  # header + descriptor + list32 header + one null


def test_a_stored_event_is_sent_with_the_service_s_annotations_stamped_once_and_again_after_a_reopen(
    tmp_path,
) -> None:
    """Consumers are sent `StoredEvent.wire` as it is: it must carry the stamp of the event's own sequence
    number, offset, enqueue time and key, also when the partition is read back from its file."""
    from proton import Message

    from weirflow_azure.eventhubs.emulator.store import EventStore

    store = EventStore({"hub": 1}, tmp_path)
    sent = [Message(body=f"event {n}".encode()).encode() for n in range(3)]
    written = [store.append("hub", 0, message, "user-7" if n == 1 else None) for n, message in enumerate(sent)]
    store.close()
    reopened = EventStore({"hub": 1}, tmp_path).hubs["hub"].partitions[0].events
    for events in (written, reopened):
        for n, event in enumerate(events):
            message = Message()
            message.decode(event.wire)
            annotations = {str(k): v for k, v in message.annotations.items()}  # keys are AMQP symbols
            assert message.body == f"event {n}".encode()
            assert annotations["x-opt-sequence-number"] == n
            assert annotations["x-opt-offset"] == str(event.offset)
            assert int(annotations["x-opt-enqueued-time"]) == event.enqueued_ms
            assert annotations.get("x-opt-partition-key") == ("user-7" if n == 1 else None)
            assert event.message == sent[n]
            assert event.wire is event.wire, "stamped again at a second delivery"
