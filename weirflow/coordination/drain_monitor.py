"""`DrainMonitor`: how a processor learns that its deployment is to drain (docs/drain.md).

The follower polls the job's metadata store for a `DrainNotification` of its run id (one listing of the small
``drain/`` prefix per `job.drain.poll.interval.ms`). On the first one it creates the host-local drain flag
(`weirflow.job.drain_notice.drain_flag_path`) that the Spark sources of its input streams look for when they plan
their next batch: from then on they read up to a cut and no further, and the tasks drain as they end (the
data plane's part: `weirflow.spark.source`, `weirflow.spark.task_progress`). Notifications for other run ids are
logged once and ignored, so a drained job restarted under a new run id is not drained again by the old one.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable

from weirflow.interfaces.config import ConfigView
from weirflow.interfaces.metadata import MetadataStore
from weirflow.job.drain_notice import DrainNotification, DrainUtils, drain_flag_path, run_id_of

log = logging.getLogger("weirflow.processor")


class DrainMonitor:
    """Polls for this deployment's drain notification; once seen it stays seen (a drain is not cancelled)."""

    def __init__(
        self, metadata: MetadataStore, config: ConfigView, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._drains = DrainUtils(metadata)
        self.run_id = run_id_of(config)
        self.flag = drain_flag_path(config)
        self._interval_s = int(config.get("job.drain.poll.interval.ms")) / 1000
        self._clock = clock
        self._next_poll = 0.0
        self._ignored: set[str] = set()
        self.notice: DrainNotification | None = None

    def poll(self) -> DrainNotification | None:
        """This deployment's drain notification once it exists (checked when a poll is due), else None."""
        if self.notice is not None:
            return self.notice
        now = self._clock()
        if now < self._next_poll:
            return None
        self._next_poll = now + self._interval_s
        for notice in self._drains.all():
            if notice.run_id == self.run_id:
                self._begin(notice)
                return notice
            if notice.uuid not in self._ignored:
                self._ignored.add(notice.uuid)
                log.info(
                    "ignoring drain notification %s: it is for run %r and this deployment is run %r",
                    notice.uuid,
                    notice.run_id,
                    self.run_id,
                )
        return None

    def _begin(self, notice: DrainNotification) -> None:
        self.flag.parent.mkdir(parents=True, exist_ok=True)
        self.flag.write_text(json.dumps(notice.to_json()))
        self.notice = notice
        log.info(
            "drain requested (notification %s, run %r): input streams stop at their next batch's cut, every "
            "window is flushed, and the processor exits once every task has drained",
            notice.uuid,
            self.run_id,
        )
