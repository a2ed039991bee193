"""Kinesis (botocore) errors as weirflow errors: one table (`KINESIS_ERRORS`), applied where the SDK is called.

Callers of a system see weirflow's errors, never botocore's: a missing stream is a `StreamNotFoundError`
(what the planner and `weirflow streams` report for any system), an endpoint that stays unreachable is a
`ServiceUnavailableError` naming the endpoint, throttling that boto3's own retries (``standard`` mode) did
not outlast is a `KinesisThrottledError` (a `ServiceUnavailableError`; the producer retries it on top), and
what retrying cannot fix is a `KinesisError`. The service's verdict comes as an **error code** in a
`ClientError` (``ResourceNotFoundException``, ``ProvisionedThroughputExceededException``...), whichever
operation reported it, so codes are table keys; botocore's own failures (no connection, no credentials, a
parameter refused before sending) are told apart by exception **type**. Never by message text.

`classify` looks up the error code first, then the most derived type; an exception no entry matches (and
every weirflow error) passes through `kinesis_errors` unchanged.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Protocol

from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectionClosedError,
    CredentialRetrievalError,
    EndpointConnectionError,
    NoCredentialsError,
    NoRegionError,
    ParamValidationError,
    PartialCredentialsError,
    ReadTimeoutError,
    WaiterError,
)
from botocore.exceptions import ConnectionError as BotoConnectionError

from weirflow.base.errors import (
    ServiceUnavailableError,
    StreamNotFoundError,
    WeirflowError,
    error_code,
    raising_mapped,
    table_entry,
)


class KinesisError(WeirflowError):
    """A Kinesis call failed for a reason retrying does not fix; the message names the stream and the service."""


class KinesisAccessError(KinesisError):
    """No AWS credentials were found, or the service refused them (or their rights on the stream): set them
    the boto3 way, or fix the IAM policy of the identity signing in, then restart."""


class KinesisStreamInUseError(KinesisError):
    """The stream is being created, deleted or resharded (``ResourceInUseException``); creating a stream that
    exists already says so too, which `KinesisSystemAdmin.create_stream` takes as "it exists"."""


class ReadAheadError(WeirflowError):
    """Reading a shard ahead failed ``read.failures`` times in a row (each `GetRecords` call already retried by
    boto3): the message names the stream, the shard and the last error. Fix what it names (AWS credentials or
    IAM policy, the spool directory's disk, the service's reachability); the task restarts from its checkpoint.
    """


class KinesisThrottledError(ServiceUnavailableError):
    """Kinesis kept refusing calls for the stream's (or the account's) limits after boto3's retries:
    ``ProvisionedThroughputExceededException`` and its kin. The producer retries it (``send.attempts``)."""


ErrorKey = type[BaseException] | str
ErrorTable = Mapping[ErrorKey, type[WeirflowError]]

KINESIS_ERRORS: ErrorTable = {
    # Error codes of a ClientError (the service's verdict).
    "ResourceNotFoundException": StreamNotFoundError,
    "ResourceInUseException": KinesisStreamInUseError,
    "ProvisionedThroughputExceededException": KinesisThrottledError,
    "KMSThrottlingException": KinesisThrottledError,
    "LimitExceededException": KinesisThrottledError,
    "ThrottlingException": KinesisThrottledError,
    "InternalFailure": ServiceUnavailableError,
    "ServiceUnavailable": ServiceUnavailableError,
    "ServiceUnavailableException": ServiceUnavailableError,
    "AccessDeniedException": KinesisAccessError,
    "UnrecognizedClientException": KinesisAccessError,
    "InvalidSignatureException": KinesisAccessError,
    "ExpiredTokenException": KinesisAccessError,
    "KMSAccessDeniedException": KinesisAccessError,
    "InvalidArgumentException": KinesisError,
    "ValidationException": KinesisError,
    "ExpiredIteratorException": KinesisError,  # the spool asks for a new iterator itself; this one failed again
    ClientError: KinesisError,
    # botocore's own failures, by type. Transient: boto3 has retried them already (standard mode).
    EndpointConnectionError: ServiceUnavailableError,
    BotoConnectionError: ServiceUnavailableError,  # connect timeouts, proxies
    ReadTimeoutError: ServiceUnavailableError,
    ConnectionClosedError: ServiceUnavailableError,
    # Permanent.
    NoCredentialsError: KinesisAccessError,
    PartialCredentialsError: KinesisAccessError,
    CredentialRetrievalError: KinesisAccessError,
    NoRegionError: KinesisError,
    ParamValidationError: KinesisError,
    WaiterError: KinesisError,
    BotoCoreError: KinesisError,
}


def classify(exc: BaseException, table: ErrorTable = KINESIS_ERRORS) -> type[WeirflowError] | None:
    """The weirflow error ``table`` maps ``exc`` to, or None: its error code's entry first (the service's verdict
    says more than which operation reported it), else the entry of its most derived type (the shared lookup,
    `weirflow.base.errors.table_entry`, with the shared `error_code`, which the producer imports from here)."""
    return table_entry(table, exc, error_code(exc))


class Where(Protocol):
    """What a message names: the system and the service's address (`KinesisSettings`)."""

    @property
    def system(self) -> str: ...

    @property
    def virtual_tasks(self) -> int: ...

    @property
    def where(self) -> str: ...


def _cause(exc: BaseException) -> str:
    code = error_code(exc)
    text = str(exc).strip()
    first = text.splitlines()[0] if text else ""
    return f"{code or type(exc).__name__}: {first}" if first else (code or type(exc).__name__)


def message(target: type[WeirflowError], exc: BaseException, settings: Where, stream: str) -> str:
    """What a user reads for ``exc`` about ``stream``, mapped to ``target``: it names the stream, the system and
    the endpoint, and says what to do."""
    system, where = settings.system, settings.where
    if issubclass(target, StreamNotFoundError):
        return (
            f"Kinesis stream '{stream}' does not exist at {where}; create it with "
            f"`weirflow streams create CONFIG {stream} --partitions {settings.virtual_tasks}`"
        )
    if issubclass(target, KinesisThrottledError):
        return (
            f"Kinesis at {where} throttled calls for stream '{stream}' (system '{system}'): {_cause(exc)}; "
            "add shards to the stream or lower the load"
        )
    if issubclass(target, ServiceUnavailableError):
        return f"Kinesis at {where} is unreachable (stream '{stream}', system '{system}'): {exc}"
    if issubclass(target, KinesisAccessError):
        if isinstance(exc, BotoCoreError):
            return (
                f"no AWS credentials for Kinesis system '{system}': set them the boto3 way "
                "(AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, a profile, or an instance role)"
            )
        return (
            f"Kinesis at {where} refused system '{system}' access to stream '{stream}' ({_cause(exc)}); check "
            "the AWS credentials and the IAM policy of the identity signing in"
        )
    return f"Kinesis stream '{stream}' of system '{system}' at {where}: {_cause(exc)}"


@contextmanager
def kinesis_errors(settings: Where, stream: str, table: ErrorTable = KINESIS_ERRORS) -> Iterator[None]:
    """Raise the weirflow error ``table`` maps an exception of the block to, with `message` and botocore's
    exception as its cause; anything unmapped, and weirflow's own errors, pass through."""
    with raising_mapped(
        lambda exc: classify(exc, table), lambda target, exc: message(target, exc, settings, stream)
    ):
        yield
