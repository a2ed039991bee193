"""How an ``eventhub`` system signs in, read from config (no connection is made here)."""

from __future__ import annotations

import pytest
from azure.identity import DefaultAzureCredential

from weirflow.config.loader import Config
from weirflow.errors import ConfigError
from weirflow_azure.eventhubs.settings import EventHubsSettings


def _settings(**keys: object) -> EventHubsSettings:
    config = Config.from_dict({"job.name": "j", "systems.eh.factory": "eventhub",
                               **{f"systems.eh.{k}": v for k, v in keys.items()}}, source="job.yaml")  # fmt: skip
    return EventHubsSettings.from_config("eh", config)


def test_a_namespace_signs_in_with_default_azure_credential() -> None:
    settings = _settings(**{"fully.qualified.namespace": "ns1.servicebus.windows.net", "consumer.group": "jobs"})
    producer, consumer = settings.producer("views"), settings.consumer("views")
    try:
        for client in (producer, consumer):
            # The SDK keeps these privately; they are what it will connect to and sign in with.
            assert client._address.hostname == "ns1.servicebus.windows.net"
            assert client.eventhub_name == "views"
            assert isinstance(client._credential, DefaultAzureCredential)
        assert consumer._consumer_group == "jobs"
    finally:
        producer.close()
        consumer.close()


def test_a_connection_string_s_entity_path_is_dropped_so_it_serves_every_hub() -> None:
    settings = _settings(**{"connection.string": "Endpoint=sb://ns2.servicebus.windows.net/;SharedAccessKeyName=k;"
                                                 "SharedAccessKey=c2VjcmV0;EntityPath=one"})  # fmt: skip
    assert "EntityPath" not in (settings.connection_string or "")
    producer = settings.producer("two")
    try:
        assert producer.eventhub_name == "two"
        assert producer._address.hostname == "ns2.servicebus.windows.net"
    finally:
        producer.close()


def test_neither_is_a_config_error_naming_the_key_and_the_file() -> None:
    with pytest.raises(ConfigError, match=r"key 'systems.eh.connection.string' in job.yaml: .*fully.qualified"):
        _settings()
