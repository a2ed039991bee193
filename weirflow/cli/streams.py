"""``weirflow streams``: create, list, write and read the streams of a job's systems (docs/pipelines.md,
"Reading results" in the README)."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from weirflow.base.errors import WeirflowError
from weirflow.cli.common import ConfigArg, JsonOpt, SetOpt, console, err_console, load, user_errors

streams_app = typer.Typer(no_args_is_help=True, help="Create, list, write and read streams of the job's systems.")


@contextmanager
def _systems(config: Path, overrides: list[str] | None) -> Iterator[Any]:
    from weirflow.job.systems import Systems

    cfg = load(config, overrides)
    systems = Systems(cfg)
    try:
        yield cfg, systems
    finally:
        systems.close()


StreamArg = Annotated[str, typer.Argument(help="Stream id (its system comes from streams.<id>.system).")]


@streams_app.command("create")
def streams_create(
    config: ConfigArg,
    stream: StreamArg,
    partitions: Annotated[
        int | None, typer.Option(help="Partition count (default streams.<id>.partitions).")
    ] = None,
    set_: SetOpt = None,  # type: ignore[assignment]
) -> None:
    """Create a stream (idempotent when the partition count matches)."""
    from weirflow.interfaces.system import StreamSpec

    with user_errors(), _systems(config, set_) as (cfg, systems):
        count = partitions or cfg.get(f"streams.{stream}.partitions")
        if not count:
            raise cfg.error(f"streams.{stream}.partitions", "is not set; pass --partitions N")
        ref = systems.resolve(stream)
        created = systems.admin(ref.system).create_stream(StreamSpec(ref.physical, int(count)))
        verb = "created" if created else "already exists:"
        console.print(f"{verb} {ref.system}.{ref.physical} with {count} partitions")


@streams_app.command("list")
def streams_list(config: ConfigArg, set_: SetOpt = None, as_json: JsonOpt = False) -> None:  # type: ignore[assignment]
    """List the streams of every system the job uses, with partition counts and record counts."""
    with user_errors(), _systems(config, set_) as (cfg, systems):
        names = sorted({cfg.get("job.default.system"), *cfg.names("systems")})
        rows = []
        for system in names:
            admin = systems.admin(system)
            for stream, count in sorted(admin.list_streams().items()):
                meta = admin.partition_metadata(stream)
                counts = [admin.records_between(stream, p, m.oldest, m.upcoming) for p, m in meta.items()]
                records = sum(n for n in counts if n is not None) if None not in counts else None
                rows.append({"system": system, "stream": stream, "partitions": count, "records": records})
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    table = Table()
    for column in ("system", "stream", "partitions", "records"):
        table.add_column(column)
    for row in rows:
        records = "?" if row["records"] is None else str(row["records"])  # positions count nothing unread
        table.add_row(row["system"], row["stream"], str(row["partitions"]), records)
    console.print(table)


@streams_app.command("produce")
def streams_produce(
    config: ConfigArg,
    stream: StreamArg,
    key_field: Annotated[str | None, typer.Option("--key-field", help="Use this JSON field as the key.")] = None,
    batch: Annotated[int, typer.Option(help="Records per write.", min=1)] = 500,
    set_: SetOpt = None,  # type: ignore[assignment]
) -> None:
    """Append JSON lines read from stdin to a stream (one record per line).

    A line that is not JSON (or lacks the --key-field) stops it: the lines before it are sent, nothing from it
    on, and the error says how many."""
    with user_errors(), _systems(config, set_) as (_cfg, systems):
        ref = systems.resolve(stream)
        total = _produce_lines(systems.producer(ref.system), ref, key_field, batch)
    err_console.print(f"sent {total} records to {ref.system}.{ref.physical}")


def _produce_lines(producer: Any, ref: Any, key_field: str | None, batch: int) -> int:
    """Send stdin's JSON lines in writes of ``batch`` records; returns how many were sent. At a bad line the
    records of the lines before it are sent first, then `WeirflowError` says so: what the user reads is what the
    stream holds, and the rest can be sent again from that line (``tail -n +N``)."""
    from weirflow.interfaces.system import OutgoingRecord

    pending: list[OutgoingRecord] = []
    total = 0

    def send() -> None:
        nonlocal pending, total
        if pending:
            producer.send(pending)
            total += len(pending)
            pending = []

    for number, line in enumerate(sys.stdin, start=1):
        line = line.strip()
        if not line:
            continue
        try:
            key, problem = _line_key(json.loads(line), key_field)
        except json.JSONDecodeError as exc:
            key, problem = None, f"is not JSON ({exc.msg})"
        if problem is not None:
            send()
            producer.flush()
            raise WeirflowError(
                f"stdin line {number} {problem}; the lines before it were sent ({total} records to "
                f"{ref.system}.{ref.physical}), nothing from line {number} on: fix the line, then send the rest "
                f"from it (tail -n +{number} FILE | weirflow streams produce ...)"
            )
        pending.append(OutgoingRecord(ref.physical, line.encode(), key=key))
        if len(pending) >= batch:
            send()
    send()
    producer.flush()
    return total


def _line_key(value: Any, key_field: str | None) -> tuple[bytes | None, str | None]:
    """(the record's key, None), or (None, what is wrong with the line) when it lacks ``key_field``."""
    if key_field is None:
        return None, None
    if not isinstance(value, dict) or key_field not in value:
        return None, f"has no field '{key_field}' for --key-field"
    return str(value[key_field]).encode(), None


@streams_app.command("consume")
def streams_consume(
    config: ConfigArg,
    stream: StreamArg,
    as_json: JsonOpt = False,
    limit: Annotated[int | None, typer.Option("--max", help="Stop after printing this many records.")] = None,
    follow: Annotated[bool, typer.Option("--follow", help="Keep waiting for new records.")] = False,
    replays: Annotated[
        bool,
        typer.Option(
            "--replays",
            help="Print every record as the stream holds it, replays included (by default a record whose id was "
            "already printed is left out).",
        ),
    ] = False,
    set_: SetOpt = None,  # type: ignore[assignment]
) -> None:
    """Print the records of every partition from the oldest, each of a job's results once.

    A record the job sent again after a crash (its id was printed already; docs/guarantees.md, "Reading results
    once") is left out, and how many were is printed last on stderr. `--json`: one JSON object per record, with
    its "id". `STREAM.dlq` reads the dead letters of a declared STREAM."""
    from weirflow.interfaces.stream_names import dead_letter_ref
    from weirflow.results import ReplayFilter

    with user_errors(), _systems(config, set_) as (cfg, systems):
        ref = dead_letter_ref(cfg, stream) or systems.resolve(stream)
        admin = systems.admin(ref.system)
        seen = None if replays else ReplayFilter.for_job(cfg, admin.ordered_partitions)
        try:
            _print_records(systems, ref, seen, as_json, limit, follow)
        finally:
            if seen is not None and seen.replays:
                err_console.print(
                    f"left out {seen.replays} replayed records (their ids were printed already; --replays "
                    "prints every record as the stream holds it)",
                    highlight=False,
                )


def _print_records(systems: Any, ref: Any, seen: Any, as_json: bool, limit: int | None, follow: bool) -> None:
    """Print ``ref``'s records, partition by partition in turns of up to 1,000, leaving out those ``seen``
    (a `ReplayFilter`, or None for every record) takes for replays; ``limit`` counts printed records."""
    from weirflow.interfaces.system import SystemStreamPartition

    admin, consumer = systems.admin(ref.system), systems.consumer(ref.system)
    positions = {p: m.oldest for p, m in admin.partition_metadata(ref.physical).items()}
    printed = 0
    while True:
        progressed = False
        for partition in sorted(positions):
            ssp = SystemStreamPartition(ref.system, ref.physical, partition)
            for record in consumer.read(ssp, positions[partition], 1000):
                positions[partition] = record.next_offset
                progressed = True
                if seen is not None and not seen.is_new((partition, admin.read_sequence(record)), record.id):
                    continue
                _print_record(record, as_json)
                printed += 1
                if limit is not None and printed >= limit:
                    return
        if not progressed:
            if not follow:
                return
            time.sleep(0.2)


def _print_record(record: Any, as_json: bool) -> None:
    value_text = record.value.decode(errors="replace")
    if not as_json:
        key = record.key.decode(errors="replace") if record.key is not None else "-"
        print(f"{record.ssp.partition}\t{record.offset}\t{key}\t{value_text}")
        return
    try:
        value: Any = json.loads(value_text)
    except json.JSONDecodeError:
        value = value_text
    doc = {
        "partition": record.ssp.partition,
        "offset": record.offset,
        "key": record.key.decode(errors="replace") if record.key is not None else None,
        "timestamp_ms": record.timestamp_ms,
        "id": record.id,
        "value": value,
    }
    print(json.dumps(doc, separators=(",", ":")))
