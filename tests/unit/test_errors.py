"""Errors by type: every error weirflow and its plugins define is a `WeirflowError`, and Event Hubs SDK errors
become weirflow's through one table, by exception type and AMQP condition, never by message text."""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import re
import textwrap

import pytest
from azure.core.exceptions import (
    AzureError,
    ClientAuthenticationError,
    HttpResponseError,
    ResourceExistsError,
    ResourceModifiedError,
    ResourceNotFoundError,
    ServiceRequestError,
    ServiceResponseError,
)
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
from botocore import exceptions as botocore_exceptions
from botocore.exceptions import ClientError

from weirflow.base import errors
from weirflow.base.errors import ServiceUnavailableError, StreamNotFoundError, WeirflowError
from weirflow.config.loader import Config
from weirflow_azure.coordinator import errors as storage_errors
from weirflow_azure.eventhubs.errors import (
    EVENTHUB_ERRORS,
    EventHubsAccessError,
    EventHubsError,
    classify,
    hub_errors,
    is_transient,
)
from weirflow_kinesis import errors as kinesis_errors

# Every package the distribution installs (pyproject.toml [tool.setuptools] packages; the emulator included).
PACKAGES = [
    "weirflow",
    "weirflow_azure.coordinator",
    "weirflow_azure.checkpoint",
    "weirflow_azure.eventhubs",
    "weirflow_kinesis",
    "weirflow_aws",
    "weirflow_delta",
]
# The modules that hold every error class that crosses an interface: core's and each plugin's own.
ERROR_MODULES = [
    "weirflow.base.errors",
    "weirflow_azure.eventhubs.errors",
    "weirflow_azure.coordinator.errors",
    "weirflow_kinesis.errors",
    "weirflow_aws.errors",
    "weirflow_delta.errors",
]


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
    from weirflow.pipeline.api import PipelineError
    from weirflow.runtime.control import MalformedMessageError
    from weirflow.spark.serde import DecodeError

    moved = (PipelineError, DecodeError, MalformedMessageError, errors.TapError)
    assert all(cls.__module__ == "weirflow.base.errors" for cls in moved), (
        "their one home, still importable as before"
    )
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
    from weirflow_azure.eventhubs.errors import EventsNotReceivedError

    assert issubclass(EventsNotReceivedError, TimeoutError) and issubclass(EventsNotReceivedError, WeirflowError)


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


# --- every class of the errors modules -------------------------------------------------------------------
def _error_classes() -> list[type[BaseException]]:
    found = []
    for name in ERROR_MODULES:
        module = importlib.import_module(name)
        found += [
            cls
            for _, cls in inspect.getmembers(module, inspect.isclass)
            if issubclass(cls, BaseException) and cls.__module__ == name
        ]
    return found


