"""Latency of a running job at a steady input rate: append to output per event, and window delay.

Two runs on the embedded default, one processor each, with this process writing events at a steady rate
(``--rate``, default 2,000 events/s, in batches every 50 ms) into a 4-partition input stream:

1. **stateless** (two stages): ``events -> partition_by("k") -> send_to("out")``. Per event, the latency is
   the output record's append time minus the time its event was appended to the input (both stamped by this
   machine's clock: the embedded log stamps records when appended). Keys ``p50_ms``, ``p95_ms``, ``p99_ms``.
2. **windowed** (two stages): ``events -> partition_by("page") -> 1-second tumbling counts`` with 1 s lateness,
   as ``Stream.aggregate`` (default: partials cross the stage boundary) or ``--windowed-as transform`` (a
   ``groupBy`` in a transform: every event crosses).
   A window can be emitted once the watermark passes its end plus the lateness; its *delay* is its output
   record's append time minus (window end + lateness), the event time being the send time. Key
   ``window_delay_p99_ms`` (and ``window_delay_p50_ms``).

Each run first writes ``--warmup`` seconds of events that are not measured (the JVM compiles Spark's code in
the first seconds of a job), then ``--seconds`` (default 60) that are; the job runs until every measured
event (or window) reached the output.

**Baseline** (``baseline_p50_ms``, ``baseline_p99_ms``), same run, same rate, warm-up and trigger interval
(500 ms), weirflow's Spark settings but the JVM's default compilers: one plain Spark query reading the
events as JSON-lines files that this process drops into a directory every 50 ms (an event is sent when its
file appears), writing with ``foreachBatch`` to the driver; an event's latency is the time its batch reached
the driver minus its send time. It has no second stage: a plain query repartitions through Spark's own
shuffle.

``--set KEY=VALUE`` (repeatable) adds a config override to both weirflow runs, e.g.
``--set job.intermediate.partitions=1`` (docs/design/data-plane.md). Prints progress on stderr and one JSON line
last. Usage: ``python benchmarks/latency.py [--rate 2000] [--seconds 60] [--warmup 15] [--set KEY=VALUE ...]``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

from jobwatch import two_stage_tasks, wait_all_running  # benchmarks/ is the script's own folder, first on sys.path

from weirflow.base.waiting import wait_until
from weirflow.config import load_config
from weirflow.interfaces.system import OutgoingRecord, StreamSpec, SystemStreamPartition
from weirflow.job.systems import Systems
from weirflow.local.launcher import start_processor

PARTITIONS = 4
LATENESS_MS = 1000

JOB = """
job.name: latency
app.pipeline: pipeline:{pipeline}
streams:
  events:
    partitions: {partitions}
    schema: "id bigint, k string, page string, event_time timestamp"
    event-time:
      field: event_time
    lateness: {lateness}ms
  out:
    partitions: {partitions}
  windows:
    partitions: {partitions}
spark:
  master: "local[2]"
"""

PIPELINE = """
from pyspark.sql import functions as F


def stateless(app):
    app.input("events").partition_by("k", name="by-k").send_to("out", key="id")


def windowed_transform(app):
    counts = app.input("events").partition_by("page", name="by-page").transform(
        lambda df: df.groupBy(F.window("event_time", "1 second"), "page").count().select(
            "page", F.col("window.end").alias("window_end"), "count"))
    counts.send_to("windows", key=F.concat_ws("|", "page", F.col("window_end").cast("string")))


def windowed_aggregate(app):
    from weirflow import agg

    counts = app.input("events").partition_by("page", name="by-page").aggregate(
        "page", window="1 second", count=agg.count()).transform(
        lambda df: df.select("page", F.col("window.end").alias("window_end"), "count"))
    counts.send_to("windows", key=F.concat_ws("|", "page", F.col("window_end").cast("string")))
