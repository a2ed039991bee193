"""Reading a job's outputs once: `ReplayFilter` tells a replayed record from a new one by its id, in bounded
memory (docs/guarantees.md, "Reading results once").

On Event Hubs and Kinesis a job's outputs are at least once: a processor killed after a micro-batch's records
were sent and before its checkpoint leaves the batch to the next holder of the task, which sends the records
again with the same ids (`weirflow.results.ids`). A reader feeds the filter each record's partition and id, in
the order it reads the partition, and handles the record only when the filter answers that it is new.

**What it keeps, per kind of id** (`weirflow.results.ids.parse`):

* a **row** of a row-wise stage, ``<stage>/<pss>/<pos>/<k>``: per **lane** (the partition the reader names, the
  stage and the input partition ``pss``), the ``window`` greatest places (``pos``, ``k``) seen. On a system that
  keeps each partition's records in send order (the embedded log, Event Hubs) the window is 1: a mark, the
  greatest place seen. On Kinesis, whose producer reorders the records of one send (`PutRecords` rounds by
  partition key, retried entries), it is the most rows one send holds: the Spark sink sends one Arrow batch at a
  time, at most ``spark.sql.execution.arrow.maxRecordsPerBatch`` rows (10,000 unless the job sets it). A row
  above the window's least place and not in it is new; one in it, or below it once the window is full, is a
  replay;
* a **result** of a stateful stage, ``<task>/<origin>/<digest>``: nothing. Its task never writes a result twice
  and no two results share an id (docs/guarantees.md, "Stateful stages"), so every result is new;
* a **dead letter** of an input, ``<ssp>/<offset>``: per lane (the partition and the input ``ssp``) the greatest
  offset seen, on systems that keep send order and name records by dense offsets. Elsewhere (Kinesis names a
  record ``<shard>/<sequence number>``, which the id format does not order, and one read's dead letters are one
  send, not bounded by the Arrow batch) dead letters pass through: at least once;
* a record **without an id, or of no known shape** (a record job's output, a dead letter of an output record too
  large for its system, anything a job did not write): passes through, never counted as a replay.

**For how long.** As long as the reader reads the stream: a mark is two integers and lanes are few (output
partitions × stages × input partitions; on a Kinesis input, one per input shard), and a replay may come at any
time after the original (usually the time from a batch to its checkpoint plus a failover, seconds to minutes,
but nothing bounds it). A reader that resumes from a checkpoint of its own saves `state` with that checkpoint and
resumes with `from_state`: without it, the replays of records read before the checkpoint that arrive after it
are not recognised (handled twice; nothing is ever dropped wrongly, whatever the filter starts from).

**Why it drops every record it has read before, and nothing sent for the first time.** Take one lane of one
partition (on Kinesis, of one shard), read in order. Every attempt at the input partition ``pss`` starts at a
checkpoint *c* and sends the lane's rows at or after *c* in place order, each send durable before the next, and
*c* was written only once every row before it was durable (docs/guarantees.md, "Exactly once between stages");
the workers' fence keeps two attempts from sending at once, so the partition holds one whole send after another.
Let a row *y* that was never sent before arrive in send *T*, and *x* > *y* be a place read before it, from send
*S*. If *S* is not *T*, *S* came first; the attempt that made *S* started at a checkpoint *c* <= *x*: if
*y* < *c*, *y* was durable before that attempt began, else the attempt sent *y* in *S* or in an earlier send.
Either way *y* was sent before *T*, a contradiction. So every place above *y* read so far is in *T*, which holds
at most ``window`` rows of the lane, *y* among them: fewer than ``window`` places above *y* were read, and *y* is
taken as new (the window is not full, or *y* is above its least place, and *y* is in it nowhere). A place once
read is in the window or below its least place, which only grows: read again, it is dropped. Where send order
is kept (window 1), a row reaches the partition only after every row before it, whichever attempts sent them
(that section's argument, which needs no fence): the mark alone is exact. A dead letter's lane is the same
argument over offsets (the source writes a read's dead letters in offset order before the batch can commit).

What the filter does not recognise (at least once there): on Kinesis, a row replayed into another shard than
its first copy (a reshard in between). A row-wise row sent without a key is placed by the sink in the partition
of its input partition (`weirflow.spark.sink`), not spread by the system, so its replay lands where the first
copy did.
"""

