"""In-band control messages on intermediate streams and how a consumer reconciles them (docs/pipelines.md,
"Control messages").

Wire format of every message on an intermediate stream::

    [type: 1 byte][payload]     type 0 user (payload = the serde's bytes), 1 watermark, 2 end-of-stream, 3 drain,
                                4 rows (payload = many rows as one Arrow IPC stream: `weirflow.spark.packing`)

The Spark data plane writes type 4: only weirflow reads intermediate streams, so a stage's output rows for one
partition travel as one columnar record instead of one JSON record each (no per-row encoding on either side).
Type 0 is still read, so streams written by earlier versions drain normally.

Control payloads are JSON: ``{"version": 1, "task-name": "page-views-2", "task-count": 4,
"timestamp": <ms>, "run-id": "..."}``. Each producer task writes its control messages to *every* partition of
the stream, after the data they cover, so on one partition a control message from task T means "T has sent
everything it will send before this point".

A consumer cannot trust one producer alone: a partition carries data from all ``task-count`` producer tasks.
Reconciliation (what `StreamControl` does) is therefore:

* a partition has **ended** when end-of-stream arrived from every producer task; it has **drained** when every
  producer task sent end-of-stream or drain and at least one sent drain (a drain is an end for this deployment
  only: docs/drain.md);
* its **watermark** is the minimum over producer tasks (unknown until each has reported), an ended producer
  counting as +infinity; the stream's watermark over a task's partitions is the minimum over partitions;
* watermarks **never move backwards**, and replays after a restart (duplicates, or old messages out of order)
  change nothing: per producer only the maximum is kept, and end-of-stream is a set.

The state is plain JSON so it is checkpointed with the offsets and restored with them.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

from weirflow.base.errors import MalformedDocumentError, MalformedMessageError

CONTROL_VERSION = 1
# 9999-12-31T00:00:00Z in ms: "no more data, ever". Spark accepts it as a timestamp and a watermark.
MAX_TIMESTAMP_MS = 253_402_214_400_000
# A Spark watermark at or past this point (9999-01-01) means every window has been emitted.
FLUSHED_WATERMARK_MS = 253_370_764_800_000


class MessageType(IntEnum):
    USER = 0
    WATERMARK = 1
    END_OF_STREAM = 2
    DRAIN = 3
    ROWS = 4


# The name of each control message's kind in the Spark source's control rows (``__ctl.kind``,
# `weirflow.spark.source`), and back: the source writes the names and the runner reads them.
CONTROL_KIND_NAMES: dict[MessageType, str] = {
    MessageType.WATERMARK: "watermark",
    MessageType.END_OF_STREAM: "eos",
    MessageType.DRAIN: "drain",
}
CONTROL_KIND_TYPES: dict[str, MessageType] = {name: kind for kind, name in CONTROL_KIND_NAMES.items()}
END_OF_STREAM_KIND = CONTROL_KIND_NAMES[MessageType.END_OF_STREAM]
DRAIN_KIND = CONTROL_KIND_NAMES[MessageType.DRAIN]

# The kinds of control rows that are not control messages: what a read tells the task's own runner about itself.
INJECT_KIND = "inject"  # moves Spark's watermark to ``ctl_ms`` (the row's ``__wm_time``)
ROWS_KIND = "rows"  # how many records the read took from an intermediate stream (``task_count``)
MARKS_KIND = "marks"  # the replay marks of a partition as of the read's end (``detail``, JSON)
DEAD_LETTERS_KIND = "dlq"  # how many records of the read went to the dead-letter stream (``task_count``)
SEEN_KIND = "seen"  # the newest event time the read saw (``ctl_ms``)


@dataclass(frozen=True)
class ControlMessage:
    """A watermark, end-of-stream or drain message from producer task ``task_name`` (one of ``task_count``)."""

    type: MessageType
    task_name: str
    task_count: int
    timestamp: int
    run_id: str = ""
    version: int = CONTROL_VERSION

    def encode(self) -> bytes:
        payload = {
            "version": self.version,
            "task-name": self.task_name,
            "task-count": self.task_count,
            "timestamp": self.timestamp,
            "run-id": self.run_id,
        }
        return bytes([int(self.type)]) + json.dumps(payload, separators=(",", ":")).encode()


def encode_user(payload: bytes) -> bytes:
    return b"\x00" + payload


def encode_rows(payload: bytes) -> bytes:
    return b"\x04" + payload


def is_control(raw: bytes) -> bool:
    """Whether an intermediate-stream message is a control message (watermark, end-of-stream, drain or an
    unknown type, which `decode` rejects), without decoding it."""
    return bool(raw) and raw[0] not in (MessageType.USER, MessageType.ROWS)


def decode(raw: bytes) -> tuple[MessageType, bytes | ControlMessage]:
    """Split one intermediate-stream message: (USER or ROWS, payload bytes) or (type, `ControlMessage`)."""
    if not raw:
        raise MalformedMessageError("empty message (no type byte)")
    try:
        kind = MessageType(raw[0])
    except ValueError:
        raise MalformedMessageError(f"unknown message type byte {raw[0]}") from None
    if kind in (MessageType.USER, MessageType.ROWS):
        return kind, raw[1:]
    try:
        data = json.loads(raw[1:])
        return kind, ControlMessage(
            type=kind,
            task_name=str(data["task-name"]),
            task_count=int(data["task-count"]),
            timestamp=int(data["timestamp"]),
            run_id=str(data.get("run-id", "")),
            version=int(data.get("version", CONTROL_VERSION)),
        )
    except (ValueError, KeyError, TypeError, OverflowError) as exc:  # OverflowError: int() of JSON's Infinity
        raise MalformedMessageError(f"bad {kind.name.lower()} control payload: {exc}") from exc


@dataclass
class PartitionControl:
    """What one consumed partition has heard from its producer tasks."""

    task_count: int = 0
    watermarks: dict[str, int] = field(default_factory=dict)
    ended: set[str] = field(default_factory=set)
    drained: set[str] = field(default_factory=set)

    def apply(self, message: ControlMessage) -> None:
        self.task_count = max(self.task_count, message.task_count)
        if message.type is MessageType.END_OF_STREAM:
            self.ended.add(message.task_name)
            self.watermarks[message.task_name] = MAX_TIMESTAMP_MS
        elif message.type is MessageType.DRAIN:
            self.drained.add(message.task_name)
            self.watermarks[message.task_name] = MAX_TIMESTAMP_MS
        elif message.type is MessageType.WATERMARK:
            previous = self.watermarks.get(message.task_name)
            self.watermarks[message.task_name] = (
                message.timestamp if previous is None else max(previous, message.timestamp)
            )

    @property
    def has_ended(self) -> bool:
        """Every producer task sent end-of-stream or drain: nothing more will arrive for this deployment."""
        return self.task_count > 0 and len(self.ended | self.drained) >= self.task_count

    @property
    def has_drained(self) -> bool:
        return self.has_ended and bool(self.drained)

    def watermark(self) -> int | None:
        """Minimum over producers; None until every one of ``task_count`` producers has reported."""
        if self.task_count == 0 or len(self.watermarks) < self.task_count:
            return None
        return min(self.watermarks.values())

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "task-count": self.task_count,
            "watermarks": dict(self.watermarks),
            "ended": sorted(self.ended),
        }
        if self.drained:
            data["drained"] = sorted(self.drained)
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PartitionControl:
        return cls(
            task_count=int(data.get("task-count", 0)),
            watermarks={str(k): int(v) for k, v in dict(data.get("watermarks", {})).items()},
            ended=set(data.get("ended", [])),
            drained=set(data.get("drained", [])),
        )


@dataclass
class StreamControl:
    """Control state of one input stream over the partitions (SSP keys) a task consumes."""

    partitions: dict[str, PartitionControl] = field(default_factory=dict)
    high: int | None = None  # highest watermark reported so far: the output never moves backwards

    def apply(self, ssp_key: str, message: ControlMessage) -> None:
        self.partitions.setdefault(ssp_key, PartitionControl()).apply(message)

    def ended(self, ssp_keys: Iterable[str]) -> bool:
        """Every partition ended or drained."""
        keys = list(ssp_keys)
        return bool(keys) and all(k in self.partitions and self.partitions[k].has_ended for k in keys)

    def any_drained(self) -> bool:
        return any(p.drained for p in self.partitions.values())

    def watermark(self, ssp_keys: Iterable[str]) -> int | None:
        """Minimum over the partitions' watermarks, never below what was reported before; None if unknown."""
        values = []
        for key in ssp_keys:
            part = self.partitions.get(key)
            value = part.watermark() if part else None
            if value is None:
                return self.high
            values.append(value)
        if not values:
            return self.high
        current = min(values)
        self.high = current if self.high is None else max(self.high, current)
        return self.high

    def to_json(self) -> dict[str, Any]:
        return {"partitions": {k: p.to_json() for k, p in sorted(self.partitions.items())}, "high": self.high}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> StreamControl:
        return cls(
            partitions={k: PartitionControl.from_json(v) for k, v in dict(data.get("partitions", {})).items()},
            high=data.get("high"),
        )