"""


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class Producer(threading.Thread):
    """Appends ``rate`` events per second in batches every 50 ms; remembers when each measured id was sent."""

    def __init__(self, config: object, rate: int, warmup_s: float, seconds: float) -> None:
        super().__init__(daemon=True)
        self.systems = Systems(config)
        self.rate, self.warmup_s, self.seconds = rate, warmup_s, seconds
        self.measured_from = 0  # first measured id
        self.sent = 0

    def run(self) -> None:
        producer = self.systems.producer("local")
        started = time.monotonic()
        tick = 0.05
        while True:
            elapsed = time.monotonic() - started
            if elapsed >= self.warmup_s + self.seconds:
                break
            if self.measured_from == 0 and elapsed >= self.warmup_s:
                self.measured_from = self.sent
            due = int(elapsed * self.rate) + int(tick * self.rate)
            now = dt.datetime.now(dt.UTC)
            stamp = now.isoformat(timespec="milliseconds").replace("+00:00", "Z")
            batch = []
            while self.sent < due:
                i = self.sent
                event = {"id": i, "k": f"k{i % 997}", "page": f"/p/{i % 50}", "event_time": stamp}
                batch.append(OutgoingRecord("events", json.dumps(event).encode(), partition=i % PARTITIONS))
                self.sent += 1
            producer.send(batch)
            time.sleep(max(0.0, tick - (time.monotonic() - started - elapsed)))
        self.systems.close()


def read_all(systems: Systems, stream: str) -> list[tuple[dict, int]]:
    """(row, append time ms) of every record of ``stream``."""
    consumer = systems.consumer("local")
    rows = []
    for partition in range(PARTITIONS):
        ssp = SystemStreamPartition("local", stream, partition)
        offset = "0"
        while records := consumer.read(ssp, offset, 10_000):
            rows += [(json.loads(r.value), r.timestamp_ms) for r in records]
            offset = records[-1].next_offset
    return rows


def input_times(systems: Systems) -> dict[int, int]:
    return {row["id"]: ts for row, ts in read_all(systems, "events")}


def run(work: Path, pipeline: str, args: argparse.Namespace) -> tuple[Systems, Producer, object]:
    work.mkdir(parents=True)
    (work / "pipeline.py").write_text(textwrap.dedent(PIPELINE))
    (work / "job.yaml").write_text(JOB.format(pipeline=pipeline, partitions=PARTITIONS, lateness=LATENESS_MS))
    overrides = [f"job.state.dir={work / 'state'}", *args.set]
    config = load_config(work / "job.yaml", overrides)
    systems = Systems(config)
    admin = systems.admin("local")
    for stream in ("events", "out", "windows"):
        admin.create_stream(StreamSpec(stream, PARTITIONS))
    log(f"{pipeline}: starting the processor")
    proc = start_processor(work / "job.yaml", "latency-0", overrides, log_dir=work / "logs")
    wait_all_running(config, two_stage_tasks(config, PARTITIONS), "latency-watch")
    log(
        f"{pipeline}: all tasks running; writing {args.rate} events/s for {args.warmup:.0f} s (warm-up) "
        f"+ {args.seconds:.0f} s"
    )
    producer = Producer(config, args.rate, args.warmup, args.seconds)
    producer.start()
    producer.join()
    return systems, producer, proc


def measure_stateless(work: Path, args: argparse.Namespace) -> dict[str, float]:
    systems, producer, proc = run(work, "stateless", args)
    try:
        total = producer.sent
        wait_until(
            lambda: (
                sum(int(m.upcoming) for m in systems.admin("local").partition_metadata("out").values()) >= total
            ),
            300,
            "every event in the output",
            interval_s=0.5,
        )
        sent = input_times(systems)
        latencies = [
            ts - sent[row["id"]] for row, ts in read_all(systems, "out") if row["id"] >= producer.measured_from
        ]
    finally:
        proc.terminate()
        systems.close()
    return {
        "p50_ms": percentile(latencies, 0.5),
        "p95_ms": percentile(latencies, 0.95),
        "p99_ms": percentile(latencies, 0.99),
        "max_ms": max(latencies),
        "events_measured": len(latencies),
    }


def measure_windows(work: Path, args: argparse.Namespace) -> dict[str, float]:
    systems, producer, proc = run(work, f"windowed_{args.windowed_as}", args)
    try:
        sent = input_times(systems)
        first = min(ts for i, ts in sent.items() if i >= producer.measured_from)
        last = max(sent.values())
        # every full window after the first measured event whose end + lateness passed before the last event
        due = (last - LATENESS_MS) // 1000 * 1000
        wanted = {(f"/p/{p}", end) for p in range(50) for end in range((first // 1000 + 2) * 1000, due, 1000)}

        def windows() -> dict[tuple[str, int], int]:
            out = {}
            for row, ts in read_all(systems, "windows"):
                end = int(dt.datetime.fromisoformat(row["window_end"].replace("Z", "+00:00")).timestamp() * 1000)
                out.setdefault((row["page"], end), ts)
            return out

        wait_until(lambda: wanted <= set(windows()), 300, "every measured window in the output", interval_s=1)
        emitted = windows()
        delays = [emitted[w] - (w[1] + LATENESS_MS) for w in wanted]
    finally:
        proc.terminate()
        systems.close()
    return {
        "window_delay_p50_ms": percentile(delays, 0.5),
        "window_delay_p99_ms": percentile(delays, 0.99),
        "windows_measured": len(delays),
    }


PLAIN_SPARK = r"""
import json, sys, time
from weirflow.spark.session import prepare_environment, spark_settings
from weirflow.config.loader import Config
prepare_environment()
from pyspark.sql import SparkSession
builder = SparkSession.builder
settings = spark_settings(Config.from_dict({"job.name": "plain", "spark.master": "local[2]"}))
settings.pop("spark.driver.defaultJavaOptions", None)  # plain Spark as a user runs it: the JVM's own compilers
for key, value in settings.items():
    builder = builder.config(key, value)
