"""Chaos run: the pageviews job while processors are SIGKILLed, counted against pandas.

Three `weirflow run` processes share the job. ``--backend azure`` (the default) runs
``examples/pageviews/azure.yaml``: coordination and checkpoints in Azure Storage (Azurite, started here), every
stream on Event Hubs (the project's emulator, started here, spoken to by the real SDK). ``--backend aws`` runs
``examples/pageviews/aws.yaml``, AWS alone: every stream on Kinesis (kinesalite, started here), coordination and
checkpoints in DynamoDB, the job model and Spark state copies in S3 (moto's server, started here), all through
the unmodified boto3 clients; the input is created before the producer's first send, with its virtual tasks
(the ``weirflow.virtual.tasks`` tag) equal to its partitions. ``--backend local`` runs
``examples/pageviews/job.yaml`` on the embedded default (SQLite coordination, checkpoints and streams, one
state directory for every processor, as on one machine). Events are produced at a steady ``--rate`` for
``--duration`` seconds; every ``--kill-every`` seconds a random processor is SIGKILLed and a new one started in
its place (a fresh processor id, as a replaced container would have). Then the input stops and the job is drained:

* the input is unbounded (``streams.page-views.bounded=false``: a bounded stream ends when a task catches up,
  which a steady producer makes arbitrary), so once the last event is sent one *closing event* goes to every
  partition of ``page-views``, an hour of event time after the last one, on the page ``/closing``. It moves
  every task's watermark past every window of the real events, so they are all written; the closing event's
  own window is left out of every figure;
* the run then waits until every expected window is in ``page-counts`` and the output stopped changing for
  ``--settle`` seconds (or ``--drain-timeout`` passed: what is missing is then reported, not hidden).

The output is compared with pandas over every event sent. One JSON line last::

    {"figure": "chaos", "unit": "windows", "value": <exact_windows>, "kills": .., "lost": ..,
     "duplicate_outputs": .., "overlap_ms": .., "exact_windows": .., "windows": .., ...}

* ``lost`` — events missing from the final counts (sum over windows of expected minus counted, when below);
  must be 0;
* ``duplicate_outputs`` — output records beyond the first for a window, as a user reads the output once the
  run is over, the greatest of two readers: ``weirflow streams consume CONFIG page-counts --json``
  (``duplicate_outputs_consume``) and a downstream application through `weirflow.results.ReplayFilter`
  (``duplicate_outputs_helper``: examples/reading_results' reader with the azure-eventhub SDK on ``azure``,
  with boto3 on ``aws``, the embedded log's consumer on ``local``); must be 0. ``replayed_outputs`` — records
  as written (``streams consume --replays``) that the readers left out as replays (a row-wise output's; a
  stateful stage never writes a result twice, docs/guarantees.md);
* ``intermediate_replays_dropped`` — rows a replayed first-stage batch wrote again to the intermediate stream,
  which the counting stage dropped (the processors' logs);
* ``overcounted_windows`` / ``undercounted_windows`` — windows whose final count is above / below pandas'
  (an event counted twice / not at all);
* ``overlap_ms`` — total time two writers (processor, lock epoch) of one task had overlapping tenures, from
  the ``wrote task=...`` lines each processor logs per committed batch (docs/pipelines.md); a tenure spans
  its first batch's start to its last batch's end; must be 0 with fencing; null when no process logged them;
* ``exact_windows`` / ``windows`` — windows whose final count equals pandas', of all pandas windows.

``--output delta`` writes ``page-counts`` to a Delta table instead (docs/delta.md): in the run's directory on
``local``, in Azurite (container ``lake``) on ``azure``. The helper's figure is then the table read with deltalake
and pandas, as any Delta reader reads it.

``baseline`` is the reference itself (pandas over the same events, computed in this run).
Usage: ``python benchmarks/chaos.py [--backend azure|aws|local] [--duration 180] [--rate 150] [--kill-every 20]
[--processors 3] [--output stream|delta] [--set KEY=VALUE ...]`` (``--set``: config overrides for every
processor, as ``weirflow run --set``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import random
import re
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tests.support (azurite, kinesalite, moto_server): launchers of the test tree
EXAMPLE = ROOT / "examples" / "pageviews"
sys.path.insert(0, str(EXAMPLE))
CONFIGS = {"azure": EXAMPLE / "azure.yaml", "aws": EXAMPLE / "aws.yaml", "local": EXAMPLE / "job.yaml"}
BACKEND_NAMES = {
    "azure": "azure (Azurite) + event hubs (emulator)",
    "aws": "aws (moto: DynamoDB + S3) + kinesis (kinesalite)",
    "local": "local (embedded)",
}

import generate  # noqa: E402 - the example's event generator
import results  # noqa: E402 - the example's pandas reference

from weirflow.config import load_config  # noqa: E402
from weirflow.interfaces.system import (  # noqa: E402
    RECORD_ID_PROPERTY,
    OutgoingRecord,
    StreamSpec,
    SystemStreamPartition,
)
from weirflow.job.systems import Systems  # noqa: E402
from weirflow.local.launcher import ProcessorProcess, start_processor  # noqa: E402
from weirflow.spark import writer_log  # noqa: E402

PARTITIONS = 4
CLOSING_PAGE = "/closing"
DROPPED = re.compile(r"(?P<rows>\d+) replayed rows of \S+ dropped")


def say(message: str) -> None:
    print(f"# {time.strftime('%H:%M:%S')} {message}", file=sys.stderr, flush=True)


class Producer(threading.Thread):
    """Sends the example's events at a steady rate, in ten sends a second, keyed by user."""

    def __init__(self, config: Any, rate: int, physical: str) -> None:
        super().__init__(name="producer", daemon=True)
        self.config = config
        self.rate = rate
        self.physical = physical
        self.sent: list[dict[str, Any]] = []
        self.stop_flag = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        systems = Systems(self.config)
        try:
            producer = systems.producer(systems.resolve("page-views").system)
            events = generate.events(10**9, seed=11)
            per_tick = max(1, self.rate // 10)
            next_tick = time.monotonic()
            while not self.stop_flag.is_set():
                batch = [next(events) for _ in range(per_tick)]
                producer.send(
                    [OutgoingRecord(self.physical, json.dumps(e).encode(), key=e["user"].encode()) for e in batch]
                )
                self.sent.extend(batch)
                next_tick += 0.1
                time.sleep(max(0.0, next_tick - time.monotonic()))
        except BaseException as exc:  # reported by the main thread
            self.error = exc
        finally:
            systems.close()


def send_closing_events(config: Any, physical: str, after: str) -> None:
    """One event per input partition, an hour of event time after ``after``: every real window closes."""
    when = dt.datetime.fromisoformat(after.replace("Z", "+00:00")) + dt.timedelta(hours=1)
    stamp = when.isoformat(timespec="milliseconds").replace("+00:00", "Z")
    systems = Systems(config)
    try:
        producer = systems.producer(systems.resolve("page-views").system)
        event = {"user": "closing", "page": CLOSING_PAGE, "event_time": stamp}
        producer.send(
            [OutgoingRecord(physical, json.dumps(event).encode(), partition=p) for p in range(PARTITIONS)]
        )
    finally:
        systems.close()


class OutputReader:
    """Reads ``page-counts`` as it grows: one consumer for the whole run, each partition read on from where
    the last read stopped (a new Event Hubs receiver costs a second or two to attach)."""

    def __init__(self, config: Any) -> None:
        self.systems = Systems(config)
        self.ref = self.systems.resolve("page-counts")
        self.consumer = self.systems.consumer(self.ref.system)
        metadata = self.systems.admin(self.ref.system).partition_metadata(self.ref.physical)
        self.offsets = {p: m.oldest for p, m in metadata.items()}  # on Kinesis a position, not "0"
        # Kinesis records carry no properties: their id is a field of the record's JSON (docs/guarantees.md)
        kinesis = config.get(f"systems.{self.ref.system}.factory") == "kinesis"
        self.id_field = config.get(f"systems.{self.ref.system}.record.id.field") if kinesis else None
        self.latest: dict[tuple[str, str], int] = {}
        self.records = 0
        self.ids: set[str] = set()
        self.replayed = 0  # records dropped because their id was seen before

    def read(self) -> tuple[dict[tuple[str, str], int], int]:
        """(the latest count per window, how many output records there were), the closing window left out;
        a record whose id was seen before is a replay and is dropped, as a downstream consumer would."""
        for partition in sorted(self.offsets):
            ssp = SystemStreamPartition(self.ref.system, self.ref.physical, partition)
            while batch := self.consumer.read(ssp, self.offsets[partition], 10_000):
                for record in batch:
                    row = json.loads(record.value)
                    if row["page"] == CLOSING_PAGE:
                        continue
                    record_id = dict(record.attributes.get("properties") or {}).get(RECORD_ID_PROPERTY)
                    if self.id_field:
                        record_id = row.get(self.id_field)
                    if record_id is not None:
                        if record_id in self.ids:
                            self.replayed += 1
                            continue
                        self.ids.add(record_id)
                    self.latest[(row["page"], row["window_start"][:16])] = int(row["views"])
                    self.records += 1
                self.offsets[partition] = batch[-1].next_offset
        return dict(self.latest), self.records

    def close(self) -> None:
        self.systems.close()


def replays_dropped(logs: list[Path]) -> int:
    """Intermediate rows the counting stage dropped as replays (docs/guarantees.md), from the processors' logs."""
    return sum(
        int(match["rows"])
        for path in logs
        if path.exists()
        for match in DROPPED.finditer(path.read_text(errors="replace"))
    )


def overlap_ms(logs: list[Path]) -> tuple[int | None, int]:
    """Total time two writers (processor, epoch) of one task had overlapping tenures; and the batches seen."""
    return writer_log.overlap_ms(path.read_text(errors="replace") for path in logs if path.exists())


class Fleet:
    """The job's processes: ``slots`` of them, each replaced by a new processor id when killed."""

    def __init__(self, config: Path, overrides: list[str], logs: Path, slots: int) -> None:
        self.config = config
        self.overrides = overrides
        self.logs = logs
        self.generation = [0] * slots
        self.procs: list[ProcessorProcess] = [self._start(slot) for slot in range(slots)]
        self.all_logs = [p.log_path for p in self.procs]

    def _start(self, slot: int) -> ProcessorProcess:
        return start_processor(self.config, f"c{slot}-{self.generation[slot]}", self.overrides, log_dir=self.logs)

    def kill_and_replace(self, rng: random.Random) -> str:
        slot = rng.randrange(len(self.procs))
        victim = self.procs[slot]
        victim.kill()
        self.generation[slot] += 1
        self.procs[slot] = self._start(slot)
        self.all_logs.append(self.procs[slot].log_path)
        return victim.processor_id

    def stop(self) -> None:
        """SIGTERM every processor at once, then wait for each (SIGKILL after 90 s)."""
        for proc in self.procs:
            proc.request_stop()
        for proc in self.procs:
            proc.wait_stopped(timeout_s=90)


class Services:
    """What the backend needs running: Azurite and the Event Hubs emulator for ``azure``, kinesalite and moto's
    server for ``aws``, nothing for ``local``. Each is pointed at through the environment its config reads."""

    def __init__(self, backend: str, work: Path, job_id: str) -> None:
        self.stops: list[Any] = []
        try:
            if backend == "azure":
                self._azure(work, job_id)
            elif backend == "aws":
                self._aws()
        except BaseException:
            self.stop()
            raise

    def _aws(self) -> None:
        from tests.support.kinesalite import Kinesalite, use_dummy_credentials
        from tests.support.moto_server import BUCKET, MotoServer

        use_dummy_credentials()  # boto3's chain finds them in the environment, here and in the processors
        kinesalite = Kinesalite().start()
        self.stops.append(kinesalite.stop)
        moto = MotoServer().start()
        self.stops.append(moto.stop)
        os.environ["KINESIS_ENDPOINT"] = kinesalite.endpoint
        os.environ["AWS_ENDPOINT"] = moto.endpoint
        os.environ["WEIRFLOW_BUCKET"] = BUCKET

    def _azure(self, work: Path, job_id: str) -> None:
        from tests.support.azurite import Azurite
        from weirflow_azure.eventhubs.emulator.server import EventHubsEmulator

        azurite = Azurite(work / "azurite").start()
        self.stops.append(azurite.stop)
        hubs = {
            "page-views": PARTITIONS,
            "page-views.dlq": PARTITIONS,
            "page-counts": PARTITIONS,
            f"pageviews-{job_id}-views-by-page": PARTITIONS,
        }
        emulator = EventHubsEmulator(hubs).start()
        self.stops.append(emulator.stop)
        os.environ["AZURE_STORAGE_CONNECTION_STRING"] = azurite.connection_string
        os.environ["EVENTHUBS_CONNECTION_STRING"] = emulator.connection_string()
        from azure.storage.blob import BlobServiceClient

        # the container of --output delta (weirflow creates no container)
        BlobServiceClient.from_connection_string(azurite.connection_string).create_container(LAKE_CONTAINER)

    def stop(self) -> None:
        for stop in reversed(self.stops):
            stop()


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """The run on its backend's services, stopped whatever happens (they run in sessions of their own, so a
    service left running would outlive this process)."""
    job_id = uuid.uuid4().hex[:8]
    services = Services(args.backend, work, job_id)
    try:
        return run_job(args, work, job_id)
    finally:
        services.stop()


def run_job(args: argparse.Namespace, work: Path, job_id: str) -> dict[str, Any]:
    config_path = CONFIGS[args.backend]
    overrides = [
        f"job.state.dir={work / 'state'}",
        f"job.id={job_id}",
        "streams.page-views.bounded=false",
        f"streams.page-views.partitions={PARTITIONS}",
        f"streams.page-counts.partitions={PARTITIONS}",
        f"spark.master=local[{args.cores}]",
        *delta_overrides(args, work),
        *args.overrides,
    ]
    config = load_config(config_path, overrides)
    physical = config.get("streams.page-views.physical.name") or "page-views"
    # The input exists before the producer's first send: the embedded log's, or the Kinesis stream, which the
    # admin tags with its virtual tasks (``weirflow.virtual.tasks``), as `weirflow streams create` does.
    if args.backend in ("local", "aws"):
        systems = Systems(config)
        try:
            systems.admin(systems.resolve("page-views").system).create_stream(StreamSpec(physical, PARTITIONS))
        finally:
            systems.close()
    rng = random.Random(args.seed)
    fleet = Fleet(config_path, overrides, work / "logs", args.processors)
    producer = Producer(config, args.rate, physical)
    kills: list[str] = []
    try:
        say(f"{args.processors} processors started; producing {args.rate} events/s for {args.duration} s")
        producer.start()
        started = time.monotonic()
        next_kill = started + args.kill_every
        while time.monotonic() - started < args.duration:
            time.sleep(0.5)
            if producer.error is not None:
                raise RuntimeError(f"the producer failed: {producer.error}") from producer.error
            if time.monotonic() >= next_kill:
                kills.append(fleet.kill_and_replace(rng))
                say(f"SIGKILLed {kills[-1]} (kill {len(kills)}); sent {len(producer.sent):,} events so far")
                next_kill += args.kill_every
        producer.stop_flag.set()
        producer.join()
        sent = list(producer.sent)
        send_closing_events(config, physical, max(e["event_time"] for e in sent))
        expected = results.expected_counts(sent)
        say(f"input stopped at {len(sent):,} events ({len(expected):,} windows); draining")
        got, records, replayed = drain(config, expected, args)
    finally:
        producer.stop_flag.set()
        fleet.stop()
    read = read_as_users(args, config_path, overrides, config)
    overlap, batches = overlap_ms(fleet.all_logs)
    lost = sum(max(0, n - got.get(w, 0)) for w, n in expected.items())
    exact = sum(got.get(w) == n for w, n in expected.items())
    return {
        "figure": "chaos",
        "unit": "windows",
        "value": exact,
        "kills": len(kills),
        "lost": lost,
        "duplicate_outputs": max(records - len(got), read["consume"]["duplicates"], read["helper"]["duplicates"]),
        "duplicate_outputs_consume": read["consume"]["duplicates"],
        "duplicate_outputs_helper": read["helper"]["duplicates"],
        "replayed_outputs": read["as_written"] - read["consume"]["records"],
        "intermediate_replays_dropped": replays_dropped(fleet.all_logs),
        "overlap_ms": overlap,
        "exact_windows": exact,
        "windows": len(expected),
        "missing_windows": sum(w not in got for w in expected),
        "overcounted_windows": sum(got.get(w, 0) > n for w, n in expected.items()),
        "undercounted_windows": sum(w in got and got[w] < n for w, n in expected.items()),
        "output_records": records,
        "batches_logged": batches,
        "events": len(sent),
        "duration_s": args.duration,
        "rate": args.rate,
        "kill_every_s": args.kill_every,
        "processors": args.processors,
        "backend": BACKEND_NAMES[args.backend],
        "output": "delta table" if args.output == "delta" else "stream",
        "baseline": {"what": "pandas over every event sent", "windows": len(expected), "events": len(sent)},
    }


LAKE_CONTAINER = "lake"


def delta_overrides(args: argparse.Namespace, work: Path) -> list[str]:
    """With ``--output delta``: ``page-counts`` a Delta table, on the run's disk or in Azurite."""
    if args.output != "delta":
        return []
    if args.backend == "azure":
        where = [
            f"systems.lake.path=az://{LAKE_CONTAINER}/chaos",
            "systems.lake.storage.connection.string=${AZURE_STORAGE_CONNECTION_STRING}",
        ]
    else:
        where = [f"systems.lake.path={work / 'lake'}"]
    return [
        "systems.lake.factory=delta",
        *where,
        "streams.page-counts.system=lake",
        "streams.page-counts.partitions=1",
    ]


def read_table(config: Any) -> list[dict[str, Any]]:
    """``page-counts`` as a Delta table, read as any Delta reader reads it (deltalake's SQL, then pandas)."""
    import pyarrow as pa
    from deltalake import DeltaTable, QueryBuilder

    systems = Systems(config)
    try:
        writer: Any = systems.table_writer("lake")  # weirflow_delta's: its tables' locations and options
        uri, options = writer.tables.uri("page-counts"), writer.tables.settings.storage_options()
    finally:
        systems.close()
    table = DeltaTable(uri, storage_options=options)
    found = pa.table(QueryBuilder().register("t", table).execute("select * from t").read_all()).to_pandas()
    return [
        {"page": row["page"], "window_start": row["window_start"].isoformat(), "views": int(row["views"])}
        for row in found.to_dict("records")
    ]


def _windows(values: list[dict[str, Any]]) -> dict[str, int]:
    """Records and duplicates among output rows (the closing window left out)."""
    rows = [v for v in values if v["page"] != CLOSING_PAGE]
    distinct = {(v["page"], v["window_start"][:16]) for v in rows}
    return {"records": len(rows), "duplicates": len(rows) - len(distinct)}


def consumed(config_path: Path, overrides: list[str], *flags: str) -> list[dict[str, Any]]:
    """The values ``weirflow streams consume CONFIG page-counts --json`` prints."""
    import subprocess

    command = [sys.executable, "-m", "weirflow", "streams", "consume", str(config_path), "page-counts", "--json"]
    for item in overrides:
        command += ["--set", item]
    done = subprocess.run([*command, *flags], capture_output=True, text=True, check=True, timeout=600)
    return [json.loads(line)["value"] for line in done.stdout.splitlines() if line.strip()]


def read_with_helper(args: argparse.Namespace, config: Any) -> list[dict[str, Any]]:
    """``page-counts`` read by a downstream application through `ReplayFilter`: examples/reading_results' readers
    (the azure-eventhub SDK, boto3), or the embedded log's consumer for ``local``."""
    from tests.integration.reading_results import example

    values: list[dict[str, Any]] = []
    ref = Systems(config).resolve("page-counts")
    if args.output == "delta":
        return read_table(config)
    if args.backend == "azure":
        from azure.eventhub import EventHubConsumerClient

        client = EventHubConsumerClient.from_connection_string(
            os.environ["EVENTHUBS_CONNECTION_STRING"], "$Default", eventhub_name=ref.physical
        )
        example("eventhubs").read_results(client, lambda _p, event: values.append(json.loads(event.body_as_str())))
        return values
    if args.backend == "aws":
        import boto3

        client = boto3.client("kinesis", endpoint_url=os.environ.get("KINESIS_ENDPOINT"))
        example("kinesis").read_results(
            client, ref.physical, lambda _s, record: values.append(json.loads(record["Data"]))
        )
        return values
    from weirflow.results import ReplayFilter

    systems = Systems(config)
    try:
        replays, consumer = ReplayFilter(), systems.consumer(ref.system)
        for partition in range(PARTITIONS):
            offset = "0"
            ssp = SystemStreamPartition(ref.system, ref.physical, partition)
            while batch := consumer.read(ssp, offset, 10_000):
                values += [json.loads(r.value) for r in batch if replays.is_new(partition, r.id)]
                offset = batch[-1].next_offset
    finally:
        systems.close()
    return values


def read_as_users(
    args: argparse.Namespace, config_path: Path, overrides: list[str], config: Any
) -> dict[str, Any]:
    """The output as users read it once the run is over: ``streams consume`` (and ``--replays``: as written),
    and a downstream application through the helper."""
    say("reading page-counts with `weirflow streams consume` and through ReplayFilter")
    return {
        "consume": _windows(consumed(config_path, overrides)),
        "as_written": len([v for v in consumed(config_path, overrides, "--replays") if v["page"] != CLOSING_PAGE]),
        "helper": _windows(read_with_helper(args, config)),
    }


def drain(config: Any, expected: dict, args: argparse.Namespace) -> tuple[dict, int, int]:
    """Wait until every expected window is written and the output has not changed for ``--settle`` s."""
    deadline = time.monotonic() + args.drain_timeout
    last, stable_since, said = None, time.monotonic(), 0.0
    reader = OutputReader(config)
    try:
        while True:
            got, records = reader.read()
            if (got, records) != last:
                last, stable_since = (got, records), time.monotonic()
            complete = all(w in got for w in expected)
            if complete and time.monotonic() - stable_since >= args.settle:
                return got, records, reader.replayed
            if time.monotonic() >= deadline:
                say(f"drain timed out: {sum(w not in got for w in expected)} windows not written")
                return got, records, reader.replayed
            if time.monotonic() - said >= 5:
                say(f"{len(got):,}/{len(expected):,} windows written, {records:,} records")
                said = time.monotonic()
            time.sleep(1)
    finally:
        reader.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backend", choices=sorted(CONFIGS), default="azure")
    parser.add_argument("--duration", type=float, default=180)
    parser.add_argument("--rate", type=int, default=150, help="events per second")
    parser.add_argument("--kill-every", type=float, default=20)
    parser.add_argument("--processors", type=int, default=3)
    parser.add_argument("--cores", type=int, default=1, help="Spark cores per processor (local[N])")
    parser.add_argument("--settle", type=float, default=20, help="seconds the output must stay unchanged")
    parser.add_argument("--drain-timeout", type=float, default=420)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--output", choices=["stream", "delta"], default="stream", help="page-counts a stream or a Delta table"
    )
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a config override for every processor (repeatable), e.g. job.coordinator.liveness.timeout.ms=6000",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="weirflow-chaos-") as tmp:
        line = run(args, Path(tmp))
    print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
