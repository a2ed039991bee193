"""How an ``eventhub`` system reaches its namespace, read once from ``systems.<name>.*``.

Auth: ``systems.<name>.connection.string`` (a namespace connection string; an ``EntityPath`` in it is
ignored, the stream names the hub), or ``systems.<name>.fully.qualified.namespace`` with
`DefaultAzureCredential`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from weirflow.interfaces.config import ConfigView
from weirflow_azure.eventhubs.keys import DEFAULT_CONSUMER_GROUP

PARTITION_METHODS = ("hash", "round_robin", "key_as_partition")


@dataclass(frozen=True)
class EventHubsSettings:
    system: str
    connection_string: str | None
    fully_qualified_namespace: str | None
    consumer_group: str
    partition_method: str
    receive_batch_size: int
    prefetch: int
    send_attempts: int = 5
    catch_up_prefetch: int = 300

    @classmethod
    def from_config(cls, system: str, config: ConfigView) -> EventHubsSettings:
        prefix = f"systems.{system}."
        connection_string = config.get(prefix + "connection.string")
        namespace = config.get(prefix + "fully.qualified.namespace")
        if not connection_string and not namespace:
            raise config.error(
                prefix + "connection.string",
                f"Event Hubs system '{system}' needs a namespace: set this key (e.g. the output of "
                "`weirflow emulator eventhubs`) or systems.<name>.fully.qualified.namespace to sign in with "
                "DefaultAzureCredential",
            )
        if connection_string:
            # The stream names the hub: drop an EntityPath so one connection string serves every hub.
            parts = [
                p for p in connection_string.split(";") if p and not p.strip().lower().startswith("entitypath=")
            ]
            connection_string = ";".join(parts)
        method = config.get(prefix + "partition.method")
        if method not in PARTITION_METHODS:
            raise config.error(
                prefix + "partition.method", f"'{method}' is not one of {', '.join(PARTITION_METHODS)}"
            )
        return cls(
            system=system,
            connection_string=connection_string or None,
            fully_qualified_namespace=namespace or None,
            consumer_group=config.get(prefix + "consumer.group") or DEFAULT_CONSUMER_GROUP,
            partition_method=method,
            receive_batch_size=int(config.get(prefix + "receive.batch.size")),
            prefetch=int(config.get(prefix + "prefetch")),
            send_attempts=int(config.get(prefix + "send.attempts")),
            catch_up_prefetch=int(config.get(prefix + "catch-up.prefetch")),
        )

    def producer(self, hub: str, **options: Any) -> Any:
        """A producer client of ``hub``; ``options`` go to the SDK client (``retry_total=0``: one attempt)."""
        from azure.eventhub import EventHubProducerClient

        if self.connection_string:
            return EventHubProducerClient.from_connection_string(
                self.connection_string, eventhub_name=hub, **options
            )
        from azure.identity import DefaultAzureCredential

        assert self.fully_qualified_namespace is not None, "from_config requires one of them"
        return EventHubProducerClient(self.fully_qualified_namespace, hub, DefaultAzureCredential(), **options)

    def consumer(self, hub: str) -> Any:
        from azure.eventhub import EventHubConsumerClient

        if self.connection_string:
            return EventHubConsumerClient.from_connection_string(
                self.connection_string, consumer_group=self.consumer_group, eventhub_name=hub
            )
        from azure.identity import DefaultAzureCredential

        assert self.fully_qualified_namespace is not None, "from_config requires one of them"
        return EventHubConsumerClient(
            self.fully_qualified_namespace, hub, self.consumer_group, DefaultAzureCredential()
        )
