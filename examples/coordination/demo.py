"""`make run`: three processors share the tasks of a job on the embedded default, then `weirflow status`.

Steps: create the streams, write 20,000 page views, start 3 `weirflow run` processes, wait until every view
has been routed to `page-visits`, print the job's status and the busiest pages, then stop the processors.
Everything lives in a fresh temporary state directory, so the demo can run again and again.
"""

from __future__ import annotations

import collections
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.progress import MofNCompleteColumn, Progress

from weirflow.base.waiting import wait_until
from weirflow.cli import status_document
from weirflow.config import load_config
from weirflow.interfaces.system import OutgoingRecord, SystemStreamPartition
from weirflow.job.systems import Systems
from weirflow.local.launcher import start_processor

HERE = Path(__file__).resolve().parent
CONFIG = HERE / "job.yaml"
EVENTS = 20_000
PAGES = [f"/page/{i}" for i in range(40)]


def main() -> None:
    state = Path(tempfile.mkdtemp(prefix="weirflow-demo-"))
    overrides = [f"job.state.dir={state}"]
    cli = [sys.executable, "-m", "weirflow"]
    print(f"state directory: {state}")
    for stream in ("page-views", "page-visits"):
        subprocess.run([*cli, "streams", "create", str(CONFIG), stream, "--set", overrides[0]], check=True)

    config = load_config(CONFIG, overrides)
    systems = Systems(config)
    rng = random.Random(7)
    views = [
        {"user": f"u{rng.randrange(500)}", "page": rng.choice(PAGES), "event_time": 1_700_000_000_000 + i * 10}
        for i in range(EVENTS)
    ]
    producer = systems.producer("local")
    producer.send([OutgoingRecord("page-views", json.dumps(v).encode(), key=v["user"].encode()) for v in views])
    print(f"wrote {EVENTS} page views to local.page-views (8 partitions)")

    processors = [start_processor(CONFIG, f"demo-{n}", overrides, log_dir=state / "logs") for n in range(3)]
    print("started 3 processors: " + ", ".join(f"{p.processor_id} (pid {p.pid})" for p in processors))
    admin = systems.admin("local")
    started = time.monotonic()
    try:

        def routed() -> int:
            return sum(int(m.upcoming) for m in admin.partition_metadata("page-visits").values())

        with Progress(*Progress.get_default_columns(), MofNCompleteColumn(), transient=True) as progress:
            bar = progress.add_task("routing page views", total=EVENTS)

            def all_routed() -> bool:
                done = routed()
                progress.update(bar, completed=done)
                return done >= EVENTS

            wait_until(all_routed, 120, "every page view to reach page-visits", interval_s=0.25)
        print(f"all {EVENTS} views routed {time.monotonic() - started:.1f} s after the processors started")

        def all_running() -> bool:
            doc = status_document(config)
            running = [t for p in doc["processors"] if p["live"] for t in p["tasks"]]
            return (
                sorted(running) == sorted(t for ts in doc["assignment"].values() for t in ts) and len(running) == 8
            )

        wait_until(all_running, 60, "all 8 tasks to report running")
        subprocess.run([*cli, "status", str(CONFIG), "--set", overrides[0]], check=True)

        consumer = systems.consumer("local")
        counts: collections.Counter[str] = collections.Counter()
        for partition in range(4):
            offset = "0"
            while batch := consumer.read(SystemStreamPartition("local", "page-visits", partition), offset, 5000):
                counts.update(json.loads(r.value)["page"] for r in batch)
                offset = batch[-1].next_offset
        print("busiest pages:")
        for page, count in counts.most_common(5):
            print(f"  {page:<10} {count} views")
    finally:
        for p in processors:
            p.terminate()
        systems.close()
    print("processors stopped cleanly")


if __name__ == "__main__":
    main()
