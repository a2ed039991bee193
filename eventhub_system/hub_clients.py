"""The SDK producer clients of an ``eventhub`` system's admin or producer: one per hub, opened once the hub is
known to exist, and closed together."""

from __future__ import annotations

import logging
import threading
from typing import Any

from weirflow.base.errors import StreamNotFoundError
from weirflow_azure.eventhubs.errors import hub_errors
from weirflow_azure.eventhubs.settings import EventHubsSettings

log = logging.getLogger("weirflow.eventhub")


class HubClients:
    """Producer clients per hub, shared by admin and producer calls of one object; closed together."""

    def __init__(self, settings: EventHubsSettings) -> None:
        self.settings = settings
        self._producers: dict[str, Any] = {}
        self._probed: dict[str, int] = {}  # partition counts the probe just read, not yet asked for
        self._guard = threading.Lock()

    def producer(self, hub: str) -> Any:
        """The hub's shared producer client; the first call for a hub checks that it exists (`_probe`)."""
        with self._guard:
            if hub not in self._producers:
                count = self._probe(hub)
                if count is not None:
                    self._probed[hub] = count
                self._producers[hub] = self.settings.producer(hub)
            return self._producers[hub]

    def probed_partitions(self, hub: str) -> int | None:
        """The partition count the hub's probe read, once: the first `partition_count` of a hub needs no
        management round trip of its own (each is about a third of a second on the emulator)."""
        with self._guard:
            return self._probed.pop(hub, None)

    def _probe(self, hub: str) -> int | None:
        """Ask for the hub's properties once, without the SDK's retries: a hub that does not exist is a
        `StreamNotFoundError` now, not after the SDK retried the service's "not found" answer with back-off
        (about 13 s per call with its defaults: the SDK retries every failed management request alike). Any
        other failure is left to the retrying client that follows. Returns the hub's partition count, or None
        when the probe failed."""
        client = self.settings.producer(hub, retry_total=0)
        try:
            with hub_errors(self.settings.system, hub):
                return len(client.get_eventhub_properties()["partition_ids"])
        except StreamNotFoundError:
            raise
        except Exception as exc:  # transient or not, the retrying client decides and reports it
            log.debug("event hub %s: the existence probe failed (%s); the retrying client goes on", hub, exc)
            return None
        finally:
            client.close()

    def close(self) -> None:
        with self._guard:
            producers, self._producers = self._producers, {}
        for client in producers.values():
            client.close()
