"""Steady-state events/s of the page-view counts job against one plain Spark query, same events, same run.

Both sides count the same generated page views (one-minute tumbling windows per page, 30 s lateness) on this
machine's cores (`local[2]`) with the same Spark settings (weirflow's session defaults), except that the plain
query's JVM keeps its default compilers, as a user running plain Spark would (weirflow's processors use the
quick compiler only: docs/pipelines.md, "The JVM compiles with its quick compiler only"):

* **weirflow**: `weirflow run examples/pageviews/job.yaml`, one processor, 8 task queries in two stages with
  the intermediate stream between them, checkpoints and control messages included. Its input is the
  embedded log's `page-views` stream (4 partitions), its output `page-counts`.
* **plain Spark**: one Structured Streaming query in a fresh Python process reading the same events from
  JSON-lines files of 50,000 events, as many files per micro-batch as weirflow's input tasks read events in
  one round together (by default 4: its 4 input tasks read `task.max.records.per.trigger` = 50,000 each;
  `--set` of that key changes both sides), into a `memory` sink. Its last
  file ends with one end marker (page ``__end__``, year 9999) so that its watermark passes every window, as
  weirflow's end-of-stream does; the marker's own window never closes and is not counted.

**Measured the same way on both sides** (``value`` and ``baseline``): the events not yet processed when the
first output record appeared, divided by the time from that moment to the end of the job (weirflow: every
task checkpointed ``finished``; plain Spark: its last micro-batch ended). An event is processed once the
last stage consumed it (weirflow: the intermediate rows its second stage checkpointed; plain Spark: the
input rows of its batches). Start-up (JVM, SparkSession, query
starts, the first micro-batch's warm-up) is left out of both and reported apart: ``startup_s`` is processor
start to every task running, ``total_s`` process start to job end, ``baseline_total_s`` likewise for the
plain query.

``exact`` is true when weirflow's window counts equal the plain query's (read from its memory sink).

Prints progress on stderr and one JSON line last on stdout.
Usage: ``python benchmarks/pipeline_throughput.py [--events N]`` (default 2,000,000).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "pageviews"
sys.path.insert(0, str(EXAMPLE))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import generate  # noqa: E402
import results  # noqa: E402
from jobwatch import JobWatch, two_stage_tasks  # noqa: E402

from weirflow.config import load_config  # noqa: E402
from weirflow.local.launcher import start_processor  # noqa: E402

EVENTS_PER_FILE = 50_000

PLAIN_SPARK = r"""
import datetime, json, sys, time
from weirflow.spark.session import prepare_environment, spark_settings
from weirflow.config.loader import Config
prepare_environment()
from pyspark.sql import SparkSession, functions as F
started = time.time()
builder = SparkSession.builder
settings = spark_settings(Config.from_dict({"job.name": "plain", "spark.master": "local[2]"}))
settings.pop("spark.driver.defaultJavaOptions", None)  # plain Spark as a user runs it: the JVM's own compilers
for key, value in settings.items():
    builder = builder.config(key, value)
spark = builder.getOrCreate()
views = (spark.readStream.schema("user string, page string, event_time timestamp")
         .option("maxFilesPerTrigger", int(sys.argv[3])).json(sys.argv[1])
         .withWatermark("event_time", "30 seconds"))
counts = (views.groupBy(F.window("event_time", "1 minute"), "page").count()
          .select("page", F.date_format("window.start", "yyyy-MM-dd'T'HH:mm").alias("window"), "count"))
query = (counts.writeStream.format("memory").queryName("counts").outputMode("append")
         .trigger(availableNow=True).option("checkpointLocation", sys.argv[2]).start())
query.awaitTermination()
def ended(p):
    begun = datetime.datetime.fromisoformat(p["timestamp"].replace("Z", "+00:00")).timestamp()
    return begun + p["durationMs"]["triggerExecution"] / 1000
batches = [{"end": ended(p), "rows": p["numInputRows"], "out": p["sink"].get("numOutputRows", -1)}
           for p in query.recentProgress]
