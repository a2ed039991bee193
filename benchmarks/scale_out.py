"""Scale-out: three processors started together share 12 tasks; seconds until each runs its share.

The example job (`examples/pageviews`, input split into 6 partitions: 12 tasks in two stages, read as an
unbounded stream so that no task finishes) runs with three `weirflow run` processes started at the same
moment on this machine, with the shipped coordination timings. Measured:

* ``value`` — seconds from the moment the *last* processor's SparkSession was up (its log line) until every
  processor runs exactly the tasks the current job model assigns it (12 in all, each once);
* ``latch_timeouts`` — job-model versions whose latch timed out because a processor did not join in time
  (target 0);
* ``versions`` — job-model versions published until then; ``total_s`` — from process start.

Baseline (``baseline``): the same job on one processor alone in the same run, seconds from its SparkSession
until it runs all 12 tasks. Prints progress on stderr and one JSON line last.
Usage: ``python benchmarks/scale_out.py [--events N]``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "pageviews"
sys.path.insert(0, str(EXAMPLE))

import generate  # noqa: E402

from weirflow.base.waiting import wait_until  # noqa: E402
from weirflow.cli import status_document  # noqa: E402
from weirflow.config import load_config  # noqa: E402
from weirflow.interfaces.coordination import LatchState, latch_name  # noqa: E402
from weirflow.job.context import JobContext  # noqa: E402
from weirflow.local.launcher import ProcessorProcess, start_processor  # noqa: E402

PARTITIONS = 6
TASKS = 2 * PARTITIONS
SESSION_READY = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) .*session ready", re.M)


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def session_ready(proc: ProcessorProcess) -> float | None:
    """Epoch seconds of the processor's "session ready" log line (local time), None before it."""
    found = SESSION_READY.search(proc.log_text())
    if not found:
        return None
    return dt.datetime.strptime(found.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()


def sharing(config: object, processors: set[str]) -> tuple[bool, int]:
    """(every processor of ``processors`` runs exactly its assignment of all tasks, job-model version)."""
    doc = status_document(config)
    assignment = doc["assignment"]
    if set(assignment) != processors or doc["task_count"] != TASKS:
        return False, doc["job_model_version"]
    assigned = [t for tasks in assignment.values() for t in tasks]
    if len(assigned) != TASKS or len(set(assigned)) != TASKS:
        return False, doc["job_model_version"]
    rows = {p["processor_id"]: p for p in doc["processors"] if p["live"]}
    ok = all(
        pid in rows
        and rows[pid]["job_model_version"] == doc["job_model_version"]
        and sorted(rows[pid]["tasks"]) == sorted(assignment[pid])
        for pid in processors
    )
    return ok, doc["job_model_version"]


def latch_timeouts(config: object, versions: int) -> int:
    ctx = JobContext.open(config, owner="scale-out-watch")
    try:
        return sum(
            ctx.coordination.latch(latch_name(v)).state() is LatchState.TIMED_OUT for v in range(1, versions + 1)
        )
    finally:
        ctx.close()


def run(events: int, count: int, state: Path) -> dict[str, float | int]:
    overrides = [
        f"job.state.dir={state}",
        f"streams.page-views.partitions={PARTITIONS}",
        f"streams.page-counts.partitions={PARTITIONS}",
        "streams.page-views.bounded=false",
    ]
    config = load_config(EXAMPLE / "job.yaml", overrides)
    generate.write(config, events)
    log(f"starting {count} processor(s) together")
    started = time.time()
    procs = [
        start_processor(EXAMPLE / "job.yaml", f"scale-{i}", overrides, log_dir=state / "logs")
        for i in range(count)
    ]
    ids = {p.processor_id for p in procs}
    try:
        version = 0

        def shared() -> bool:
            nonlocal version
            for p in procs:
                if not p.alive():
                    raise SystemExit(f"{p.processor_id} exited:\n{p.log_text()[-3000:]}")
            ok, version = sharing(config, ids)
            return ok

        wait_until(shared, 600, f"{count} processor(s) to share {TASKS} tasks", interval_s=0.2)
        done = time.time()
        sessions = [session_ready(p) for p in procs]
        last_session = max(s for s in sessions if s is not None)
        figures = {
            "seconds": round(done - last_session, 2),
            "total_s": round(done - started, 2),
            "versions": version,
            "latch_timeouts": latch_timeouts(config, version),
        }
    finally:
        for p in procs:
            p.terminate()
    log(f"{count} processor(s): {figures}")
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=60_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="weirflow-scale-out-") as tmp:
        three = run(args.events, 3, Path(tmp) / "three")
        one = run(args.events, 1, Path(tmp) / "one")
    print(
        json.dumps(
            {
                "figure": "3 processors started together: last SparkSession up -> every processor runs its share",
                "unit": "s",
                "value": three["seconds"],
                "tasks": TASKS,
                "latch_timeouts": three["latch_timeouts"],
                "versions": three["versions"],
                "total_s": three["total_s"],
                "baseline": one["seconds"],
                "baseline_name": "1 processor alone, SparkSession up -> all 12 tasks running, same run",
                "target_s": 10,
            }
        )
    )


if __name__ == "__main__":
    main()
