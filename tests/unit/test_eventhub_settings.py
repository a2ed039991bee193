"""How an ``eventhub`` system signs in, read from config (no connection is made here)."""

from __future__ import annotations

import pytest
from azure.identity import DefaultAzureCredential

from weirflow.base.errors import ConfigError
from weirflow.config.loader import Config
from weirflow_azure.eventhubs.settings import EventHubsSettings


def _settings(**keys: object) -> EventHubsSettings:
    config = Config.from_dict(
        {"job.name": "j", "systems.eh.factory": "eventhub", **{f"systems.eh.{k}": v for k, v in keys.items()}},
        source="job.yaml",
    )
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
    settings = _settings(
        **{
            "connection.string": "Endpoint=sb://ns2.servicebus.windows.net/;SharedAccessKeyName=k;"
            "SharedAccessKey=c2VjcmV0;EntityPath=one"
        }
    )
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


def test_the_default_consumer_group_is_defined_once_in_the_plugin() -> None:
    import ast
    from pathlib import Path

    from weirflow_azure.eventhubs.checkpoint_layout import EventHubsSystem
    from weirflow_azure.eventhubs.keys import DEFAULT_CONSUMER_GROUP, KEYS

    root = Path(__file__).resolve().parents[2]
    homes = [
        path.relative_to(root).as_posix()
        for folder in ("weirflow", "azure_coordinator", "checkpoint", "eventhub_system")
        for path in sorted((root / folder).rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Constant) and node.value == "$Default"
    ]
    assert homes == ["eventhub_system/keys.py"]
    assert _settings(**{"fully.qualified.namespace": "ns"}).consumer_group == DEFAULT_CONSUMER_GROUP
    assert EventHubsSystem("ns").consumer_group == DEFAULT_CONSUMER_GROUP
    assert {k.name: k.default for k in KEYS}["systems.<name>.consumer.group"] == DEFAULT_CONSUMER_GROUP