@dataclass
class TaskControl:
    """A task's whole control state, stored in its checkpoint's ``control`` field.

    ``streams`` — per input stream id, its `StreamControl`; ``injected`` — per input stream, the watermark the
    runtime has asked the source to feed into Spark; ``finished`` — the task consumed all its bounded inputs,
    flushed its windows and sent end-of-stream downstream; ``drained`` — the run id of the deployment in which
    the task drained (docs/drain.md): its inputs stopped at a cut or drained, its windows were flushed and drain
    went downstream; a later deployment (another run id) starts the task afresh from its offsets;
    ``dead_letters`` — records sent to dead-letter streams so far; ``sent_watermark`` — the last watermark the
    task sent to its intermediate outputs; ``marks`` — per intermediate partition it reads, the marks with
    which replayed rows are dropped and the offset they hold at (`weirflow.spark.replay`), written with the
    offsets so that the two always agree; ``spark_history`` — the Spark checkpoint history (query id) a
    stateful task's offsets were last written from (`weirflow.interfaces.spark_checkpoint.history_of`);
    ``tails`` — per intermediate partition a stateful task writes, its next offset when the checkpointed batch
    committed, and ``replays`` — results an earlier attempt wrote past a checkpoint that a replay has not
    produced again yet (both `weirflow.spark.result_replays`); ``closed`` — Spark's watermark in the task's
    last checkpointed batch of a stateful stage (every window ending at or before it was written; -1 when none
    was in this deployment; absent from checkpoints of versions before it), and ``rebuild`` — per intermediate
    partition, the marks from which a shared aggregation query reads the task's open windows again (both
    `weirflow.spark.rebuild`).
    """

    streams: dict[str, StreamControl] = field(default_factory=dict)
    injected: dict[str, int] = field(default_factory=dict)
    finished: bool = False
    drained: str = ""
    dead_letters: int = 0
    sent_watermark: int = -1
    marks: dict[str, dict[str, Any]] = field(default_factory=dict)
    spark_history: str = ""
    tails: dict[str, str] = field(default_factory=dict)
    replays: dict[str, Any] = field(default_factory=dict)
    closed: int | None = None
    rebuild: dict[str, list[list[Any]]] = field(default_factory=dict)

    def stream(self, stream_id: str) -> StreamControl:
        return self.streams.setdefault(stream_id, StreamControl())

    def draining(self) -> bool:
        """Whether one of its inputs ended by a drain (so the task drains rather than finishes)."""
        return any(s.any_drained() for s in self.streams.values())

    def done_in(self, run_id: str) -> bool:
        """Whether the task has nothing more to do in deployment ``run_id``: finished, or drained in it."""
        return self.finished or self.drained == run_id

    def for_new_run(self) -> TaskControl:
        """The control state a task starts a new deployment with after it drained in another: nothing of the
        old run's control messages (they all preceded the drained offsets), the dead-letter count kept."""
        return TaskControl(dead_letters=self.dead_letters, marks=dict(self.marks), closed=-1)

    def to_json(self) -> dict[str, Any]:
        return {
            "streams": {k: s.to_json() for k, s in sorted(self.streams.items())},
            "injected": dict(self.injected),
            "finished": self.finished,
            "drained": self.drained,
            "dead-letters": self.dead_letters,
            "sent-watermark": self.sent_watermark,
            **({"marks": dict(self.marks)} if self.marks else {}),
            **({"spark-history": self.spark_history} if self.spark_history else {}),
            **({"tails": dict(self.tails)} if self.tails else {}),
            **({"replays": dict(self.replays)} if self.replays else {}),
            **({"closed": self.closed} if self.closed is not None else {}),
            **({"rebuild": dict(self.rebuild)} if self.rebuild else {}),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> TaskControl:
        """The control state of a checkpoint's ``control`` (None or empty: a fresh one);
        `MalformedDocumentError` when it is not one (a field of the wrong type), so a reader never takes a
        checkpoint it cannot read for an empty one."""
        try:
            return cls._from_json(data or {})
        except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as exc:
            raise MalformedDocumentError(f"malformed task control state: {type(exc).__name__}: {exc}") from exc

    @classmethod
    def _from_json(cls, data: Mapping[str, Any]) -> TaskControl:
        return cls(
            streams={k: StreamControl.from_json(v) for k, v in dict(data.get("streams", {})).items()},
            injected={str(k): int(v) for k, v in dict(data.get("injected", {})).items()},
            finished=bool(data.get("finished", False)),
            drained=str(data.get("drained", "")),
            dead_letters=int(data.get("dead-letters", 0)),
            sent_watermark=int(data.get("sent-watermark", -1)),
            marks={str(k): dict(v) for k, v in dict(data.get("marks", {})).items()},
            spark_history=str(data.get("spark-history", "")),
            tails={str(k): str(v) for k, v in dict(data.get("tails", {})).items()},
            replays=dict(data.get("replays", {})),
            closed=int(data["closed"]) if data.get("closed") is not None else None,
            rebuild={str(k): [list(m) for m in v] for k, v in dict(data.get("rebuild", {})).items()},
        )
