"""The page-view counts pipeline: partition by page, then one-minute tumbling-window counts per page.

Stage `page-views` reads the input and sends its views to the intermediate stream `views-by-page`, keyed by
page, as partial counts per page and minute of each micro-batch (`Stream.aggregate`: docs/pipelines.md,
"Aggregations"); stage `views-by-page` adds them up. A window is written once the watermark passes
its end (the input's lateness, reconciled across the producer tasks by in-band watermarks), and all open
windows are written when the bounded input ends. Each output record is keyed by page and window start, so a
replay after a crash rewrites the same keys.
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

import weirflow


def per_minute(counts: DataFrame) -> DataFrame:
    return counts.select(
        "page",
        F.col("window.start").alias("window_start"),
        F.col("window.end").alias("window_end"),
        "views",
    )


def pipeline(app: weirflow.App) -> None:
    views = app.input("page-views")
    counts = (
        views.partition_by("page", name="views-by-page")
        .aggregate("page", window="1 minute", views=weirflow.agg.count())
        .transform(per_minute)
    )
    window_key = F.concat_ws("|", "page", F.date_format("window_start", "yyyy-MM-dd'T'HH:mm"))
    counts.send_to("page-counts", key=window_key)
