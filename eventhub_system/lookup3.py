"""Partition routing by partition key, as Event Hubs does it: Bob Jenkins' lookup3 ``hashlittle2``.

Written from Jenkins' public description of lookup3 (2006): the key's bytes are consumed in 12-byte blocks
mixed into three 32-bit words, the last (zero-padded) block goes through the final avalanche, and the two
words ``c`` and ``b`` are the result. Event Hubs folds them to 16 bits (``(c ^ b) & 0xFFFF``, read as a
signed short) and picks ``partitions[abs(hash % count)]``.

Where the Python SDK's own resolver (which its buffered producer uses) could differ from the .NET one, the
emulator follows the Python SDK, the only reference available here: a string key is hashed character by
character (``ord``; the same as UTF-8 bytes for ASCII keys) and the modulo is Python's. A test checks the
emulator against that resolver for 10,000 keys.
"""

from __future__ import annotations

import struct

_MASK = 0xFFFFFFFF


def _rot(x: int, k: int) -> int:
    return ((x << k) | (x >> (32 - k))) & _MASK


def _mix(a: int, b: int, c: int) -> tuple[int, int, int]:
    a = (a - c) & _MASK
    a ^= _rot(c, 4)
    c = (c + b) & _MASK
    b = (b - a) & _MASK
    b ^= _rot(a, 6)
    a = (a + c) & _MASK
    c = (c - b) & _MASK
    c ^= _rot(b, 8)
    b = (b + a) & _MASK
    a = (a - c) & _MASK
    a ^= _rot(c, 16)
    c = (c + b) & _MASK
    b = (b - a) & _MASK
    b ^= _rot(a, 19)
    a = (a + c) & _MASK
    c = (c - b) & _MASK
    c ^= _rot(b, 4)
    b = (b + a) & _MASK
    return a, b, c


def _final(a: int, b: int, c: int) -> tuple[int, int, int]:
    c ^= b
    c = (c - _rot(b, 14)) & _MASK
    a ^= c
    a = (a - _rot(c, 11)) & _MASK
    b ^= a
    b = (b - _rot(a, 25)) & _MASK
    c ^= b
    c = (c - _rot(b, 16)) & _MASK
    a ^= c
    a = (a - _rot(c, 4)) & _MASK
    b ^= a
    b = (b - _rot(a, 14)) & _MASK
    c ^= b
    c = (c - _rot(b, 24)) & _MASK
    return a, b, c


def _word(units: list[int], start: int) -> int:
    """Four consecutive units, little-endian (a missing unit counts as zero)."""
    return sum(u << (8 * j) for j, u in enumerate(units[start : start + 4])) & _MASK


def hashlittle2(key: bytes | str, pc: int = 0, pb: int = 0) -> tuple[int, int]:
    """lookup3's two 32-bit hashes ``(c, b)`` of ``key`` with seeds ``pc`` and ``pb``.

    Bytes are hashed as bytes; a string unit by unit (``ord`` of each character), which is what the Python
    SDK's resolver does and equals hashing UTF-8 for ASCII keys."""
    units = list(key) if isinstance(key, bytes) else [ord(ch) for ch in key]
    length = len(units)
    a = b = c = (0xDEADBEEF + length + pc) & _MASK
    c = (c + pb) & _MASK
    offset = 0
    while length - offset > 12:
        a, b, c = _mix(
            (a + _word(units, offset)) & _MASK,
            (b + _word(units, offset + 4)) & _MASK,
            (c + _word(units, offset + 8)) & _MASK,
        )
        offset += 12
    if offset == length:
        return c, b  # zero-length tail: no final mixing
    a = (a + _word(units, offset)) & _MASK
    if length - offset > 4:
        b = (b + _word(units, offset + 4)) & _MASK
    if length - offset > 8:
        c = (c + _word(units, offset + 8)) & _MASK
    a, b, c = _final(a, b, c)
    return c, b


def partition_hash(partition_key: str) -> int:
    """The signed 16-bit hash Event Hubs routes a partition key by (0 for an empty key)."""
    if not partition_key:
        return 0
    c, b = hashlittle2(partition_key)
    return struct.unpack(">h", struct.pack(">H", (c ^ b) & 0xFFFF))[0]


def partition_for_key(partition_key: str, partition_count: int) -> int:
    """Index of the partition that receives events sent with ``partition_key``."""
    return abs(partition_hash(partition_key) % partition_count)
