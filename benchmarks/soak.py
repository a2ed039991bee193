"""Soak: the example job unbounded for a while at a steady rate, and what its state directory grows by.

One `weirflow run` processor of `examples/pageviews` on the embedded default, with `streams.page-views.bounded`
false, fed ``--rate`` events a second (the example's generator, ten sends a second) for ``--minutes``. Every
``--sample-s`` the state directory is measured by part:

* ``input`` and ``outputs``: the bytes (keys, values, ids) the embedded log holds of the job's input stream and of
  its output streams (the user's data: what their retention, ``streams.<id>.retention``, bounds);
* ``intermediate``: the same for the job's intermediate streams (what the leader trims: docs/guarantees.md,
  "Trimming");
* ``ids``: the output ids the embedded log keeps to drop replays (``record_ids``);
* ``checkpoints``: the job database (coordination, checkpoints, metadata), on disk;
* ``spark``: the Spark checkpoint and state directories, on disk;
* ``directory``: everything under the state directory, on disk (``du``), and ``streams_file``: the embedded log's
  file.

The growth of each part over the second half of the run (after warm-up) is given per million events and per day
at that rate; ``job_owned`` is everything but input and outputs (intermediate, ids, checkpoints, Spark). The
processor tree's RSS is taken at the half and at the end (``rss_mb_per_min``: its slope over the second half), also
by kind of process (``rss_mb_start_end_by_process``: the processor, Spark's JVM, the Python workers).
The **baseline**, measured in the same run, is the input stream's own growth: the events the user appended.

Prints progress on stderr and one JSON line last. Usage: ``python benchmarks/soak.py [--rate 2000]
[--minutes 20] [--sample-s 30] [--set streams.page-views.retention=5m ...]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, NamedTuple

from chaos import Producer, say  # benchmarks/ is the script's own folder, first on sys.path
from jobwatch import two_stage_tasks, wait_all_running

from weirflow.config import load_config
from weirflow.interfaces.system import StreamSpec
from weirflow.job.systems import Systems
from weirflow.local.factories import job_database_path, stream_database_path
from weirflow.local.launcher import start_processor

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "pageviews"
MB = 1_000_000
PARTS = ("input", "intermediate", "outputs", "ids", "checkpoints", "spark")


def disk_bytes(path: Path) -> int:
    """Bytes on disk under ``path`` (``du``'s allocated blocks: what fills a disk)."""
    if not path.exists():
        return 0
    # Spark deletes old batch files while du walks the tree: du then exits 1 for them, still printing a total
    out = subprocess.run(["du", "-s", "-B1", str(path)], capture_output=True, text=True).stdout
    return int(out.split()[0]) if out.strip() else 0


def file_bytes(path: Path) -> int:
    """An SQLite file with its write-ahead log."""
    return sum(disk_bytes(Path(f"{path}{suffix}")) for suffix in ("", "-wal"))


def tree_rss(pid: int) -> dict[str, int]:
    """RSS in bytes of ``pid`` (``processor``) and of every process below it: Spark's JVM (``jvm``) and the rest
    (``python_workers``: the fork servers, worker daemons and source runners)."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            status = Path(f"/proc/{entry}/status").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
        rss[int(entry)] = next(
            (int(line.split()[1]) * 1024 for line in status.splitlines() if line.startswith("VmRSS:")), 0
        )
    kinds = {"processor": 0, "jvm": 0, "python_workers": 0}
    todo = [pid]
    while todo:
        current = todo.pop()
        try:
            java = Path(f"/proc/{current}/exe").resolve().name == "java"
        except OSError:
            java = False
        kinds["processor" if current == pid else "jvm" if java else "python_workers"] += rss.get(current, 0)
        todo += children.get(current, [])
    return kinds


class Sample(NamedTuple):
    elapsed_s: float  # since the producer started
    events: int  # sent so far
    rss: dict[str, int]  # by kind of process (`tree_rss`)
    parts: dict[str, int]  # bytes by part of the state directory (`Sampler.sample`)

    @property
    def rss_total(self) -> int:
        return sum(self.rss.values())


class Sampler:
    """Measures the parts of one job's state directory."""

    def __init__(self, config: Any, state: Path) -> None:
        self.state = state
        self.streams_db = stream_database_path(config, "local")
        self.job_db = job_database_path(config)
        systems = Systems(config)
        self.input = systems.resolve("page-views").physical
        self.outputs = {systems.resolve("page-counts").physical}
        systems.close()

    def sample(self) -> dict[str, int]:
        conn = sqlite3.connect(f"file:{self.streams_db}?mode=ro", uri=True, timeout=30)
        try:
            held = dict(
                conn.execute(
                    "SELECT stream, SUM(LENGTH(value) + IFNULL(LENGTH(key), 0) + IFNULL(LENGTH(id), 0)) "
                    "FROM records GROUP BY stream"
                ).fetchall()
            )
            ids = conn.execute("SELECT IFNULL(SUM(LENGTH(stream) + LENGTH(id)), 0) FROM record_ids").fetchone()[0]
        finally:
            conn.close()
        parts = {
            "input": int(held.get(self.input, 0)),
            "outputs": sum(int(v) for k, v in held.items() if k in self.outputs or k.endswith(".dlq")),
            "intermediate": sum(
                int(v)
                for k, v in held.items()
                if k != self.input and k not in self.outputs and not k.endswith(".dlq")
            ),
            "ids": int(ids),
            "checkpoints": file_bytes(self.job_db),
            "spark": sum(disk_bytes(p) for p in self.state.iterdir() if p.is_dir()),
            "streams_file": file_bytes(self.streams_db),
            "directory": disk_bytes(self.state),
        }
        parts["job_owned"] = parts["intermediate"] + parts["ids"] + parts["checkpoints"] + parts["spark"]
        return parts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=int, default=2000, help="events per second")
    parser.add_argument("--minutes", type=float, default=20, help="how long to feed the job")
    parser.add_argument("--sample-s", type=float, default=30, help="seconds between two measurements")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a config override")
    parser.add_argument("--keep", type=Path, help="run in this directory and keep it (default: a temporary one)")
    args = parser.parse_args()
    work = args.keep or Path(tempfile.mkdtemp(prefix="weirflow-soak-"))
    try:
        result = run(args, work)
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(result))


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    work.mkdir(parents=True, exist_ok=True)
    for name in ("job.yaml", "pipeline.py", "generate.py"):
        shutil.copy(EXAMPLE / name, work / name)
    state = work / "state"
    overrides = [f"job.state.dir={state}", "streams.page-views.bounded=false", *args.set]
    config = load_config(work / "job.yaml", overrides)
    systems = Systems(config)
    partitions = int(config.get("streams.page-views.partitions") or 4)
    for stream in ("page-views", "page-counts"):
        ref = systems.resolve(stream)
        systems.admin(ref.system).create_stream(StreamSpec(ref.physical, partitions))
    say(f"starting the processor (state in {state})")
    proc = start_processor(work / "job.yaml", "soak-0", overrides, log_dir=work / "logs")
    producer = Producer(config, args.rate, systems.resolve("page-views").physical)
    try:
        wait_all_running(config, two_stage_tasks(config, partitions), "soak-watch", interval_s=0.5)
        sampler = Sampler(config, state)
        producer.start()
        started = time.monotonic()
        samples: list[Sample] = []
        end = args.minutes * 60
        while True:
            elapsed = time.monotonic() - started
            if producer.error is not None:
                raise RuntimeError(f"the producer failed: {producer.error}")
            if proc.popen.poll() is not None:
                raise RuntimeError(f"the processor exited ({proc.popen.returncode}):\n{proc.log_text()[-3000:]}")
            parts = sampler.sample()
            samples.append(Sample(elapsed, len(producer.sent), tree_rss(proc.popen.pid), parts))
            sizes = ", ".join(f"{part} {parts[part] / MB:,.2f}" for part in PARTS)
            directory = parts["directory"] / MB
            say(
                f"{elapsed / 60:5.1f} min, {len(producer.sent):,} events: directory {directory:,.1f} MB "
                f"({sizes}); RSS {samples[-1].rss_total / MB:,.0f} MB"
            )
            if elapsed >= end:
                break
            time.sleep(max(0.0, min(args.sample_s, end - elapsed)))
    finally:
        producer.stop_flag.set()
        producer.join(30)
        proc.terminate()
        systems.close()
    return summary(args, samples)