counts = {f"{r['page']}|{r['window']}": r["count"] for r in spark.table("counts").collect()}
print(json.dumps({"started": started, "batches": batches, "counts": counts}))
"""


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def run_weirflow(
    events: int, state: Path, settings: list[str]
) -> tuple[dict[str, float | None], dict[tuple[str, str], int]]:
    overrides = [f"job.state.dir={state}", *settings]
    config = load_config(EXAMPLE / "job.yaml", overrides)
    log(f"writing {events:,} page views to the embedded log")
    generate.write(config, events)
    log("running the pageviews job (1 processor)")
    started = time.time()
    proc = start_processor(EXAMPLE / "job.yaml", "bench-0", overrides, log_dir=state / "logs")
    watch = JobWatch(
        config,
        "page-views",
        "page-counts",
        task_count=two_stage_tasks(config, config.get("streams.page-views.partitions")),
        last_stage_input=f"pageviews-{config.get('job.id')}-views-by-page",
    )
    try:
        timeline = watch.watch(proc.alive, started, timeout_s=3600)
    finally:
        watch.close()
    if proc.terminate() != 0 or timeline.finished is None:
        raise SystemExit(f"weirflow run failed:\n{proc.log_text()[-3000:]}")
    figures = {
        "tasks": watch.task_count,
        "value": timeline.steady_rate(events),
        "startup_s": timeline.startup_s(),
        "total_s": timeline.finished - started,
        "first_output_s": (timeline.first_output or started) - started,
    }
    return figures, results.read_counts(config)


def files_per_trigger(settings: list[str]) -> int:
    """Files per plain-Spark micro-batch holding what weirflow's input tasks read in one round together
    (`task.max.records.per.trigger` per task, one task per input partition), so both sides batch alike."""
    config = load_config(EXAMPLE / "job.yaml", settings)
    per_round = int(config.get("task.max.records.per.trigger")) * int(config.get("streams.page-views.partitions"))
    return max(1, per_round // EVENTS_PER_FILE)


def run_plain_spark(
    events: int, work: Path, settings: list[str]
) -> tuple[dict[str, float | None], dict[tuple[str, str], int]]:
    data = work / "events"
    data.mkdir()
    log(f"writing the same events as JSON files of {EVENTS_PER_FILE:,} for plain Spark")
    out = None
    for i, event in enumerate(generate.events(events)):
        if i % EVENTS_PER_FILE == 0:
            if out:
                out.close()
            out = open(data / f"part-{i // EVENTS_PER_FILE:05d}.json", "w")
        out.write(json.dumps(event) + "\n")
    if out:
        out.write(json.dumps({"user": "-", "page": "__end__", "event_time": "9999-12-30T00:00:00.000Z"}) + "\n")
        out.close()
    log("running the plain Spark query")
    spawned = time.time()
    done = subprocess.run(
        [sys.executable, "-c", PLAIN_SPARK, str(data), str(work / "checkpoint"), str(files_per_trigger(settings))],
        check=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    report = json.loads(done.stdout.strip().splitlines()[-1])
    batches = [b for b in report["batches"] if b["rows"] or b["out"]]
    first = next((i for i, b in enumerate(batches) if b["out"] > 0), 0)
    end = batches[-1]["end"]
    rows_before = sum(b["rows"] for b in batches[: first + 1])
    figures = {
        "baseline": (events - rows_before) / (end - batches[first]["end"]),
        "baseline_total_s": end - spawned,
    }
    counts = {tuple(k.split("|", 1)): v for k, v in report["counts"].items()}
    return figures, counts  # type: ignore[return-value]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=2_000_000)
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a config override for the weirflow job (to try a lever); repeatable",
    )
    parser.add_argument("--skip-baseline", action="store_true", help="weirflow only (ratio and exact: null)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="weirflow-bench-") as tmp:
        work = Path(tmp)
        ours, our_counts = run_weirflow(args.events, work / "state", args.set)
        plain, plain_counts = (
            ({"baseline": None, "baseline_total_s": None}, None)
            if args.skip_baseline
            else run_plain_spark(args.events, work, args.set)
        )
    value, baseline = ours["value"], plain["baseline"]
    print(
        json.dumps(
            {
                "figure": (
                    f"pageviews job steady-state throughput (2 stages, {ours['tasks']} tasks, 1 processor, "
                    "embedded default)"
                ),
                "unit": "events/s",
                "events": args.events,
                "value": round(value) if value else None,
                "baseline": round(baseline) if baseline else None,
                "baseline_name": (
                    "one plain Spark Structured Streaming query (json files, same windows, same Spark settings, "
                    "the JVM's default compilers)"
                ),
                "ratio": round(value / baseline, 3) if value and baseline else None,
                "startup_s": round(ours["startup_s"], 2) if ours["startup_s"] is not None else None,
                "total_s": round(ours["total_s"], 2),
                "first_output_s": round(ours["first_output_s"], 2),
                "baseline_total_s": round(plain["baseline_total_s"], 2) if plain["baseline_total_s"] else None,
                "windows": len(our_counts),
                "exact": our_counts == plain_counts if plain_counts is not None else None,
                **({"settings": args.set} if args.set else {}),
            }
        )
    )


if __name__ == "__main__":
    main()
