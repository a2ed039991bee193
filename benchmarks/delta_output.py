"""The Delta Lake output's commits against plain `write_deltalake` appends of the same rows, in the same run.

* **weirflow**: `weirflow run examples/pageviews/job.yaml`, one processor, over ``--events`` page views
  (bounded input), with ``page-counts`` a Delta table (docs/delta.md): in this run's directory, or in Azurite
  with ``--azurite`` (started here). Each micro-batch of each counting task commits its closed windows' counts
  to the table in one commit through the fence, with what makes it exactly once (a stateful task's results: the
  commit reads nothing first; its replays were read back at the task's start, docs/guarantees.md "Tables").
  The processor logs every commit's rows and milliseconds (``TABLE_COMMIT_FORMAT``).
* **plain** (``baseline``): the same rows, commit by commit (each weirflow commit's rows, read back from the
  table's log), appended to a new table in the same place with ``deltalake.write_deltalake(mode="append")`` in
  a plain loop: one call per weirflow commit, nothing else.

``value`` is weirflow's rows per second of commit time in the job, ``baseline.value`` the loop's, ``ratio`` the
first over the second (target: at least 0.8). The job's commits run while Spark works on the same two cores and
the loop runs after it, alone; so ``same_conditions`` also times the job's commits through the sink's own commit
path (`weirflow.spark.table_commits.commit_rows`, the Delta writer, everything but Spark) in a loop interleaved
with the baseline's: what the exactly-once commit itself costs beside a plain append. ``exact`` is true when
the table read with deltalake and pandas holds every window once with pandas' count. ``total_s`` is the job's
wall time (Spark included), for scale.

Prints progress on stderr and one JSON line last on stdout.
Usage: ``python benchmarks/delta_output.py [--events 200000] [--azurite] [--set KEY=VALUE ...]``.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "pageviews"
sys.path.insert(0, str(ROOT))  # tests.support.azurite: the Azurite launcher of the test tree
sys.path.insert(0, str(EXAMPLE))

import generate  # noqa: E402 - the example's event generator
import results  # noqa: E402 - the example's pandas reference

from weirflow.config import load_config  # noqa: E402
from weirflow.job.systems import Systems  # noqa: E402
from weirflow.local.launcher import start_processor  # noqa: E402

COMMIT = re.compile(r"batch \d+ committed (?P<rows>\d+) rows to table page-counts in (?P<ms>[\d.]+) ms")
CONTAINER = "lake"


def say(message: str) -> None:
    print(f"# {time.strftime('%H:%M:%S')} {message}", file=sys.stderr, flush=True)


def lake_overrides(work: Path, connection_string: str | None) -> list[str]:
    where = (
        [
            f"systems.lake.path=az://{CONTAINER}/bench",
            f"systems.lake.storage.connection.string={connection_string}",
        ]
        if connection_string
        else [f"systems.lake.path={work / 'lake'}"]
    )
    return [
        "systems.lake.factory=delta",
        *where,
        "streams.page-counts.system=lake",
        "streams.page-counts.partitions=1",
    ]


def table_access(config: Any, table: str) -> tuple[Any, dict[str, str]]:
    """The Delta system's writer, the table's URI and its storage options (weirflow_delta's own)."""
    systems = Systems(config)
    writer: Any = systems.table_writer("lake")
    return writer, {"uri": writer.tables.uri(table), "options": writer.tables.settings.storage_options()}


def commits_of(writer: Any, table: str) -> list[Any]:
    """Each commit's rows, in commit order, as the table's log says (what weirflow committed)."""
    return [rows for rows in writer.rows_since(table, -1) if rows.num_rows]


def loops(writer: Any, batches: list[Any]) -> tuple[list[float], list[float]]:
    """Milliseconds of each commit of ``batches``, one at a time, by (1) write_deltalake appending to a new table
    and (2) the sink's own commit path (`weirflow.spark.table_commits.commit_rows` through the Delta system's
    writer, the fence a no-op) to another new table: interleaved, each batch by both in turn, so that both meet
    the same machine."""
    from deltalake import write_deltalake

    from weirflow.spark.table_commits import commit_rows

    uri, options = writer.tables.uri("page-counts-plain"), writer.tables.settings.storage_options()
    plain, sink = [], []
    for rows in batches:
        began = time.perf_counter()
        write_deltalake(uri, rows, mode="append", storage_options=options)
        plain.append((time.perf_counter() - began) * 1000)
        began = time.perf_counter()
        commit_rows(writer, "page-counts-replayed", "views_by_page", rows, lambda: None)
        sink.append((time.perf_counter() - began) * 1000)
    return plain, sink


def median(values: list[float]) -> float | None:
    ordered = sorted(values)
    return round(ordered[len(ordered) // 2], 1) if ordered else None


def exact(writer: Any, table: str, events: list[dict[str, Any]]) -> tuple[bool, int]:
    """Whether the table, read with deltalake's SQL and pandas, holds every window once with pandas' count."""
    import pyarrow as pa
    from deltalake import DeltaTable, QueryBuilder

    uri, options = writer.tables.uri(table), writer.tables.settings.storage_options()
    found = pa.table(
        QueryBuilder()
        .register("t", DeltaTable(uri, storage_options=options))
        .execute("select * from t")
        .read_all()
    ).to_pandas()
    windows = [(r.page, r.window_start.strftime("%Y-%m-%dT%H:%M")) for r in found.itertuples()]
    got = dict(zip(windows, found["views"].astype(int), strict=True))
    return len(windows) == len(set(windows)) and got == results.expected_counts(events), len(windows)


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    azurite = None
    connection_string = None
    if args.azurite:
        from azure.storage.blob import BlobServiceClient

        from tests.support.azurite import Azurite

        azurite = Azurite(work / "azurite").start()
        connection_string = azurite.connection_string
        BlobServiceClient.from_connection_string(connection_string).create_container(CONTAINER)
    try:
        overrides = [f"job.state.dir={work / 'state'}", *lake_overrides(work, connection_string), *args.overrides]
        config_path = EXAMPLE / "job.yaml"
        config = load_config(config_path, overrides)
        say(f"writing {args.events:,} page views")
        events = generate.write(config, args.events)
        say("running the job: page-counts is a Delta table")
        began = time.monotonic()
        proc = start_processor(config_path, "bench", overrides, log_dir=work / "logs")
        code = proc.popen.wait(args.timeout)
        total_s = time.monotonic() - began
        log = proc.log_text()
        if code != 0:
            raise RuntimeError(f"the job failed (exit {code}):\n{log[-4000:]}")
        committed = [(int(m["rows"]), float(m["ms"])) for m in COMMIT.finditer(log)]
        rows = sum(n for n, _ in committed)
        sink_s = sum(ms for _, ms in committed) / 1000
        writer, _ = table_access(config, "page-counts")
        ok, windows = exact(writer, "page-counts", events)
        batches = commits_of(writer, "page-counts")
        say(f"{len(committed)} commits of {rows:,} rows in {sink_s:.2f} s; the same in a plain loop")
        plain_ms, replayed_ms = loops(writer, batches)
        plain_s, replayed_s = sum(plain_ms) / 1000, sum(replayed_ms) / 1000
        value = rows / sink_s if sink_s else 0.0
        baseline = rows / plain_s if plain_s else 0.0
        return {
            "figure": "delta output",
            "unit": "rows/s",
            "value": round(value, 1),
            "ratio": round(value / baseline, 3) if baseline else None,
            "target_ratio": 0.8,
            "exact": ok,
            "windows": windows,
            "rows": rows,
            "commits": len(committed),
            "commit_s": round(sink_s, 3),
            "mean_commit_ms": round(1000 * sink_s / len(committed), 1) if committed else None,
            "median_commit_ms": median([ms for _, ms in committed]),
            "slowest_commit_ms": max((ms for _, ms in committed), default=None),
            "total_s": round(total_s, 1),
            "events": args.events,
            "where": "azurite" if args.azurite else "local disk",
            "same_conditions": {
                "what": "the same commits through the sink's commit path in a plain loop, beside the baseline's",
                "value": round(rows / replayed_s, 1) if replayed_s else None,
                "ratio": round(plain_s / replayed_s, 3) if replayed_s else None,
                "median_commit_ms": median(replayed_ms),
            },
            "baseline": {
                "what": "write_deltalake(mode='append') in a plain loop: the same rows, one call per commit",
                "value": round(baseline, 1),
                "seconds": round(plain_s, 3),
                "mean_commit_ms": round(1000 * plain_s / len(batches), 1) if batches else None,
                "median_commit_ms": median(plain_ms),
                "slowest_commit_ms": round(max(plain_ms, default=0.0), 1),
            },
        }
    finally:
        if azurite is not None:
            azurite.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--azurite", action="store_true", help="the table in Azurite (started here)")
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="weirflow-delta-") as tmp:
        line = run(args, Path(tmp))
    print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