def _chains_to_its_parent(init: object) -> bool:
    """Whether ``init``'s body calls ``super().__init__(...)`` (not a grandparent's ``__init__`` directly)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(init)))  # type: ignore[arg-type]
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "__init__"
            and isinstance(node.func.value, ast.Call)
            and isinstance(node.func.value.func, ast.Name)
            and node.func.value.func.id == "super"
        ):
            return True
    return False


def test_every_error_class_is_a_weirflow_error_whose_init_calls_its_parent_s() -> None:
    classes = _error_classes()
    names = {c.__name__ for c in classes}
    assert {"FencedOffError", "KinesisError", "AzureStorageError", "EventHubsError"} <= names
    assert [c.__name__ for c in classes if not issubclass(c, WeirflowError)] == []
    own_inits = [c for c in classes if "__init__" in c.__dict__]
    assert {c.__name__ for c in own_inits} >= {"ConfigError", "LockLostError", "FencedOffError"}
    assert [c.__name__ for c in own_inits if not _chains_to_its_parent(c.__init__)] == []


def test_a_fenced_off_error_is_a_lock_lost_error_built_by_its_parent() -> None:
    error = errors.FencedOffError("s0-1", 3, 5)
    assert isinstance(error, errors.LockLostError)
    assert (error.lock_name, error.owner, error.task_name, error.epoch, error.stored) == (
        "task-s0-1",
        "",
        "s0-1",
        3,
        5,
    )
    assert str(error) == error.args[0]
    assert "written with lock epoch 3, but a later holder (epoch 5) has written since" in str(error)
    assert "lock 's0' is no longer held by 'p1'" in str(errors.LockLostError("s0", "p1"))


def test_the_tree_in_the_module_docstring_names_every_class() -> None:
    tree = errors.__doc__ or ""
    missing = sorted(c.__name__ for c in _error_classes() if not re.search(rf"\b{c.__name__}\b", tree))
    assert missing == [], "draw them in weirflow/base/errors.py's docstring"


# --- the Kinesis table -----------------------------------------------------------------------------------
def _client_error(code: str, operation: str = "PutRecords") -> ClientError:
    """What botocore raises for a reply with error ``code`` (its own exception, not a mock of the wire)."""
    return ClientError({"Error": {"Code": code, "Message": f"the service says {code}"}}, operation)


@pytest.mark.parametrize(
    ("exc", "target"),
    [
        (_client_error("ResourceNotFoundException", "ListShards"), StreamNotFoundError),
        (_client_error("ResourceInUseException", "CreateStream"), kinesis_errors.KinesisStreamInUseError),
        (_client_error("ProvisionedThroughputExceededException"), kinesis_errors.KinesisThrottledError),
        (_client_error("KMSThrottlingException"), kinesis_errors.KinesisThrottledError),
        (_client_error("LimitExceededException", "GetRecords"), kinesis_errors.KinesisThrottledError),
        (_client_error("ThrottlingException"), kinesis_errors.KinesisThrottledError),
        (_client_error("InternalFailure"), ServiceUnavailableError),
        (_client_error("ServiceUnavailable"), ServiceUnavailableError),
        (_client_error("ServiceUnavailableException"), ServiceUnavailableError),
        (_client_error("AccessDeniedException"), kinesis_errors.KinesisAccessError),
        (_client_error("UnrecognizedClientException"), kinesis_errors.KinesisAccessError),
        (_client_error("InvalidSignatureException"), kinesis_errors.KinesisAccessError),
        (_client_error("ExpiredTokenException"), kinesis_errors.KinesisAccessError),
        (_client_error("KMSAccessDeniedException"), kinesis_errors.KinesisAccessError),
        (_client_error("InvalidArgumentException", "GetShardIterator"), kinesis_errors.KinesisError),
        (_client_error("ValidationException"), kinesis_errors.KinesisError),
        (_client_error("ExpiredIteratorException", "GetRecords"), kinesis_errors.KinesisError),
        (_client_error("SomethingNewException"), kinesis_errors.KinesisError),
        (
            botocore_exceptions.EndpointConnectionError(endpoint_url="http://localhost:4567"),
            ServiceUnavailableError,
        ),
        (botocore_exceptions.ConnectTimeoutError(endpoint_url="http://localhost:4567"), ServiceUnavailableError),
        (botocore_exceptions.ReadTimeoutError(endpoint_url="http://localhost:4567"), ServiceUnavailableError),
        (botocore_exceptions.ConnectionClosedError(endpoint_url="http://localhost:4567"), ServiceUnavailableError),
        (botocore_exceptions.NoCredentialsError(), kinesis_errors.KinesisAccessError),
        (
            botocore_exceptions.PartialCredentialsError(provider="env", cred_var="key"),
            kinesis_errors.KinesisAccessError,
        ),
        (
            botocore_exceptions.CredentialRetrievalError(provider="sso", error_msg="x"),
            kinesis_errors.KinesisAccessError,
        ),
        (botocore_exceptions.NoRegionError(), kinesis_errors.KinesisError),
        (botocore_exceptions.ParamValidationError(report="bad"), kinesis_errors.KinesisError),
        (
            botocore_exceptions.WaiterError(name="stream_exists", reason="max attempts", last_response={}),
            kinesis_errors.KinesisError,
        ),
        (botocore_exceptions.BotoCoreError(), kinesis_errors.KinesisError),
    ],
    ids=lambda v: kinesis_errors.error_code(v) or type(v).__name__ if isinstance(v, BaseException) else v.__name__,
)
def test_the_kinesis_table_maps_each_sdk_error(exc: BaseException, target: type[WeirflowError]) -> None:
    assert kinesis_errors.classify(exc) is target


def test_the_kinesis_table_covers_every_row_and_maps_to_weirflow_errors_only() -> None:
    assert all(issubclass(target, WeirflowError) for target in kinesis_errors.KINESIS_ERRORS.values())
    assert kinesis_errors.classify(ValueError("ours")) is None
    throttled = kinesis_errors.KinesisThrottledError
    assert issubclass(throttled, ServiceUnavailableError), "what the processor retries and reports"


def test_kinesis_errors_name_the_stream_and_the_endpoint_and_keep_the_sdk_error_as_cause() -> None:
    from weirflow_kinesis.settings import KinesisSettings

    settings = KinesisSettings.from_config(
        "ks",
        Config.from_dict(
            {"job.name": "j", "systems.ks.factory": "kinesis", "systems.ks.endpoint": "http://localhost:4567"}
        ),
    )
    missing = _client_error("ResourceNotFoundException", "ListShards")
    with pytest.raises(StreamNotFoundError, match=r"'views' does not exist at http://localhost:4567") as err:
        with kinesis_errors.kinesis_errors(settings, "views"):
            raise missing
    assert err.value.__cause__ is missing
    unreachable = botocore_exceptions.EndpointConnectionError(endpoint_url="http://localhost:4567/")
    with pytest.raises(ServiceUnavailableError, match=r"unreachable \(stream 'views', system 'ks'\).*4567"):
        with kinesis_errors.kinesis_errors(settings, "views"):
            raise unreachable
    with pytest.raises(kinesis_errors.KinesisAccessError, match="no AWS credentials for Kinesis system 'ks'"):
        with kinesis_errors.kinesis_errors(settings, "views"):
            raise botocore_exceptions.NoCredentialsError()
    with pytest.raises(kinesis_errors.KinesisAccessError, match="IAM policy"):
        with kinesis_errors.kinesis_errors(settings, "views"):
            raise _client_error("AccessDeniedException")
    with pytest.raises(kinesis_errors.KinesisThrottledError, match="throttled .* 'views'"):
        with kinesis_errors.kinesis_errors(settings, "views"):
            raise _client_error("ProvisionedThroughputExceededException")
    for untouched in (ValueError("ours"), StreamNotFoundError("already ours")):
        with pytest.raises(type(untouched)) as err:
            with kinesis_errors.kinesis_errors(settings, "views"):
                raise untouched
        assert err.value is untouched


# --- the Azure Storage table -----------------------------------------------------------------------------
def _http(cls: type[HttpResponseError], status: int | None) -> HttpResponseError:
    error = cls("the reply")
    error.status_code = status
    return error


@pytest.mark.parametrize(
    ("exc", "target"),
    [
        (_http(HttpResponseError, None), ServiceUnavailableError),
        *[
            (_http(HttpResponseError, status), ServiceUnavailableError)
            for status in (408, 429, 500, 502, 503, 504)
        ],
        (_http(ResourceNotFoundError, 503), ServiceUnavailableError),
        (ServiceRequestError("refused"), ServiceUnavailableError),
        (ServiceResponseError("cut off"), ServiceUnavailableError),
        (ConnectionResetError("reset"), ServiceUnavailableError),
        (TimeoutError("slow"), ServiceUnavailableError),
        (_http(HttpResponseError, 401), storage_errors.AzureStorageAccessError),
        (_http(HttpResponseError, 403), storage_errors.AzureStorageAccessError),
        (_http(ClientAuthenticationError, 400), storage_errors.AzureStorageAccessError),
        (_http(ClientAuthenticationError, None), ServiceUnavailableError),  # no identity answered yet: retried
        (_http(HttpResponseError, 400), storage_errors.AzureStorageError),
        (_http(ResourceNotFoundError, 404), storage_errors.AzureStorageError),
        (_http(ResourceExistsError, 409), storage_errors.AzureStorageError),
        (_http(ResourceModifiedError, 412), storage_errors.AzureStorageError),
        (AzureError("other"), storage_errors.AzureStorageError),
    ],
    ids=lambda v: (
        f"{type(v).__name__}-{getattr(v, 'status_code', '')}" if isinstance(v, BaseException) else v.__name__
    ),
)
def test_the_storage_table_maps_each_sdk_error(exc: BaseException, target: type[WeirflowError]) -> None:
    assert storage_errors.classify(exc) is target
    assert storage_errors.is_transient(exc) is issubclass(target, ServiceUnavailableError)


def test_the_storage_table_maps_to_weirflow_errors_only_and_leaves_others_alone() -> None:
    assert all(issubclass(target, WeirflowError) for target in storage_errors.STORAGE_ERRORS.values())
    assert storage_errors.classify(ValueError("ours")) is None
    forbidden = _http(HttpResponseError, 403)
    with pytest.raises(
        storage_errors.AzureStorageAccessError, match="write metadata/x on http://e failed: HTTP 403"
    ):
        with storage_errors.storage_errors("write", "metadata/x", "http://e"):
            raise forbidden
    for untouched in (ValueError("ours"), errors.EtagMismatchError("x", None)):
        with pytest.raises(type(untouched)) as err:
            with storage_errors.storage_errors("write", "metadata/x", "http://e"):
                raise untouched
        assert err.value is untouched