from __future__ import annotations

import heapq
import json
import threading
from collections.abc import Hashable, Mapping
from typing import Any

from weirflow.base.errors import InvalidArgumentError
from weirflow.interfaces.config import ConfigView
from weirflow.results.ids import DeadLetterId, RowId, parse

# The Event Hubs property an output record's id travels in (`weirflow_azure.eventhubs.clients.RECORD_ID_PROPERTY`,
# which weirflow's core does not import: tests/unit/test_replay_filter.py keeps the two equal). Received events
# carry property names and string values as bytes.
EVENT_HUBS_ID_PROPERTY = "weirflow-id"
# The JSON field an output record's id is written into on Kinesis by default (`systems.<name>.record.id.field`).
KINESIS_ID_FIELD = "weirflow_id"
# The rows the Spark sink sends at most at a time: Spark's Arrow batch, `SPARK_BATCH_KEY` (this is its default).
SPARK_BATCH_KEY = "spark.sql.execution.arrow.maxRecordsPerBatch"
SPARK_BATCH_ROWS = 10_000

Place = tuple[int, int]


class _Lane:
    """The greatest places seen of one lane, at most ``window`` of them (a min-heap and its members)."""

    __slots__ = ("heap", "members")

    def __init__(self) -> None:
        self.heap: list[Place] = []
        self.members: set[Place] = set()

    def take(self, place: Place, window: int | None) -> bool:
        """Whether ``place`` is new; a new place is kept, and the least one leaves a full window."""
        if place in self.members:
            return False
        full = window is not None and len(self.heap) >= window
        if full and place < self.heap[0]:
            return False
        heapq.heappush(self.heap, place)
        self.members.add(place)
        if full:
            self.members.discard(heapq.heappop(self.heap))
        return True


