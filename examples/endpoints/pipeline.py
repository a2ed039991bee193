"""The latest page view of each user, served as the table ``last_view`` (docs/endpoints.md).

Stage `page-views` writes every view to the intermediate stream `views-by-user`, keyed by user, so all views of
a user meet in one task; stage `views-by-user` keeps each user's latest view in that task's served table. Any
processor answers ``GET /tables/last_view/<user>``: it finds the task holding the user and asks its processor.
"""

from __future__ import annotations

from pyspark.sql import DataFrame

import weirflow


def latest_fields(views: DataFrame) -> DataFrame:
    return views.select("user", "page", "event_time")


def pipeline(app: weirflow.App) -> None:
    views = app.input("page-views")
    views.partition_by("user", name="views-by-user").transform(latest_fields).serve("last_view", key="user")
