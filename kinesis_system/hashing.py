"""The MD5 hash space of partition keys and its fixed slices: the virtual tasks (docs/kinesis.md).

Kinesis routes a record to the shard whose hash-key range holds the MD5 of its partition key, read as a
128-bit unsigned integer. Virtual task k of V owns the slice ``[k * 2**128 // V, (k + 1) * 2**128 // V)``, so
the task of a key depends on V alone, never on the shards: splits and merges change which shards feed a
task, never which task owns a key.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache

HASH_SPACE = 1 << 128
MAX_PARTITION_KEY_CHARS = 256


def partition_key(key: bytes) -> str:
    """The Kinesis partition key a weirflow record key becomes: its UTF-8 text when it is a valid partition key
    (at most 256 characters), else the hex MD5 of its bytes (still one key per distinct weirflow key)."""
    try:
        text = key.decode("utf-8")
    except UnicodeDecodeError:
        return hashlib.md5(key).hexdigest()
    if 1 <= len(text) <= MAX_PARTITION_KEY_CHARS:
        return text
    return hashlib.md5(key).hexdigest()


def key_hash(partition_key: str) -> int:
    """The 128-bit hash Kinesis gives ``partition_key``: MD5 of its UTF-8 bytes, big-endian."""
    return int.from_bytes(hashlib.md5(partition_key.encode("utf-8")).digest(), "big")


def slice_of(hash_key: int, virtual_tasks: int) -> int:
    """The virtual task owning ``hash_key``."""
    return hash_key * virtual_tasks >> 128


def slice_range(task: int, virtual_tasks: int) -> tuple[int, int]:
    """Inclusive hash range ``(low, high)`` of virtual task ``task``."""
    low = -(-task * HASH_SPACE // virtual_tasks)  # ceil: the first hash whose slice is ``task``
    high = -(-(task + 1) * HASH_SPACE // virtual_tasks) - 1
    return low, high


@lru_cache(maxsize=4096)
def pinning_key(task: int, virtual_tasks: int) -> str:
    """A partition key whose hash lies in slice ``task``: records sent with it reach that virtual task (how a
    record pinned to a partition is sent; Kinesis's ExplicitHashKey is not visible to readers)."""
    n = 0
    while True:
        candidate = f"weirflow-v{task}-{n}"
        if slice_of(key_hash(candidate), virtual_tasks) == task:
            return candidate
        n += 1
