"""What keeping a task's Spark state in Blob Storage costs (``task.spark.checkpoint.store: azure``,
`weirflow_azure.coordinator.spark_state`): per committed micro-batch, and when a task is restored on another
machine.

A stateful Spark query (a rate source, counts per key and 10-minute window, ``--keys`` keys, ``--rate`` rows per
second, a 1 s trigger; Spark's own state store, as weirflow's tasks use it) runs on this machine's Spark for
``--batches`` committed batches. After each batch its checkpoint directory is mirrored to Azurite (started
here) exactly as the runner does it: the files of the committed batch not stored yet, then the manifest. Then
the copy is restored into an empty directory, as on a processor that takes the task over.

Baselines measured in the same run: the batch's own duration (Spark's ``durationMs.triggerExecution``), which
the mirror adds to the time between a batch and its checkpoint, and a local copy of the same directory
(``shutil.copytree``), the least a restore could cost.

    .venv/bin/python benchmarks/state_mirror.py [--batches 30] [--keys 20000] [--rate 20000]

The last line is JSON: ``value`` (median ms to mirror one batch), ``unit``, ``mirror_ms_p50`` / ``_p95`` /
``_max``, ``files_per_batch`` and ``bytes_per_batch`` (medians), ``batch_ms_p50`` (baseline), ``mirror_share``
(mirror / batch, medians), ``restore_s``, ``restore_files``, ``restore_bytes``, ``local_copy_s`` (baseline).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.azurite import Azurite  # noqa: E402 - the test tree's Azurite launcher
from weirflow.config.loader import Config  # noqa: E402
from weirflow.interfaces.spark_checkpoint import committed_files, last_committed_batch  # noqa: E402
from weirflow.spark.session import build_spark_session  # noqa: E402
from weirflow_azure.coordinator.spark_state import BlobSparkStateStore  # noqa: E402
from weirflow_azure.coordinator.storage import Storage, StorageSettings  # noqa: E402


def _progress(message: str) -> None:
    print(f"[state_mirror] {message}", file=sys.stderr, flush=True)


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    azurite = Azurite(work / "azurite").start()
    try:
        config = Config.from_dict(
            {
                "job.name": "statebench",
                "job.state.dir": str(work / "state"),
                "azure.storage.connection.string": azurite.connection_string,
                "spark.master": "local[2]",
            }
        )
        store = BlobSparkStateStore(Storage(StorageSettings.from_config(config)))
        spark = build_spark_session(config)
        from pyspark.sql import functions as F

        local = work / "checkpoint"
        counts = (
            spark.readStream.format("rate")
            .option("rowsPerSecond", args.rate)
            .load()
            .withWatermark("timestamp", "1 hour")
            .groupBy(F.window("timestamp", "10 minutes"), (F.col("value") % args.keys).alias("key"))
            .count()
        )
        query = (
            counts.writeStream.format("noop")
            .outputMode("update")
            .option("checkpointLocation", str(local))
            .trigger(processingTime="1 second")
            .start()
        )
        mirror_ms: list[float] = []
        files: list[int] = []
        sent: list[int] = []
        batch_ms: list[float] = []
        seen = -1
        try:
            while len(mirror_ms) < args.batches:
                progress = query.lastProgress
                committed = last_committed_batch(local)
                if progress is None or committed is None or committed <= seen:
                    time.sleep(0.05)
                    continue
                seen = committed
                report = store.mirror("bench-0", local, committed, epoch=1)
                if committed == 0:
                    continue  # the first copy sends the whole directory; the steady state is what matters
                mirror_ms.append(report.seconds * 1000)
                files.append(report.uploaded)
                sent.append(report.uploaded_bytes)
                batch_ms.append(float(progress["durationMs"].get("triggerExecution", 0)))
                _progress(
                    f"batch {committed}: {report.uploaded} files, {report.uploaded_bytes} bytes, "
                    f"{report.seconds * 1000:.0f} ms (batch {batch_ms[-1]:.0f} ms)"
                )
        finally:
            query.stop()
        final = last_committed_batch(local)
        assert final is not None
        store.mirror("bench-0", local, final, epoch=1)
        state = committed_files(local, final)
        restored = work / "restored"
        began = time.monotonic()
        batch = store.restore("bench-0", restored)
        restore_s = time.monotonic() - began
        assert batch == final and committed_files(restored, final) == state, "the restored copy differs"
        began = time.monotonic()
        shutil.copytree(local, work / "copied")
        local_copy_s = time.monotonic() - began
        spark.stop()
        store.close()
    finally:
        azurite.stop()
    mirror_p50 = statistics.median(mirror_ms)
    batch_p50 = statistics.median(batch_ms)
    return {
        "figure": "Spark state mirrored to Blob Storage (Azurite) per committed micro-batch, median",
        "unit": "ms",
        "value": round(mirror_p50, 1),
        "mirror_ms_p50": round(mirror_p50, 1),
        "mirror_ms_p95": round(statistics.quantiles(mirror_ms, n=20, method="inclusive")[18], 1),
        "mirror_ms_max": round(max(mirror_ms), 1),
        "files_per_batch": statistics.median(files),
        "bytes_per_batch": statistics.median(sent),
        "batch_ms_p50": batch_p50,
        "baseline_name": "the micro-batch's own duration (Spark triggerExecution)",
        "mirror_share": round(mirror_p50 / batch_p50, 3) if batch_p50 else None,
        "restore_s": round(restore_s, 3),
        "restore_files": len(state),
        "restore_bytes": sum(state.values()),
        "local_copy_s": round(local_copy_s, 3),
        "batches": len(mirror_ms),
        "keys": args.keys,
        "rate": args.rate,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=30)
    parser.add_argument("--keys", type=int, default=20_000)
    parser.add_argument("--rate", type=int, default=20_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="state-mirror-") as tmp:
        result = run(args, Path(tmp))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
