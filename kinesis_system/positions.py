"""Offsets of a virtual task's SSP: where the task is in each shard that feeds it.

Kinesis sequence numbers are not dense (a shard's next record is not ``n + 1``) and a task reads several
shards, so an offset is a **position**: canonical JSON ``{"<shard id>": "<state>"}`` where a state is

* ``"<sequence number>"`` — the last record of the shard this task has processed;
* ``"E"`` — the shard is processed to its ``SHARD_END`` (closed by a split or merge);
* ``"@<epoch ms>"`` — nothing processed yet; start at the first record that arrived at or after that time
  (``start: latest`` and ``start: <time>``);
* absent — nothing processed yet; start at the shard's beginning (``TRIM_HORIZON``).

A shard absent from a position is read only once every parent of it that holds keys of the task's slice is
``"E"`` (or expired from the stream), which is what keeps per-key order across splits and merges.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from weirflow.errors import InvalidOffsetError

ENDED = "E"
EARLIEST = "{}"


def decode(offset: str) -> dict[str, str]:
    if not offset:
        return {}
    try:
        value = json.loads(offset)
    except ValueError as exc:
        raise InvalidOffsetError(f"{offset!r} is not a Kinesis position (JSON of shard id → state)") from exc
    if not isinstance(value, dict):
        raise InvalidOffsetError(f"{offset!r} is not a Kinesis position (JSON of shard id → state)")
    return {str(k): str(v) for k, v in value.items()}


def encode(position: Mapping[str, str]) -> str:
    return json.dumps(dict(sorted(position.items())), separators=(",", ":"))


def at_time(ms: int) -> str:
    return f"@{int(ms)}"


def is_sequence(state: str | None) -> bool:
    return bool(state) and state[0].isdigit()  # type: ignore[index]


def sequence_key(sequence_number: str) -> str:
    """A sortable text form of a sequence number (decimal integers, 56 digits on AWS today)."""
    return sequence_number.rjust(64, "0")


def compare(a: str, b: str) -> int | None:
    """-1, 0 or 1 when every shard of one position is at or past the other's, else None (incomparable)."""
    pa, pb = decode(a), decode(b)
    if pa == pb:
        return 0
    signs = {_compare_state(pa.get(s), pb.get(s)) for s in set(pa) | set(pb)}
    signs.discard(0)
    if None in signs or len(signs) > 1:
        return None
    return signs.pop() if signs else 0


def _rank(state: str | None) -> tuple[int, str]:
    if state is None or state.startswith("@"):
        return (0, "")
    if state == ENDED:
        return (2, "")
    return (1, sequence_key(state))


def _compare_state(a: str | None, b: str | None) -> int | None:
    if a == b:
        return 0
    if a is not None and b is not None and a.startswith("@") and b.startswith("@"):
        return None  # two start times say nothing of records processed
    ra, rb = _rank(a), _rank(b)
    return (ra > rb) - (ra < rb)