def summary(args: argparse.Namespace, samples: list[Sample]) -> dict[str, Any]:
    """Growth over the second half of the run (the first is warm-up: windows open, Spark compiles, the tables
    reach their working size)."""
    half = samples[-1].elapsed_s / 2
    first = next(s for s in samples if s.elapsed_s >= half)
    last = samples[-1]
    span_s, events = last.elapsed_s - first.elapsed_s, last.events - first.events
    per_day = 86_400 / span_s if span_s else 0.0
    growth = {part: last.parts[part] - first.parts[part] for part in last.parts}
    return {
        "figure": "state directory growth of the example job, unbounded, embedded default, 1 processor",
        "unit": "MB",
        "value": round(growth["job_owned"] / MB, 2),
        "rate": args.rate,
        "minutes": args.minutes,
        "overrides": args.set,
        "measured_minutes": round(span_s / 60, 1),
        "events_measured": events,
        "growth_mb": {part: round(v / MB, 2) for part, v in growth.items()},
        "growth_mb_per_million_events": {
            part: round(v / MB / (events / 1e6), 2) if events else None for part, v in growth.items()
        },
        "growth_gb_per_day": {part: round(v * per_day / 1e9, 2) for part, v in growth.items()},
        "directory_mb_start_end": [round(sample.parts["directory"] / MB, 1) for sample in (first, last)],
        "directory_change_pct": round(100 * growth["directory"] / first.parts["directory"], 1),
        "rss_mb_start_end": [round(first.rss_total / MB), round(last.rss_total / MB)],
        "rss_mb_per_min": round((last.rss_total - first.rss_total) / MB / (span_s / 60), 2) if span_s else None,
        "rss_mb_start_end_by_process": {
            kind: [round(first.rss[kind] / MB), round(last.rss[kind] / MB)] for kind in last.rss
        },
        "baseline": round(growth["input"] / MB, 2),
        "baseline_name": "the input stream's own growth over the same span (the events appended), same run",
        "target_job_owned_mb": 5,
    }


if __name__ == "__main__":
    sys.exit(main())
