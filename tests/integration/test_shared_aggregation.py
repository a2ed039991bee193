"""The tasks a processor holds of an aggregate stage run as one query, and a task of it moves alone with its open
windows rebuilt from its intermediate partition (docs/pipelines.md, "Aggregate stages: one query per processor";
`weirflow.spark.rebuild`).

Two processors on the embedded default count views per page and minute (``partition_by``, ``aggregate``, then a
``select`` of its columns) over ten minutes of views read 100 per trigger, through three intermediate partitions,
with a lateness of 5 s, so windows close one after another while the job runs. Once task ``by_page-0`` has
checkpointed a watermark two minutes into the views (windows written and windows open), the processor holding it
is SIGKILLed right before its next checkpoint of the task (the ``before-checkpoint`` fault point, armed by a file
at that moment): its shared query had run the task past its checkpoint, writing results the checkpoint does not
name. The survivor takes it over (with ``by_page-1``); its own query restarts with the three tasks, and each
rebuilds its open windows by reading its partition again from a rebuild mark, not from the start. Every window
must then be written once, with pandas' count. It fails when a task starts at its checkpoint's offsets (open
windows undercounted) or when the query does not leave out the windows written before (written twice).

The leader trims the intermediate stream every half second meanwhile (docs/guarantees.md, "Trimming"): the
rebuild reads records the trim must have kept (a trim past the rebuild mark fails the read, and the job with it),
and at the end nothing is left below the last checkpoints.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections import Counter
from pathlib import Path

import pytest

from weirflow.config import load_config
from weirflow.interfaces.plugins import checkpoint_factory
from weirflow.interfaces.system import OutgoingRecord, StreamSpec, SystemStreamPartition
from weirflow.job.systems import Systems
from weirflow.local.launcher import ProcessorProcess, start_processor
from weirflow.runtime.control import TaskControl
from weirflow.runtime.fault_points import ARMED_BY
from weirflow.runtime.fault_points import ENV as FAULT_POINT
from weirflow.testing import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.spark]

PAGES = 7
EVENTS = 6000
SPAN_S = 600  # ten minutes of views
BASE_S = 1_795_000_000 - 1_795_000_000 % 60  # a minute boundary
KILL_AFTER_S = 120  # by_page-0's checkpointed watermark this far into the views when its holder is killed
FINISH_S = 300

JOB = """
job:
  name: shared
app:
  pipeline: shared:pipeline
job.coordinator.liveness.timeout.ms: 4000
job.debounce.time.ms: 500
job.intermediate.partitions: 3
job.trim.interval.ms: 500
streams:
  views:
    partitions: 1
    schema: "page string, event_time timestamp"
    event-time:
      field: event_time
    lateness: 5s
    bounded: true
    max-events-per-trigger: 100
  counts:
    partitions: 1
spark:
  master: "local[2]"
"""

PIPELINE = """
from weirflow import agg


def pipeline(app):
    by_page = app.input("views").partition_by("page", name="by-page")
    counted = by_page.aggregate("page", window="1 minute", views=agg.count())
    # a select after the aggregate drops the partition column: the query finds it again from "page"
    counted.transform(lambda counts: counts.select("window", "page", "views")).send_to("counts", key="page")
