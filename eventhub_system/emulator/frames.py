"""Full-length AMQP performatives: pad every frame the emulator sends with its trailing null fields.

proton-c omits trailing null fields of a performative (the AMQP spec allows it), but the pyamqp transport of
azure-eventhub 5.15 reads fields by position and fails with "list index out of range" on a short list
(verified against the unmodified SDK; docs/eventhubs.md describes the emulator). `FramePadder` sits between
proton's output and the socket: it cuts the byte stream into protocol headers and frames, and rewrites each
AMQP performative's field list to its full length, appending nulls (``0x40``) and fixing the list and frame
sizes. Payloads (a transfer's message bytes) follow unchanged. SASL frames and empty (heartbeat) frames pass
through.
"""

from __future__ import annotations

import struct

# Performative descriptor code -> number of fields in the AMQP 1.0 spec.
FULL_FIELD_COUNT = {
    0x10: 10,  # open
    0x11: 8,  # begin
    0x12: 14,  # attach
    0x13: 11,  # flow
    0x14: 11,  # transfer
    0x15: 6,  # disposition
    0x16: 3,  # detach
    0x17: 1,  # end
    0x18: 1,  # close
}
_NULL = b"\x40"
_AMQP_FRAME = 0x00


def _descriptor(body: bytes) -> tuple[int, int] | None:
    """(code, bytes used) of a performative's descriptor: ``0x00 0x53 code`` or ``0x00 0x80 <ulong>``."""
    if len(body) >= 3 and body[0] == 0x00 and body[1] == 0x53:
        return body[2], 3
    if len(body) >= 10 and body[0] == 0x00 and body[1] == 0x80:
        return struct.unpack(">Q", body[2:10])[0], 10
    return None


def _list(body: bytes, at: int) -> tuple[int, bytes, int] | None:
    """(count, element bytes, end position) of the list encoded at ``at``."""
    code = body[at]
    if code == 0x45:  # list0
        return 0, b"", at + 1
    if code == 0xC0:  # list8: size (1 byte, counts the count byte), count (1 byte)
        size, count = body[at + 1], body[at + 2]
        return count, body[at + 3 : at + 2 + size], at + 2 + size
    if code == 0xD0:  # list32
        size, count = struct.unpack(">II", body[at + 1 : at + 9])
        return count, body[at + 9 : at + 5 + size], at + 5 + size
    return None


def pad_performative(body: bytes) -> bytes:
    """A frame body (performative + payload) with the performative's field list at full length."""
    found = _descriptor(body)
    if found is None:
        return body
    code, used = found
    full = FULL_FIELD_COUNT.get(code)
    if full is None:
        return body
    parsed = _list(body, used)
    if parsed is None:
        return body
    count, elements, end = parsed
    if count >= full:
        return body
    elements += _NULL * (full - count)
    encoded = b"\xd0" + struct.pack(">II", len(elements) + 4, full) + elements
    return body[:used] + encoded + body[end:]


class FramePadder:
    """Feed proton's output bytes in any chunking; take back the same stream with padded performatives."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> bytes:
        self._buffer += data
        out = bytearray()
        while True:
            if len(self._buffer) >= 8 and self._buffer[:4] == b"AMQP":
                out += self._buffer[:8]  # protocol header (AMQP or SASL)
                del self._buffer[:8]
                continue
            if len(self._buffer) < 8:
                break
            size = struct.unpack(">I", self._buffer[:4])[0]
            if len(self._buffer) < size:
                break
            frame = bytes(self._buffer[:size])
            del self._buffer[:size]
            out += self._pad_frame(frame)
        return bytes(out)

    @staticmethod
    def _pad_frame(frame: bytes) -> bytes:
        doff, frame_type = frame[4], frame[5]
        header_len = doff * 4
        if frame_type != _AMQP_FRAME or len(frame) <= header_len:
            return frame
        body = pad_performative(frame[header_len:])
        header = struct.pack(">I", header_len + len(body)) + frame[4:header_len]
        return header + body
