"""Seconds from a leader's SIGKILL until every task runs again, per coordination backend, shipped defaults.

For each backend each of ``--runs`` rounds (default 5) starts three `weirflow run` processes of the
coordination example (8 record tasks), waits until all tasks run exactly once, SIGKILLs the leader, and times
until the two survivors run every task under a new leader. The backends:

* ``local`` — the embedded default (SQLite);
* ``azure`` — lease blobs and Table Storage, on Azurite started here;
* ``aws`` — the AWS suite (``job.coordinator.factory: aws``, ``task.checkpoint.factory: dynamodb``): counter
  leases, latches, the registry and checkpoints in DynamoDB, the job model in S3, on a moto server started
  here. The example's streams stay on the embedded log: only coordination is measured.

Nothing is tuned unless ``--set`` says so: the shipped defaults are 15 s leases and an 8 s liveness timeout.
The survivors break the killed leader's leases once its heartbeat is older than the liveness timeout
(docs/coordination.md, "Failover"), so the liveness timeout, not the lease, is the floor. On ``local`` and
``azure`` a heartbeat's age is read on the store's clock. On ``aws`` DynamoDB stamps nothing, so a survivor
judges it on its *own* clock, from the moment it first saw the heartbeat's last value (as the Kinesis Client
Library judges leases): a heartbeat ages from a read after it was written, never from the write, which can add
up to one poll to the floor, and clock skew between hosts cannot shorten or lengthen it.

Prints one JSON line per backend::

    {"figure": "leader failover", "backend": "local", "unit": "s", "value": <median>, "runs": [...],
     "lease_s": 15.0, "liveness_s": 10.0, "overrides": [], "baseline": null}

The ``azure`` and ``aws`` lines' ``baseline`` is the embedded backend's median measured in the same run (null
when ``local`` is not among ``--backends``).
Usage: ``python benchmarks/failover.py [--runs N] [--backends local,azure,aws] [--set KEY=VALUE ...]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tests.support.azurite, tests.support.moto_server: the launchers of the test tree
EXAMPLE = ROOT / "examples" / "coordination" / "job.yaml"
BACKENDS = ("local", "azure", "aws")

from weirflow.base.waiting import wait_until  # noqa: E402
from weirflow.cli import status_document  # noqa: E402
from weirflow.config import load_config  # noqa: E402
from weirflow.coordination.timings import CoordinationTimings  # noqa: E402
from weirflow.interfaces.system import StreamSpec  # noqa: E402
from weirflow.job.systems import Systems  # noqa: E402
from weirflow.local.launcher import start_processor  # noqa: E402


def all_running(config, processors: set[str]) -> bool:
    """Every task assigned once, to exactly ``processors``, each RUNNING its assignment at that version."""
    doc = status_document(config)
    assignment = doc["assignment"]
    if set(assignment) != processors or not doc["task_count"]:
        return False
    assigned = [t for tasks in assignment.values() for t in tasks]
    if len(assigned) != doc["task_count"] or len(set(assigned)) != len(assigned):
        return False
    rows = {p["processor_id"]: p for p in doc["processors"] if p["live"]}
    return all(
        pid in rows
        and rows[pid]["state"] == "RUNNING"
        and rows[pid]["job_model_version"] == doc["job_model_version"]
        and sorted(rows[pid]["tasks"]) == sorted(assignment[pid])
        for pid in processors
    )


def create_streams(config) -> None:
    systems = Systems(config)
    try:
        for stream in ("page-views", "page-visits"):
            systems.admin("local").create_stream(StreamSpec(stream, config.get(f"streams.{stream}.partitions")))
    finally:
        systems.close()


def one_failover(overrides: list[str], state: Path) -> float:
    config = load_config(EXAMPLE, overrides)
    create_streams(config)
    ids = {"b1", "b2", "b3"}
    procs = {pid: start_processor(EXAMPLE, pid, overrides, log_dir=state / "logs") for pid in sorted(ids)}
    try:
        wait_until(lambda: all_running(config, ids), 120, "3 processors running every task")
        leader = status_document(config)["leader"]
        procs[leader].kill()
        killed = time.monotonic()
        wait_until(lambda: all_running(config, ids - {leader}), 120, "the survivors running every task")
        return time.monotonic() - killed
    finally:
        for proc in procs.values():
            if proc.alive():
                proc.terminate()


def measure(backend: str, runs: int, work: Path, store_keys: list[str], extra: list[str]) -> list[float]:
    """``runs`` failovers of ``backend``; ``store_keys`` are the overrides that point it at its store."""
    results = []
    for run in range(runs):
        state = work / f"{backend}-{run}"
        overrides = [f"job.state.dir={state}", f"job.id=bench-{uuid.uuid4().hex[:8]}", *store_keys, *extra]
        seconds = one_failover(overrides, state)
        print(f"# {backend} run {run + 1}/{runs}: {seconds:.2f} s", file=sys.stderr, flush=True)
        results.append(seconds)
    return results


def start_stores(backends: list[str], work: Path, stops: list[Callable[[], None]]) -> dict[str, list[str]]:
    """Start the services the backends need, each one's stop appended to ``stops`` as soon as it runs; returns
    backend -> the overrides pointing it at its store. Every job gets its own id, hence its own tables,
    containers and S3 prefix, so one service per backend serves every run."""
    keys: dict[str, list[str]] = {"local": []}
    if "azure" in backends:
        from tests.support.azurite import Azurite

        azurite = Azurite(work / "azurite").start()
        stops.append(azurite.stop)
        keys["azure"] = [
            "job.coordinator.factory=azure",
            "task.checkpoint.factory=azure-table",
            f"azure.storage.connection.string={azurite.connection_string}",
        ]
    if "aws" in backends:
        from tests.support.moto_server import MotoServer

        moto = MotoServer().start()
        stops.append(moto.stop)
        keys["aws"] = [
            "job.coordinator.factory=aws",
            "task.checkpoint.factory=dynamodb",
            *(f"{key}={value}" for key, value in moto.config().items()),
        ]
    return keys


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--backends", default="local,azure", help="comma-separated, of: " + ", ".join(BACKENDS))
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a config override for every processor (repeatable), e.g. job.coordinator.liveness.timeout.ms=6000",
    )
    args = parser.parse_args()
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    if unknown := [b for b in backends if b not in BACKENDS]:
        parser.error(f"unknown backend(s) {', '.join(unknown)}: choose among {', '.join(BACKENDS)}")
    timings = CoordinationTimings.from_config(load_config(EXAMPLE, args.set))
    medians: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="weirflow-failover-") as tmp:
        work = Path(tmp)
        stops: list[Callable[[], None]] = []
        try:
            store_keys = start_stores(backends, work, stops)
            for backend in backends:
                runs = measure(backend, args.runs, work, store_keys[backend], args.set)
                medians[backend] = statistics.median(runs)
                baseline = medians.get("local") if backend != "local" else None
                line = {
                    "figure": "leader failover",
                    "backend": backend,
                    "unit": "s",
                    "value": round(medians[backend], 2),
                    "runs": [round(r, 2) for r in runs],
                    "lease_s": timings.lease_ms / 1000,
                    "liveness_s": timings.liveness_timeout_ms / 1000,
                    "overrides": args.set,
                    "baseline": None if baseline is None else {"backend": "local", "value": round(baseline, 2)},
                }
                print(json.dumps(line), flush=True)
        finally:
            for stop in reversed(stops):
                stop()


if __name__ == "__main__":
    main()
