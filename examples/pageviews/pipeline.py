"""The page-view counts pipeline: partition by page, then one-minute tumbling-window counts per page.

Stage `page-views` reads the input and writes every view to the intermediate stream `views-by-page`, keyed by
page; stage `views-by-page` counts views per page and minute. A window is written once the watermark passes
its end (the input's lateness, reconciled across the producer tasks by in-band watermarks), and all open
windows are written when the bounded input ends. Each output record is keyed by page and window start, so a
replay after a crash rewrites the same keys.
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

import weirflow


def count_per_minute(views: DataFrame) -> DataFrame:
    return (
        views.groupBy(F.window("event_time", "1 minute"), "page")
        .count()
        .select(
            "page",
            F.col("window.start").alias("window_start"),
            F.col("window.end").alias("window_end"),
            F.col("count").alias("views"),
        )
    )


def pipeline(app: weirflow.App) -> None:
    views = app.input("page-views")
    counts = views.partition_by("page", name="views-by-page").transform(count_per_minute)
    window_key = F.concat_ws("|", "page", F.date_format("window_start", "yyyy-MM-dd'T'HH:mm"))
    counts.send_to("page-counts", key=window_key)
