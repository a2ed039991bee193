"""Events/s of the page-view counts job on the embedded default, against one plain Spark query.

Both sides count the same generated events (one-minute tumbling windows per page) in the same run:

* **weirflow**: `weirflow run examples/pageviews/job.yaml`, one processor, from process start to job finished
  (Spark start, coordination, both stages, the intermediate stream and checkpoints included);
* **plain Spark**: one Structured Streaming query in a fresh Python process reading the same events from a
  JSON-lines directory (the `json` file source with the same schema, the same watermark and window,
  `Trigger.AvailableNow`) and writing to a `noop` sink, from process start to query end.

Prints one JSON line: ``{"figure": ..., "unit": "events/s", "value": ..., "baseline": ..., "ratio": ...}``.
Usage: ``python benchmarks/pipeline_throughput.py [--events N]`` (default 200,000).
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

import generate  # noqa: E402
import results  # noqa: E402

from weirflow.config import load_config  # noqa: E402
from weirflow.local.launcher import start_processor, wait_until  # noqa: E402

PLAIN_SPARK = r'''
import sys, time
from weirflow.spark.session import prepare_environment
prepare_environment()
from pyspark.sql import SparkSession, functions as F
spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
         .config("spark.sql.shuffle.partitions", "4").config("spark.sql.session.timeZone", "UTC").getOrCreate())
spark.sparkContext.setLogLevel("ERROR")
views = (spark.readStream.schema("user string, page string, event_time timestamp").json(sys.argv[1])
         .withWatermark("event_time", "30 seconds"))
counts = views.groupBy(F.window("event_time", "1 minute"), "page").count()
query = (counts.writeStream.format("noop").outputMode("append").trigger(availableNow=True)
         .option("checkpointLocation", sys.argv[2]).start())
query.awaitTermination()
'''


def run_weirflow(events: int, state: Path) -> tuple[float, int]:
    overrides = [f"job.state.dir={state}"]
    config = load_config(EXAMPLE / "job.yaml", overrides)
    produced = generate.write(config, events)
    started = time.monotonic()
    proc = start_processor(EXAMPLE / "job.yaml", "bench-0", overrides, log_dir=state / "logs")
    wait_until(lambda: not proc.alive(), 1800, "the job to finish", interval_s=0.2)
    elapsed = time.monotonic() - started
    if proc.terminate() != 0:
        raise SystemExit(f"weirflow run failed:\n{proc.log_text()[-3000:]}")
    counts = results.read_counts(config)
    if counts != results.expected_counts(produced):
        raise SystemExit("weirflow counts differ from pandas; not reporting a throughput")
    return elapsed, len(counts)


def run_plain_spark(events: int, work: Path) -> float:
    data = work / "events"
    data.mkdir()
    with open(data / "part-0.json", "w") as out:
        for event in generate.events(events):
            out.write(json.dumps(event) + "\n")
    started = time.monotonic()
    subprocess.run([sys.executable, "-c", PLAIN_SPARK, str(data), str(work / "checkpoint")], check=True,
                   stderr=subprocess.DEVNULL)
    return time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=200_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="weirflow-bench-") as tmp:
        work = Path(tmp)
        weirflow_s, windows = run_weirflow(args.events, work / "state")
        spark_s = run_plain_spark(args.events, work)
    value = args.events / weirflow_s
    baseline = args.events / spark_s
    print(json.dumps({
        "figure": "pageviews job throughput (2 stages, 8 task queries, 1 processor, embedded default)",
        "unit": "events/s",
        "events": args.events,
        "windows": windows,
        "value": round(value),
        "seconds": round(weirflow_s, 2),
        "baseline": round(baseline),
        "baseline_name": "one plain Spark Structured Streaming query (json file source, same windows), same run",
        "baseline_seconds": round(spark_s, 2),
        "ratio": round(value / baseline, 3),
    }))


if __name__ == "__main__":
    main()
