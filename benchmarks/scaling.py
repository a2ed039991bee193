"""Throughput and start-up of the page-view counts job as its task count grows, on one processor.

The example job (`examples/pageviews`) runs three times, each on the same ``--events`` generated page views
(default 1,000,000) but with its input stream split into 4, 16 and 64 partitions: that many tasks per stage
(tasks total: twice as many; the first stage is stateless and runs as one query, each task of the second,
windowed stage runs its own query). Per run, measured as `pipeline_throughput.py` measures it (`jobwatch`):

* ``events_per_s`` — once running: the events not yet processed when every task had started, over the time
  from then to the job's end (the first output is no anchor here: with many tasks a windowed job may
  emit everything at its end);
* ``steady_events_per_s`` — as `pipeline_throughput.py` measures it, from the first output to the end
  (None when the first output came with the end);
* ``startup_s`` — processor start to every task having started.

The baseline is the 4-partition run of the same invocation; ``ratio_64_to_4`` is the 64-partition figure
over it (target: at least 0.8). ``--set KEY=VALUE`` (repeatable) adds a config override to every run, e.g.
``--set job.intermediate.partitions=1`` to run the windowed stage as one task and one query
(docs/design/data-plane.md).
Prints progress on stderr and one JSON line last.
Usage: ``python benchmarks/scaling.py [--events N] [--partitions 4,16,64] [--set KEY=VALUE ...]``.
"""

from __future__ import annotations

import argparse
import json
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


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def run(events: int, partitions: int, state: Path, settings: list[str]) -> dict[str, float | int | bool | None]:
    overrides = [
        f"job.state.dir={state}",
        f"streams.page-views.partitions={partitions}",
        f"streams.page-counts.partitions={partitions}",
        *settings,
    ]
    config = load_config(EXAMPLE / "job.yaml", overrides)
    tasks = two_stage_tasks(config, partitions)
    log(f"{partitions} partitions: writing {events:,} page views")
    produced = generate.write(config, events)
    log(f"{partitions} partitions: running the job ({tasks} tasks)")
    started = time.time()
    proc = start_processor(EXAMPLE / "job.yaml", f"scaling-{partitions}", overrides, log_dir=state / "logs")
    watch = JobWatch(
        config,
        "page-views",
        "page-counts",
        task_count=tasks,
        last_stage_input=f"pageviews-{config.get('job.id')}-views-by-page",
    )
    try:
        timeline = watch.watch(proc.alive, started, timeout_s=3600)
    finally:
        watch.close()
    if proc.terminate() != 0 or timeline.finished is None:
        raise SystemExit(f"weirflow run failed with {partitions} partitions:\n{proc.log_text()[-3000:]}")
    rate, steady, startup = timeline.running_rate(events), timeline.steady_rate(events), timeline.startup_s()
    figures = {
        "partitions": partitions,
        "tasks": tasks,
        "events_per_s": round(rate) if rate else None,
        "steady_events_per_s": round(steady) if steady else None,
        "startup_s": round(startup, 2) if startup is not None else None,
        "total_s": round(timeline.finished - started, 2),
        "exact": results.read_counts(config) == results.expected_counts(produced),
    }
    log(f"{partitions} partitions: {figures}")
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--partitions", default="4,16,64", help="comma-separated partition counts")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a config override")
    args = parser.parse_args()
    counts = [int(p) for p in args.partitions.split(",")]
    runs = []
    with tempfile.TemporaryDirectory(prefix="weirflow-scaling-") as tmp:
        for partitions in counts:
            runs.append(run(args.events, partitions, Path(tmp) / f"p{partitions}", args.set))
    by = {r["partitions"]: r for r in runs}
    base, last = by[counts[0]], by[counts[-1]]
    ratio = last["events_per_s"] / base["events_per_s"] if last["events_per_s"] and base["events_per_s"] else None
    print(
        json.dumps(
            {
                "figure": "pageviews throughput by partitions (tasks per stage), 1 processor, embedded default",
                "unit": "events/s",
                "value": last["events_per_s"],
                "baseline": base["events_per_s"],
                "baseline_name": f"the same job with {counts[0]} partitions, same run",
                f"ratio_{counts[-1]}_to_{counts[0]}": round(ratio, 3) if ratio else None,
                "events": args.events,
                "overrides": args.set,
                "runs": runs,
                "exact": all(r["exact"] for r in runs),
            }
        )
    )


if __name__ == "__main__":
    main()
