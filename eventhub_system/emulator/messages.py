"""AMQP message surgery the emulator needs, on encoded bytes: split a message into its sections, recognise an
Event Hubs batch, read the partition key, and stamp the service's annotations onto a stored message.

Working on sections (with proton's `Data`, which decodes one value at a time and says how many bytes it used)
keeps every section the producer wrote byte for byte, whatever the SDK put in it.
"""

from __future__ import annotations

from typing import Any

from proton import Data, Described, Message, symbol, timestamp, ulong

HEADER, DELIVERY_ANNOTATIONS, MESSAGE_ANNOTATIONS = 0x70, 0x71, 0x72
DATA = 0x75

PARTITION_KEY = symbol("x-opt-partition-key")
SEQUENCE_NUMBER = symbol("x-opt-sequence-number")
OFFSET = symbol("x-opt-offset")
ENQUEUED_TIME = symbol("x-opt-enqueued-time")


def sections(encoded: bytes) -> list[tuple[int, Any, bytes]]:
    """``(descriptor code, value, raw bytes)`` of every section of an encoded message."""
    out = []
    at = 0
    view = memoryview(encoded)
    while at < len(encoded):
        data = Data()
        used = data.decode(bytes(view[at:]))
        if used <= 0:
            raise ValueError(f"undecodable AMQP section at byte {at}")
        data.rewind()
        data.next()
        value = data.get_object()
        # A section's descriptor is its ulong code; proton types it as any AMQP value, and int() refuses others.
        descriptor: Any = value.descriptor if isinstance(value, Described) else -1
        code = int(descriptor)
        inner = value.value if isinstance(value, Described) else value
        if isinstance(inner, memoryview):
            inner = bytes(inner)  # a view into `data`'s buffer, which dies with it
        out.append((code, inner, encoded[at : at + used]))
        at += used
    return out


def _annotations(parts: list[tuple[int, Any, bytes]]) -> dict[Any, Any]:
    for code, value, _ in parts:
        if code == MESSAGE_ANNOTATIONS and isinstance(value, dict):
            return value
    return {}


def partition_key_of(parts: list[tuple[int, Any, bytes]]) -> str | None:
    key = _annotations(parts).get(PARTITION_KEY)
    return None if key is None else str(key)


def split_batch(encoded: bytes) -> tuple[str | None, list[bytes]]:
    """The partition key and the events of one transfer: the inner messages of a batch (every data section
    holds a complete AMQP message), else the message itself."""
    parts = sections(encoded)
    key = partition_key_of(parts)
    bodies = [value for code, value, _ in parts if code == DATA]
    if bodies:
        inner: list[bytes] = []
        for body in bodies:
            try:
                inner_parts = sections(bytes(body))
            except (ValueError, Exception):
                inner = []
                break
            if not inner_parts or any(code < HEADER or code > 0x78 for code, _, _ in inner_parts):
                inner = []
                break
            inner.append(bytes(body))
        if inner:
            return key, inner
    return key, [encoded]


def stamped(message: bytes, sequence_number: int, offset: int, enqueued_ms: int, key: str | None) -> bytes:
    """``message`` with the service's message annotations added (other sections untouched)."""
    parts = sections(message)
    annotations = dict(_annotations(parts))
    annotations[SEQUENCE_NUMBER] = sequence_number
    annotations[OFFSET] = str(offset)
    annotations[ENQUEUED_TIME] = timestamp(enqueued_ms)
    if key is not None:
        annotations[PARTITION_KEY] = key
    data = Data()
    data.put_object(Described(ulong(MESSAGE_ANNOTATIONS), annotations))
    section = data.encode()
    before = b"".join(raw for code, _, raw in parts if code in (HEADER, DELIVERY_ANNOTATIONS))
    after = b"".join(
        raw for code, _, raw in parts if code not in (HEADER, DELIVERY_ANNOTATIONS, MESSAGE_ANNOTATIONS)
    )
    return before + section + after


def reply(correlation_id: Any, status: int, description: str, body: Any = None) -> Message:
    """A `$cbs` / `$management` reply: status in application properties, never a rejected delivery."""
    return Message(
        body=body,
        correlation_id=correlation_id,
        # `$cbs` reads status-description, `$management` statusDescription (pyamqp 5.15): send both.
        properties={"status-code": status, "status-description": description, "statusDescription": description},
    )
