"""Query progress as the processor reads it: Spark's own JSON, delivered by a lean listener.

The processor checkpoints every task from its query's progress reports (docs/pipelines.md, "How a task
runs"). PySpark's `StreamingQueryListener` converts each event field by field over Py4J before Python sees it
(dozens of calls per report: measured at about a tenth of a core for 8 queries), and polling each query
costs calls even when nothing happened. `ProgressFeed` instead implements Spark's listener interface for
Python directly and takes each report as one JSON string (two Py4J calls), handing it to a queue so that
Spark's listener bus never waits for the processor's work.

`ProgressView` gives a report (a JSON dict, from the feed or from ``query.lastProgress``) the attribute shape
the runner reads.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import queue
from typing import Any

from weirflow.interfaces.spark_checkpoint import SourceOffset
from weirflow.runtime.control import MAX_TIMESTAMP_MS

log = logging.getLogger("weirflow.spark")


def parse_spark_time(text: str | None) -> int | None:
    """Milliseconds of a progress timestamp such as ``2026-01-01T00:00:00.000Z``; None when absent."""
    if not text:
        return None
    try:
        parsed = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return MAX_TIMESTAMP_MS if text.startswith("+") or text[:4] > "9998" else None
    return int(parsed.timestamp() * 1000)


class ProgressView:
    """One progress report (Spark's JSON, parsed) with the attributes the runner reads."""

    def __init__(self, data: dict[str, Any]) -> None:
        self.id = str(data.get("id", ""))
        self.batchId = int(data["batchId"])
        self.eventTime = data.get("eventTime") or {}
        self.stateOperators = data.get("stateOperators") or []
        # the feed's JSON gives dicts; ``query.recentProgress`` (read when a query stops) gives PySpark Rows
        self.observedMetrics = {name: _plain(row) for name, row in (data.get("observedMetrics") or {}).items()}
        self.sources = [SourceView(s) for s in data.get("sources") or []]
        self.started_ms = parse_spark_time(data.get("timestamp"))  # when the batch's trigger fired
        self.duration_ms = int((data.get("durationMs") or {}).get("triggerExecution") or 0)


def _plain(row: Any) -> Any:
    """An observed-metrics row as plain dicts and lists (a PySpark ``Row`` has no ``get``)."""
    return row.asDict(recursive=True) if hasattr(row, "asDict") else row


class SourceView:
    """One source of a report; `end` is its end offset when it is a weirflow source (`SourceOffset`)."""

    def __init__(self, data: dict[str, Any]) -> None:
        end = data.get("endOffset")
        end = json.loads(end) if isinstance(end, str) else end
        self.end: SourceOffset | None = SourceOffset.from_json(end) if SourceOffset.is_one(end) else None

    def watermark(self) -> int:
        """The watermark the source injected up to this batch (-1 when none)."""
        return self.end.watermark if self.end is not None else -1


class ProgressFeed:
    """Spark's ``PythonStreamingQueryListener`` interface, implemented for Py4J: progress reports and query
    terminations go to `events` as ``("progress", json text)`` and ``("terminated", query id, error)``."""

    def __init__(self) -> None:
        self.events: queue.Queue[tuple[str, ...]] = queue.Queue()
        self._registered: Any = None

    # --- the listener interface (called on Spark's listener bus, through Py4J) --------------------------
    def onQueryStarted(self, event: Any) -> None:
        pass

    def onQueryProgress(self, event: Any) -> None:
        try:
            self.events.put(("progress", event.progress().json()))
        except Exception:  # never let an error reach Spark's listener bus
            log.exception("could not read a query progress report")

    def onQueryIdle(self, event: Any) -> None:
        pass

    def onQueryTerminated(self, event: Any) -> None:
        try:
            error = event.exception()
            self.events.put(("terminated", str(event.id()), str(error.get()) if error.isDefined() else ""))
        except Exception:
            log.exception("could not read a query termination")

    class Java:
        implements = ["org.apache.spark.sql.streaming.PythonStreamingQueryListener"]

    # --- registration -------------------------------------------------------------------------------------
    def register(self, spark: Any) -> None:
        """Add the feed to ``spark``'s streaming query manager (the way PySpark adds its own listeners)."""
        from pyspark.java_gateway import ensure_callback_server_started

        ensure_callback_server_started(spark.sparkContext._gateway)
        jvm = spark.sparkContext._jvm
        self._registered = jvm.org.apache.spark.sql.streaming.PythonStreamingQueryListenerWrapper(self)
        spark._jsparkSession.streams().addListener(self._registered)

    def unregister(self, spark: Any) -> None:
        if self._registered is not None:
            spark._jsparkSession.streams().removeListener(self._registered)
            self._registered = None
