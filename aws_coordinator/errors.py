"""DynamoDB and S3 (botocore) errors as weirflow errors: one table (`AWS_ERRORS`), applied by `Aws.call` to every
call of the AWS suite.

Callers see weirflow's errors, never botocore's: a service that stays unreachable, slow or throttling is a
`ServiceUnavailableError` once the retry policy of `weirflow_aws.clients` gave up; a table, bucket or key that
is missing where it must exist is an `AwsResourceError`; refused credentials are an `AwsAccessError`; anything
else retrying cannot fix is an `AwsError`. The service's verdict comes as an **error code** in a `ClientError`,
and for a reply without a code we know, as its **HTTP status**; botocore's own failures (no connection, no
credentials) are told apart by exception **type**. Never by message text. The same table says what is worth
another try (`is_transient`), so what is retried and what is reported agree.

Errors a call expects (a failed condition on a lease, a missing document) are handled inside the call and
never reach the table.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager

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
)
from botocore.exceptions import ConnectionError as BotoConnectionError

from weirflow.base.errors import (
    ServiceUnavailableError,
    WeirflowError,
    error_code,
    raising_mapped,
    table_entry,
)


class AwsError(WeirflowError):
    """A DynamoDB or S3 call failed for a reason retrying cannot fix; the message names the resource."""


class AwsAccessError(AwsError):
    """No AWS credentials were found, or the service refused them or their rights on the resource: set them the
    boto3 way, or grant the identity the policy of docs/aws.md."""


class AwsResourceError(AwsError):
    """A table or bucket the job needs does not exist (and ``aws.create.missing`` is false, or creating it was
    refused): deploy it, or let the processor create it."""


class CheckpointTooLargeError(AwsError):
    """A task's checkpoint does not fit one DynamoDB item (400 KB, compressed): fewer SSPs per task (more
    tasks), or the ``azure-table``/``local`` checkpoint manager, which split large checkpoints."""


ErrorKey = type[BaseException] | str | int
ErrorTable = Mapping[ErrorKey, type[WeirflowError]]

TRANSIENT_STATUS = (408, 429, 500, 502, 503, 504)

AWS_ERRORS: ErrorTable = {
    # Error codes of a ClientError (the service's verdict), DynamoDB's and S3's.
    "ProvisionedThroughputExceededException": ServiceUnavailableError,
    "ThrottlingException": ServiceUnavailableError,
    "RequestLimitExceeded": ServiceUnavailableError,
    "LimitExceededException": ServiceUnavailableError,
    "InternalServerError": ServiceUnavailableError,
    "InternalError": ServiceUnavailableError,
    "ServiceUnavailable": ServiceUnavailableError,
    "SlowDown": ServiceUnavailableError,
    "RequestTimeout": ServiceUnavailableError,
    "TransactionInProgressException": ServiceUnavailableError,
    "AccessDenied": AwsAccessError,
    "AccessDeniedException": AwsAccessError,
    "UnrecognizedClientException": AwsAccessError,
    "InvalidSignatureException": AwsAccessError,
    "SignatureDoesNotMatch": AwsAccessError,
    "InvalidAccessKeyId": AwsAccessError,
    "ExpiredToken": AwsAccessError,
    "ExpiredTokenException": AwsAccessError,
    "ResourceNotFoundException": AwsResourceError,  # DynamoDB: no such table
    "NoSuchBucket": AwsResourceError,
    # Replies with no code of the above, by HTTP status.
    **{status: ServiceUnavailableError for status in TRANSIENT_STATUS},
    401: AwsAccessError,
    403: AwsAccessError,
    ClientError: AwsError,
    # botocore's own failures, by type.
    EndpointConnectionError: ServiceUnavailableError,
    BotoConnectionError: ServiceUnavailableError,  # connect timeouts, proxies
    ReadTimeoutError: ServiceUnavailableError,
    ConnectionClosedError: ServiceUnavailableError,
    ConnectionError: ServiceUnavailableError,
    TimeoutError: ServiceUnavailableError,
    NoCredentialsError: AwsAccessError,
    PartialCredentialsError: AwsAccessError,
    CredentialRetrievalError: AwsAccessError,
    NoRegionError: AwsError,
    ParamValidationError: AwsError,
    BotoCoreError: AwsError,
}


def status_of(exc: BaseException) -> int | None:
    """The HTTP status of a `ClientError`'s reply, or None."""
    if isinstance(exc, ClientError):
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        return int(status) if status is not None else None
    return None


def classify(exc: BaseException, table: ErrorTable = AWS_ERRORS) -> type[WeirflowError] | None:
    """The weirflow error ``table`` maps ``exc`` to, or None: its error code's entry first, then its HTTP
    status's, then the entry of its most derived type (the shared lookup, `weirflow.base.errors.table_entry`,
    with the shared `error_code`, which the suite's other modules import from here)."""
    return table_entry(table, exc, error_code(exc), status_of(exc))


def is_transient(exc: BaseException) -> bool:
    """Worth another try: what the table calls the service being unavailable."""
    target = classify(exc)
    return target is not None and issubclass(target, ServiceUnavailableError)


def is_condition_failure(exc: BaseException) -> bool:
    """A conditional write refused because its condition did not hold (DynamoDB's
    ``ConditionalCheckFailedException``, a transaction cancelled for it, S3's 412 or 409 on a conditional put):
    the answer a lease, a fence or a compare-and-set expects, never an error."""
    code = error_code(exc)
    if code in ("ConditionalCheckFailedException", "PreconditionFailed", "ConditionalRequestConflict"):
        return True
    if code == "TransactionCanceledException" and isinstance(exc, ClientError):
        reasons = exc.response.get("CancellationReasons") or []
        return any(r.get("Code") == "ConditionalCheckFailed" for r in reasons)
    return False


def short(exc: BaseException | None) -> str:
    """One line about ``exc`` for a message: its error code and HTTP status, or its type and first line."""
    if exc is None:
        return "unknown error"
    code, status = error_code(exc), status_of(exc)
    if code or status:
        return f"{code or 'HTTP'} {status or ''}".strip() + f" ({type(exc).__name__})"
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"


@contextmanager
def aws_errors(operation: str, resource: str, endpoint: str, table: ErrorTable = AWS_ERRORS) -> Iterator[None]:
    """Raise the weirflow error ``table`` maps an exception of the block to, naming the operation, the resource
    and the endpoint, with botocore's exception as its cause; anything unmapped passes through."""

    def message(target: type[WeirflowError], exc: BaseException) -> str:
        text = f"{operation} {resource} on {endpoint} failed: {short(exc)}"
        if issubclass(target, AwsAccessError):
            return text + "; check the AWS credentials and the IAM policy of the identity (docs/aws.md)"
        if issubclass(target, AwsResourceError):
            return text + "; deploy it, or set aws.create.missing: true to let processors create it"
        return text

    with raising_mapped(lambda exc: classify(exc, table), message):
        yield
