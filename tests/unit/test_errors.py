"""Errors by type: every error weirflow and its plugins define is a `WeirflowError`, and Event Hubs SDK errors
become weirflow's through one table, by exception type and AMQP condition, never by message text."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest
from azure.core.exceptions import ClientAuthenticationError, ServiceRequestError
from azure.eventhub._transport._pyamqp_transport import PyamqpTransport
from azure.eventhub.exceptions import (
    AuthenticationError,
    ClientClosedError,
    ConnectError,
    ConnectionLostError,
    EventDataSendError,
    EventHubError,
    OperationTimeoutError,
)

from weirflow import errors
from weirflow.errors import ServiceUnavailableError, StreamNotFoundError, WeirflowError
from weirflow_azure.eventhubs.errors import (
    EVENTHUB_ERRORS,
    EventHubsAccessError,
    EventHubsError,
    classify,
    hub_errors,
    is_transient,
)

# Every package the distribution installs (pyproject.toml [tool.setuptools] packages; the emulator included).
PACKAGES = ["weirflow", "weirflow_azure.coordinator", "weirflow_azure.checkpoint", "weirflow_azure.eventhubs"]


def _modules() -> list[str]:
    names = []
    for package in PACKAGES:
        root = importlib.import_module(package)
        names.append(package)
        found = pkgutil.walk_packages(root.__path__, f"{package}.")
        names += [m.name for m in found if m.name.split(".")[-1] != "__main__"]  # __main__ runs the CLI
    return names


def test_every_exception_defined_by_weirflow_or_its_plugins_is_a_weirflow_error() -> None:
    defined = []
    for name in _modules():
        module = importlib.import_module(name)  # an import error fails the test: every module must be checked
        defined += [
            cls
            for _, cls in inspect.getmembers(module, inspect.isclass)
            if issubclass(cls, BaseException) and cls.__module__ == name
        ]
    names = {f"{c.__module__}.{c.__qualname__}" for c in defined}
    assert {
        "weirflow.tasks.record_task._Abandoned",
        "weirflow_azure.eventhubs.errors.EventHubsError",
        "weirflow_azure.eventhubs.emulator.server.FilterError",
    } <= names, "the walk missed modules"
    outsiders = sorted(f"{c.__module__}.{c.__qualname__}" for c in defined if not issubclass(c, WeirflowError))
    assert outsiders == []


def test_errors_that_were_value_errors_still_are() -> None:
    from weirflow.control import MalformedMessageError
    from weirflow.pipeline.api import PipelineError
    from weirflow.spark.serde import DecodeError

    moved = (PipelineError, DecodeError, MalformedMessageError, errors.TapError)
    assert all(cls.__module__ == "weirflow.errors" for cls in moved), "their one home, still importable as before"
    for cls in (
        *moved,
        errors.InvalidArgumentError,
        errors.PartitionNotFoundError,
        errors.InvalidOffsetError,
        errors.StreamExistsError,
        errors.MalformedDocumentError,
    ):
        assert issubclass(cls, ValueError) and issubclass(cls, WeirflowError), cls
    for cls in (errors.StateError, errors.UnreadableRangeError):
        assert issubclass(cls, RuntimeError) and issubclass(cls, WeirflowError), cls


# --- the Event Hubs table --------------------------------------------------------------------------------
def _sdk(status_code: int) -> EventHubError:
    """What the SDK raises for a management reply with ``status_code`` (its own translation, not a mock)."""
    return PyamqpTransport._create_eventhub_exception(PyamqpTransport.get_error(status_code, "the reply"))


def test_a_missing_hub_is_told_by_the_service_s_condition_not_by_the_message() -> None:
    missing = _sdk(404)
    assert isinstance(missing, ConnectError) and missing.error == "not-found"
    assert classify(missing) is StreamNotFoundError
    assert not is_transient(missing), "a missing hub is not retried"
    # message text alone says nothing: an error quoting "404" or "NotFound" without the condition is not one
    assert classify(EventHubError("status 404 NotFound: entity could not be found")) is EventHubsError


def test_transient_permanent_and_unknown_errors() -> None:
    for transient in (
        ConnectionLostError("lost"),
        OperationTimeoutError("slow"),
        ConnectError("refused"),
        ServiceRequestError("token endpoint down"),
    ):
        assert classify(transient) is ServiceUnavailableError and is_transient(transient), transient
    busy = ConnectionLostError("throttled")
    busy.error = "server-busy"
    assert is_transient(busy)
    refused_link = ConnectionLostError("detached")
    refused_link.error = "unauthorized-access"
    assert classify(refused_link) is EventHubsAccessError, "the condition wins over the type"
    for permanent, target in [
        (_sdk(401), EventHubsAccessError),
        (AuthenticationError("bad key"), EventHubsAccessError),
        (ClientAuthenticationError("no identity"), EventHubsAccessError),
        (EventDataSendError("refused"), EventHubsError),
        (ClientClosedError("closed"), EventHubsError),
        (EventHubError("other"), EventHubsError),
    ]:
        assert classify(permanent) is target and not is_transient(permanent), permanent
    assert classify(ValueError("ours")) is None
    assert all(issubclass(target, WeirflowError) for target in EVENTHUB_ERRORS.values())


def test_hub_errors_raise_weirflow_errors_naming_the_hub_and_keep_the_sdk_error_as_cause() -> None:
    missing = _sdk(404)
    with pytest.raises(StreamNotFoundError, match=r"event hub 'views' does not exist .* 'eh'.*--hub views:N"):
        with hub_errors("eh", "views"):
            raise missing
    with pytest.raises(ServiceUnavailableError, match="system 'eh' unavailable for event hub 'views'") as err:
        with hub_errors("eh", "views"):
            raise ConnectionLostError("socket closed")
    assert isinstance(err.value.__cause__, ConnectionLostError)
    with pytest.raises(EventHubsAccessError, match="systems.eh.connection.string"):
        with hub_errors("eh", "views"):
            raise AuthenticationError("bad key")
    for untouched in (ValueError("partition 9 does not exist"), StreamNotFoundError("already ours")):
        with pytest.raises(type(untouched)) as err:
            with hub_errors("eh", "views"):
                raise untouched
        assert err.value is untouched


def test_the_admin_reports_a_missing_hub_as_stream_not_found() -> None:
    from weirflow.config.loader import Config
    from weirflow_azure.eventhubs.clients import EventHubSystemAdmin
    from weirflow_azure.eventhubs.settings import EventHubsSettings

    config = Config.from_dict(
        {
            "job.name": "j",
            "systems.eh.factory": "eventhub",
            "systems.eh.connection.string": "Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=k;"
            "SharedAccessKey=a2V5",
        }
    )
    admin = EventHubSystemAdmin(EventHubsSettings.from_config("eh", config), {"missing": 2})

    class Producer:
        def get_partition_ids(self) -> list[str]:
            raise _sdk(404)

        def close(self) -> None:
            pass

    admin._clients._producers["missing"] = Producer()
    with pytest.raises(StreamNotFoundError, match="event hub 'missing'"):
        admin.partition_count("missing")
    assert admin.list_streams() == {}
    admin.close()