spark = builder.getOrCreate()
out = open(sys.argv[3], "w")

def deliver(frame, batch_id):
    ids = [row.id for row in frame.select("id").collect()]
    out.write(json.dumps({"at": time.time(), "ids": ids}) + "\n")
    out.flush()

events = spark.readStream.schema("id bigint, k string, page string, event_time timestamp").json(sys.argv[1])
query = (events.repartition(4, "k").writeStream.foreachBatch(deliver).trigger(processingTime="500 milliseconds")
         .option("checkpointLocation", sys.argv[2]).start())
print("ready", flush=True)
query.awaitTermination()
"""


def measure_plain_spark(work: Path, args: argparse.Namespace) -> dict[str, float]:
    import subprocess

    data, delivered = work / "events", work / "delivered.jsonl"
    data.mkdir(parents=True)
    log("plain Spark: starting the query")
    command = [sys.executable, "-c", PLAIN_SPARK, str(data), str(work / "checkpoint"), str(delivered)]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        log(f"plain Spark: writing {args.rate} events/s for {args.warmup:.0f} s (warm-up) + {args.seconds:.0f} s")
        sent: dict[int, float] = {}
        started, tick, count, measured_from = time.monotonic(), 0.05, 0, None
        while (elapsed := time.monotonic() - started) < args.warmup + args.seconds:
            if measured_from is None and elapsed >= args.warmup:
                measured_from = count
            due = int(elapsed * args.rate) + int(tick * args.rate)
            stamp = dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
            lines = []
            while count < due:
                lines.append(
                    json.dumps(
                        {"id": count, "k": f"k{count % 997}", "page": f"/p/{count % 50}", "event_time": stamp}
                    )
                )
                count += 1
            if lines:
                partial = data / f".{count}.tmp"
                partial.write_text("\n".join(lines) + "\n")
                partial.rename(data / f"{count:012d}.json")
                now = time.time()
                for i in range(count - len(lines), count):
                    sent[i] = now
            time.sleep(max(0.0, tick - (time.monotonic() - started - elapsed)))

        def arrived() -> dict[int, float]:
            times = {}
            if delivered.exists():
                for line in delivered.read_text().splitlines():
                    batch = json.loads(line)
                    times.update((i, batch["at"]) for i in batch["ids"])
            return times

        wait_until(lambda: len(arrived()) >= count, 300, "plain Spark to deliver every event", interval_s=0.5)
        times = arrived()
        latencies = [(times[i] - sent[i]) * 1000 for i in range(measured_from or 0, count)]
    finally:
        proc.kill()
        proc.wait()
    return {"baseline_p50_ms": percentile(latencies, 0.5), "baseline_p99_ms": percentile(latencies, 0.99)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=int, default=2000, help="events per second")
    parser.add_argument("--seconds", type=float, default=60, help="measured seconds of input")
    parser.add_argument("--warmup", type=float, default=15, help="seconds of input before measuring")
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="a config override for both weirflow runs"
    )
    parser.add_argument(
        "--windowed-as",
        choices=("aggregate", "transform"),
        default="aggregate",
        help="the windowed job's counts as Stream.aggregate (partials cross the stage boundary) or a transform",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="weirflow-latency-") as tmp:
        stateless = measure_stateless(Path(tmp) / "stateless", args)
        windows = measure_windows(Path(tmp) / "windowed", args)
        plain = measure_plain_spark(Path(tmp) / "plain", args)
    print(
        json.dumps(
            {
                "figure": "append-to-output latency at a steady rate (2 stages, 1 processor, embedded default)",
                "unit": "ms",
                "value": stateless["p99_ms"],
                "rate": args.rate,
                "overrides": args.set,
                "windowed_as": args.windowed_as,
                "seconds": args.seconds,
                **{k: round(v) for k, v in stateless.items()},
                **{k: round(v) for k, v in windows.items()},
                **{k: round(v) for k, v in plain.items()},
                "baseline_name": (
                    "one plain Spark query (json files every 50 ms, same trigger, foreachBatch, "
                    "the JVM's default compilers), same run"
                ),
                "lateness_ms": LATENESS_MS,
                "target_p99_ms": 2000,
            }
        )
    )


if __name__ == "__main__":
    main()
