"""What the Kinesis spool's file holds (`weirflow_kinesis.spool`): its tables, the runs and records it keeps, how
a task's state in a shard orders against a run's bounds, and how a `GetRecords` response becomes rows.
"""

from __future__ import annotations

import binascii
import json
import sqlite3
from dataclasses import dataclass
from typing import Any

from weirflow_kinesis import positions

SCHEMA = """
CREATE TABLE IF NOT EXISTS records (shard TEXT NOT NULL, seq TEXT NOT NULL, task INTEGER NOT NULL,
    sequence_number TEXT NOT NULL, partition_key TEXT NOT NULL, data BLOB NOT NULL, arrival_ms INTEGER NOT NULL,
    read_ms INTEGER NOT NULL, PRIMARY KEY (shard, seq)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS records_by_task ON records (shard, task, seq);
CREATE TABLE IF NOT EXISTS runs (shard TEXT PRIMARY KEY, lo TEXT NOT NULL, hi TEXT NOT NULL,
    ended INTEGER NOT NULL, iterator TEXT, iterator_ms INTEGER NOT NULL, next_call_ms INTEGER NOT NULL,
    caught_up INTEGER NOT NULL DEFAULT 0, bytes INTEGER NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS marks (shard TEXT NOT NULL, task INTEGER NOT NULL, reader TEXT NOT NULL,
    floor TEXT NOT NULL, asked_ms INTEGER NOT NULL, PRIMARY KEY (shard, task, reader)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS probes (shard TEXT NOT NULL, at_ms INTEGER NOT NULL, found TEXT,
    next_call_ms INTEGER NOT NULL, PRIMARY KEY (shard, at_ms)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS losses (shard TEXT NOT NULL, after TEXT NOT NULL, oldest TEXT NOT NULL,
    detected_ms INTEGER NOT NULL, PRIMARY KEY (shard, after)) WITHOUT ROWID;
"""

# SQLite's primary result codes of a file that is not (or no longer) a sound database.
_SQLITE_CORRUPT, _SQLITE_NOTADB = 11, 26
# Where `raw_get_records` puts a GetRecords response's records.
RAW_RECORDS = "WeirflowRawRecords"
# Part of the spool file's name: a spool written by another layout is not read (it is a cache).
SPOOL_VERSION = "s3"


def order(state: str) -> tuple[str, int]:
    """Sort key of a run's lower bound or a task's state in a shard: the beginning ("") first, then "at q"
    before "after q"."""
    if not state:
        return ("", 0)
    if state.startswith("<"):
        return (positions.sequence_key(state[1:]), 0)
    return (positions.sequence_key(state), 1)


def is_corrupt(exc: BaseException) -> bool:
    """Whether SQLite reported ``exc`` because the file is not, or no longer, a sound database (as opposed to
    busy, full or read-only): told by its result code, never its text."""
    code = getattr(exc, "sqlite_errorcode", None)
    return (
        isinstance(exc, sqlite3.DatabaseError)
        and code is not None
        and code & 0xFF in (_SQLITE_CORRUPT, _SQLITE_NOTADB)
    )


def read_floor(state: str) -> str:
    """The lowest ``seq`` a reader at ``state`` may still need: records below it are passed."""
    if not state:
        return ""
    return positions.sequence_key(state[1:] if state.startswith("<") else state)


def records_of(response: dict[str, Any]) -> list[tuple[str, str, bytes, int]]:
    """(sequence number, partition key, data, arrival ms) of a `GetRecords` response: from the raw JSON records
    when the client kept them (`raw_get_records`), else from botocore's parsed ones."""
    raw = response.get(RAW_RECORDS)
    if raw is not None:
        return [
            (
                r["SequenceNumber"],
                r["PartitionKey"],
                binascii.a2b_base64(r["Data"]),
                int(float(r["ApproximateArrivalTimestamp"]) * 1000),
            )
            for r in raw
        ]
    return [
        (
            r["SequenceNumber"],
            r["PartitionKey"],
            bytes(r["Data"]),
            int(r["ApproximateArrivalTimestamp"].timestamp() * 1000),
        )
        for r in response.get("Records", [])
    ]


def raw_get_records(response_dict: dict[str, Any], customized_response_dict: dict[str, Any], **_: Any) -> None:
    """botocore's ``before-parse.kinesis.GetRecords`` hook: hands the records over as the service's JSON
    (under `RAW_RECORDS`) and lets botocore parse the rest. Its generic shape walk costs more per record than
    reading Kinesis does (py-spy, docs/kinesis.md); Data stays base64 and arrival times epoch seconds."""
    if response_dict.get("status_code") != 200:
        return
    body = json.loads(response_dict["body"])
    customized_response_dict[RAW_RECORDS] = body.pop("Records", [])
    response_dict["body"] = json.dumps(body).encode()


@dataclass(frozen=True)
class Run:
    lo: str  # "" = from the shard's beginning, "<q" = from q inclusive, "q" = after q
    hi: str  # the last sequence number read ("" when none yet)
    ended: bool  # read to SHARD_END: nothing after hi, ever
    caught_up: bool = False  # the last read reached what the shard held then (a bounded read may end here)

    def covers(self, state: str) -> bool:
        return order(state) >= order(self.lo)


@dataclass(frozen=True)
class SpooledRecord:
    sequence_number: str
    partition_key: str
    data: bytes
    arrival_ms: int
    task: int