"""


def _event(i: int) -> dict[str, object]:
    return {"page": f"/p{(i * 7 + i // 13) % PAGES}", "event_time": BASE_S + (i * SPAN_S) // EVENTS}


def _counts(systems: Systems) -> list[dict[str, object]]:
    ref = systems.resolve("counts")
    ssp = SystemStreamPartition(ref.system, ref.physical, 0)
    return [json.loads(r.value) for r in systems.consumer(ref.system).read(ssp, "0", 100_000)]


def test_a_task_of_a_shared_aggregate_query_moves_alone_and_rebuilds_its_open_windows(
    tmp_path: Path, measure
) -> None:
    (tmp_path / "job.yaml").write_text(JOB)
    (tmp_path / "shared.py").write_text(PIPELINE)
    armed = tmp_path / "armed"
    overrides = [f"job.state.dir={tmp_path / 'state'}"]
    config = load_config(tmp_path / "job.yaml", overrides)
    systems = Systems(config)
    checkpoints = checkpoint_factory(config).get_checkpoint_manager(config)
    checkpoints.start()
    procs: list[ProcessorProcess] = []
    try:
        for stream, partitions in (("views", 1), ("counts", 1)):
            ref = systems.resolve(stream)
            systems.admin(ref.system).create_stream(StreamSpec(ref.physical, partitions))
        events = [_event(i) for i in range(EVENTS)]
        ref = systems.resolve("views")
        systems.producer(ref.system).send(
            [
                OutgoingRecord(
                    ref.physical,
                    json.dumps({**e, "event_time": int(e["event_time"]) * 1000}).encode(),
                    partition=0,
                )
                for i, e in enumerate(events)
            ]
        )
        env = {FAULT_POINT: "before-checkpoint:by_page-0:1", ARMED_BY: str(armed)}
        procs = [
            start_processor(tmp_path / "job.yaml", name, overrides, log_dir=tmp_path / "logs", env=env)
            for name in ("p1", "p2")
        ]

        def closed_of_by_page_0() -> int:
            checkpoint = checkpoints.read_last_checkpoint("by_page-0")
            closed = TaskControl.from_json(checkpoint.control).closed if checkpoint else None
            return -1 if closed is None else closed

        wait_until(
            lambda: closed_of_by_page_0() >= (BASE_S + KILL_AFTER_S) * 1000,
            FINISH_S,
            "by_page-0 to checkpoint a watermark two minutes into the views",
            0.2,
        )
        armed.touch()  # the holder of by_page-0 dies before its next checkpoint of it
        wait_until(
            lambda: any(p.popen.poll() is not None for p in procs), 60, "the holder of by_page-0 to die", 0.1
        )
        armed.unlink()  # the survivor, which takes the task over, is not to die too
        killed = next(p for p in procs if p.popen.poll() is not None)
        survivor = next(p for p in procs if p is not killed)
        assert killed.popen.returncode == -9, killed.log_text()[-4000:]
        assert survivor.popen.wait(FINISH_S) == 0, survivor.log_text()[-4000:]

        rows = _counts(systems)
        got: dict[tuple[str, str], int] = {}
        for r in rows:
            key = (str(r["page"]), str(r["window"]["start"])[:16])  # type: ignore[index]
            assert key not in got, f"window {key} written twice"
            got[key] = int(r["views"])  # type: ignore[arg-type]
        expected = Counter(
            (str(e["page"]), dt.datetime.fromtimestamp(int(e["event_time"]), dt.UTC).strftime("%Y-%m-%dT%H:%M"))
            for e in events
        )
        assert got == dict(expected), {k: (got.get(k), v) for k, v in expected.items() if got.get(k) != v}
        log_text = survivor.log_text()
        assert re.search(r"by_page-0, by_page-1, by_page-2: query \S+ started", log_text), "no query ran all three"
        rebuilt = re.findall(
            r"task by_page-0: rebuilding its windows open after (\d+) from \{'[^']+': '(\d+)'\}", log_text
        )
        assert rebuilt, log_text[-4000:]
        closed_at, point = int(rebuilt[-1][0]), int(rebuilt[-1][1])
        assert closed_at >= (BASE_S + KILL_AFTER_S) * 1000
        assert point > 0, "the task was read again from its start, not from a rebuild mark"
        admin = systems.admin("local")
        (intermediate,) = [name for name in admin.list_streams() if name.endswith("by-page")]
        kept = {p: m for p, m in admin.partition_metadata(intermediate).items()}
        assert all(int(m.oldest) > 0 and m.oldest == m.upcoming for m in kept.values()), kept
        assert "trimmed records of intermediate streams" in killed.log_text() + log_text

        measure(
            f"{killed.processor_id} SIGKILLed past by_page-0's checkpoint with its watermark at "
            f"+{(closed_at // 1000) - BASE_S} s; {survivor.processor_id} ran the three by_page tasks in one query "
            f"and rebuilt by_page-0 from offset {point}: all {len(expected)} windows once, equal to pandas; "
            f"{intermediate} trimmed to {[m.oldest for m in kept.values()]}"
        )
    except Exception:
        for proc in procs:
            print(proc.log_text()[-3000:])
        raise
    finally:
        for proc in procs:
            proc.kill()
        checkpoints.stop()
        systems.close()
