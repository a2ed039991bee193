"""Offsets of a virtual task's SSP: where the task is in each shard that feeds it.

Kinesis sequence numbers are not dense (a shard's next record is not ``n + 1``) and a task reads several
shards, so an offset is a **position**: canonical JSON ``{"<shard id>": "<state>"}`` where a state is

* ``"<sequence number>#<ordinal>"`` — the last record of the shard this task has processed, and how many
  records of the task's slice in the shard it has processed up to it since the shard's start point (the
  record's **ordinal**: the first record after an absent or time state is 1). A replay from any position
  gives every record the ordinal it had before, which is what lets the Spark data plane drop the rows of a
  replayed batch downstream (docs/guarantees.md). ``"<sequence number>"`` alone (written by versions before
  ordinals) counts from 0 at that record;
* ``"<<sequence number>"`` — nothing processed yet; start at that record, the first the shard held when the
  task started (its **pinned start**, `pinned`): what a replay counts ordinals from, however much the stream's
  retention has dropped meanwhile (a record dropped from there on is reported lost, `weirflow_kinesis.spool`);
* ``"E"`` — the shard is processed to its ``SHARD_END`` (closed by a split or merge);
* ``"@<epoch ms>"`` — nothing processed yet; start at the first record that arrived at or after that time
  (``start: latest`` and ``start: <time>``);
* absent — nothing processed yet; start at the shard's beginning (``TRIM_HORIZON``).

A closed shard processed to its end is **pruned** from a position once it no longer says anything a read
needs (`weirflow_kinesis.shards.ShardMap.prune`): when it has expired from the stream, or a child of it that
holds keys of the task's slice has started. ``"~E"`` then counts the shards pruned, so that a position stays
as small as the shards it still reads, however often the stream is resharded, and `compare` still tells a
pruned shard from one not read yet.

A shard absent from a position or pinned is read only once every parent of it that holds keys of the task's
slice is ``"E"`` (or expired from the stream), which is what keeps per-key order across splits and merges.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Mapping

from weirflow.base.errors import InvalidOffsetError

ENDED = "E"
PRUNED = "~E"  # the key counting the ended shards pruned from a position
EARLIEST = "{}"
_ORDINAL = "#"
_PINNED = "<"
# The most shard numbers a lane can tell apart (`lane`): lanes are stored in 31 bits.
MAX_LANE = 2**31 - 2


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


def pinned(sequence_number: str) -> str:
    """The state of a shard with nothing processed yet that starts at record ``sequence_number`` (inclusive)."""
    return f"{_PINNED}{sequence_number}"


def is_pinned(state: str | None) -> bool:
    return bool(state) and state.startswith(_PINNED)  # type: ignore[union-attr]


def unanchored(state: str | None) -> bool:
    """Whether a read from ``state`` counts ordinals from wherever the stream starts now (absent: its oldest
    record; a time: the first record at or after it), which retention may move: what `pin` replaces."""
    return state is None or state.startswith("@")


def started(state: str | None) -> bool:
    """Whether the shard has records processed (or is processed to its end)."""
    return state is not None and (state == ENDED or is_sequence(state))


def processed(sequence_number: str, ordinal: int) -> str:
    """The state of a shard whose last processed record is ``sequence_number``, the ``ordinal``-th."""
    return f"{sequence_number}{_ORDINAL}{ordinal}"


def sequence_of(state: str) -> str:
    """A state without its ordinal: the sequence number of a processed state, any other state as it is."""
    return state.split(_ORDINAL, 1)[0]


def ordinal_of(state: str | None) -> int:
    """The ordinal of a processed state's last record; 0 for a shard with nothing processed yet (and for a
    state written without ordinals)."""
    if not state or _ORDINAL not in state:
        return 0
    return int(state.split(_ORDINAL, 1)[1])


def lane(shard_id: str) -> int:
    """A shard's number, which names its lane in a virtual task's rows
    (`weirflow.interfaces.system.RecordColumns`): Kinesis numbers shards ``shardId-<12 digits>`` in creation
    order; another form gets a 31-bit CRC32."""
    number = shard_id.rsplit("-", 1)[-1]
    if number.isdigit() and int(number) <= MAX_LANE:
        return int(number)
    return zlib.crc32(shard_id.encode()) % (MAX_LANE + 1)


def sequence_key(sequence_number: str) -> str:
    """A sortable text form of a sequence number (decimal integers, 56 digits on AWS today)."""
    return sequence_number.rjust(64, "0")


def shard_states(position: Mapping[str, str]) -> dict[str, str]:
    """A decoded position's shards and their states (without its count of pruned shards)."""
    return {shard: state for shard, state in position.items() if shard != PRUNED}


def pruned(position: Mapping[str, str]) -> int:
    """How many ended shards were pruned from a decoded position."""
    return int(position.get(PRUNED, 0))


def ended(position: Mapping[str, str]) -> int:
    """How many shards a decoded position has processed to their end, pruned or not."""
    return pruned(position) + sum(1 for shard, state in position.items() if state == ENDED and shard != PRUNED)


def compare(a: str, b: str) -> int | None:
    """-1, 0 or 1 when every shard of one position is at or past the other's, else None (incomparable). A
    shard ended in one and absent from the other counts as pruned there (the same) when the other has pruned
    shards and has ended at least as many."""
    pa, pb = decode(a), decode(b)
    if pa == pb:
        return 0
    sa, sb, ea, eb = shard_states(pa), shard_states(pb), ended(pa), ended(pb)
    signs: set[int | None] = set()
    for shard in set(sa) | set(sb):
        x, y = sa.get(shard), sb.get(shard)
        if _pruned_from(pb, x, y, ea, eb) or _pruned_from(pa, y, x, eb, ea):
            continue
        signs.add(_compare_state(x, y))
    signs.discard(0)
    if not signs and ea != eb:  # the same shards, but one has ended (and pruned) more
        signs.add(1 if ea > eb else -1)
    if None in signs or len(signs) > 1:
        return None
    return signs.pop() if signs else 0


def _pruned_from(
    other: Mapping[str, str], mine: str | None, theirs: str | None, ends: int, ends_other: int
) -> bool:
    """Whether a shard ended in one position (``mine``) and absent from ``other`` was pruned there: ``other``
    has pruned shards and has ended at least as many (one that has not read the shard yet has ended fewer)."""
    return mine == ENDED and theirs is None and pruned(other) > 0 and ends_other >= ends


def _rank(state: str | None) -> tuple[int, str]:
    if not started(state):  # absent, a time or a pinned start: nothing processed
        return (0, "")
    if state == ENDED:
        return (2, "")
    return (1, sequence_key(sequence_of(state)))  # type: ignore[arg-type]


def _compare_state(a: str | None, b: str | None) -> int | None:
    if a == b or (a is not None and b is not None and sequence_of(a) == sequence_of(b)):
        return 0
    if a is not None and b is not None and a.startswith("@") and b.startswith("@"):
        return None  # two start times say nothing of records processed
    ra, rb = _rank(a), _rank(b)
    return (ra > rb) - (ra < rb)