class ReplayFilter:
    """Answers, record by record in the order a reader reads each partition, whether an output record of a job
    is new or a replay of one already read (the module docstring says what it keeps, and why that suffices).

    ``window`` is how many records of one send a system may reorder within a partition: 1 (the default) where
    each partition keeps send order (the embedded log, Event Hubs); on Kinesis the most rows one send holds,
    ``spark.sql.execution.arrow.maxRecordsPerBatch`` of the job (`SPARK_BATCH_ROWS` unless it sets one;
    `for_job` reads it); None keeps every place (a job whose Arrow batches are unbounded).

    One filter per stream; a partition is whatever the reader reads in order: an Event Hubs partition id, a
    Kinesis shard id. Thread-safe: the SDKs call back from a thread per partition."""

    def __init__(self, window: int | None = 1) -> None:
        if window is not None and window < 1:
            raise InvalidArgumentError(
                f"window={window}: give 1 for a system that keeps each partition's send order, the most "
                "records one send may reorder otherwise, or None to keep every place"
            )
        self.window = window
        self.replays = 0  # records answered as replays so far
        self._lanes: dict[tuple[Hashable, str], _Lane] = {}
        self._lock = threading.Lock()

    @classmethod
    def for_job(cls, config: ConfigView, ordered: bool) -> ReplayFilter:
        """The filter for reading an output of the job configured by ``config`` from a system whose partitions
        keep send order (``ordered``, `SystemAdmin.ordered_partitions`) or not (the job's Arrow batch rows)."""
        if ordered:
            return cls(1)
        rows = config.get(SPARK_BATCH_KEY)
        try:
            batch = SPARK_BATCH_ROWS if rows in (None, "") else int(rows)
        except ValueError:
            raise config.error(SPARK_BATCH_KEY, f"is {rows!r}, not a number of rows") from None
        return cls(batch if batch > 0 else None)  # Spark: 0 or less is no limit

    def is_new(self, partition: Hashable, record_id: str | None) -> bool:
        """Whether the record read from ``partition`` with id ``record_id`` is new (True) or a replay (False,
        counted in `replays`); a new record's place is kept. Records without an id or of no known shape: True."""
        parsed = parse(record_id)
        if isinstance(parsed, RowId):
            lane, place = f"r/{parsed.lane}", parsed.place
        elif isinstance(parsed, DeadLetterId) and parsed.place is not None and self.window == 1:
            lane, place = f"d/{parsed.lane}", parsed.place
        else:
            return True  # a result, a dead letter the filter cannot order, no id, an unknown shape
        with self._lock:
            kept = self._lanes.get((partition, lane))
            if kept is None:
                kept = self._lanes[(partition, lane)] = _Lane()
            if kept.take(place, self.window):
                return True
            self.replays += 1
            return False

    def is_new_event(self, partition_id: str, event: Any) -> bool:
        """`is_new` for an ``azure.eventhub.EventData`` received from partition ``partition_id``: its id is the
        ``weirflow-id`` application property. An event without it passes (True)."""
        return self.is_new(partition_id, event_record_id(event))

    def is_new_kinesis_record(
        self, shard_id: str, record: Mapping[str, Any], id_field: str = KINESIS_ID_FIELD
    ) -> bool:
        """`is_new` for a record of boto3's ``get_records`` (``{"Data": bytes, ...}``) read from shard
        ``shard_id``: its id is the field ``id_field`` of its JSON object (`systems.<name>.record.id.field`).
        A record whose data is not such an object passes (True)."""
        return self.is_new(shard_id, kinesis_record_id(record, id_field))

    def state(self) -> dict[str, Any]:
        """What the filter keeps, as JSON-able data, to save with a reader's own checkpoint (`from_state`).
        Partitions must then be strings or integers."""
        lanes = []
        with self._lock:
            kept_lanes = [(key, sorted(kept.members)) for key, kept in self._lanes.items()]
            replays = self.replays
        for (partition, lane), places in kept_lanes:
            if not isinstance(partition, str | int):
                raise InvalidArgumentError(
                    f"partition {partition!r}: a filter whose state is saved names partitions by str or int"
                )
            lanes.append([partition, lane, places])
        return {"window": self.window, "replays": replays, "lanes": lanes}

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> ReplayFilter:
        """A filter that goes on from ``state`` (what `state` returned, maybe through JSON)."""
        restored = cls(state["window"])
        restored.replays = int(state.get("replays", 0))
        for partition, lane, places in state["lanes"]:
            kept = restored._lanes[(partition, lane)] = _Lane()
            for pos, k in places:
                kept.take((int(pos), int(k)), restored.window)
        return restored


def event_record_id(event: Any) -> str | None:
    """The id an Event Hubs event was sent with (its ``weirflow-id`` property), else None."""
    properties = getattr(event, "properties", None) or {}
    value = properties.get(EVENT_HUBS_ID_PROPERTY.encode(), properties.get(EVENT_HUBS_ID_PROPERTY))
    if isinstance(value, bytes | bytearray):
        return value.decode("utf-8", "replace")
    return value if isinstance(value, str) else None


def kinesis_record_id(record: Mapping[str, Any], id_field: str = KINESIS_ID_FIELD) -> str | None:
    """The id a Kinesis record was sent with: field ``id_field`` of its data's JSON object, else None."""
    data = record.get("Data") if isinstance(record, Mapping) else None
    if not isinstance(data, bytes | bytearray | str) or not id_field:
        return None
    try:
        value = json.loads(data)
    except ValueError:
        return None
    found = value.get(id_field) if isinstance(value, dict) else None
    return found if isinstance(found, str) else None
