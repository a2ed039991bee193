"""Azure Storage SDK errors as weirflow errors: one table (`STORAGE_ERRORS`), applied by `Storage.call` to every
blob and table call of the Azure suite.

Callers see weirflow's errors, never azure.core's: a storage account that stays unreachable, slow or busy
(connection errors, timeouts, HTTP 408, 429 and 5xx) is a `ServiceUnavailableError` once the retry policy of
`weirflow_azure.coordinator.storage` gave up, and what retrying cannot fix is an `AzureStorageError` (an
`AzureStorageAccessError` when the account refused the credentials). Errors are told apart by **type**
(`azure.core.exceptions`) and, for a reply the service did send, by its **HTTP status** (``(type, status)``
entries; a status of None means no reply came), never by message text. The same table says what is worth
another try (`is_transient`), so what is retried and what is reported agree.

`classify` looks up the status entry first, then the entry of the most derived type; an exception no entry
matches (and every weirflow error) passes through `storage_errors` unchanged. Errors a call expects (a 404
for a missing document, a 409 on a taken lease) are handled inside the call and never reach the table.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from azure.core.exceptions import (
    AzureError,
    ClientAuthenticationError,
    HttpResponseError,
    ServiceRequestError,
    ServiceResponseError,
)

from weirflow.base.errors import (
    ServiceUnavailableError,
    WeirflowError,
    lineage_keys,
    raising_mapped,
    table_entry,
)


class AzureStorageError(WeirflowError):
    """A storage call failed for a reason retrying cannot fix (auth, a missing resource, a bad request)."""


class AzureStorageAccessError(AzureStorageError):
    """The storage account refused the credentials (HTTP 401/403, or no identity could sign in): fix
    azure.storage.connection.string, or the role of the identity signing in to azure.storage.account."""


ErrorKey = type[BaseException] | tuple[type[BaseException], int | None]
ErrorTable = Mapping[ErrorKey, type[WeirflowError]]

TRANSIENT_STATUS = frozenset({408, 429, 500, 502, 503, 504})

STORAGE_ERRORS: ErrorTable = {
    # Transient: no reply at all, or the service asked to come back later.
    (HttpResponseError, None): ServiceUnavailableError,
    **{(HttpResponseError, status): ServiceUnavailableError for status in sorted(TRANSIENT_STATUS)},
    ServiceRequestError: ServiceUnavailableError,  # the request did not reach the service
    ServiceResponseError: ServiceUnavailableError,  # the reply did not come back whole
    ConnectionError: ServiceUnavailableError,
    TimeoutError: ServiceUnavailableError,
    # Permanent.
    (HttpResponseError, 401): AzureStorageAccessError,
    (HttpResponseError, 403): AzureStorageAccessError,
    ClientAuthenticationError: AzureStorageAccessError,
    HttpResponseError: AzureStorageError,
    AzureError: AzureStorageError,
}


def classify(exc: BaseException, table: ErrorTable = STORAGE_ERRORS) -> type[WeirflowError] | None:
    """The weirflow error ``table`` maps ``exc`` to, or None: the entry of its HTTP status first (what the
    service answered says more than which client raised it), else the entry of its most derived type (the
    shared lookup, `weirflow.base.errors.table_entry`; a status is a key only with its exception's type)."""
    status = lineage_keys(exc, exc.status_code) if isinstance(exc, HttpResponseError) else ()
    return table_entry(table, exc, *status)


def is_transient(exc: BaseException) -> bool:
    """Worth another try: what the table calls the service being unavailable (connection errors, timeouts,
    throttling, server errors)."""
    target = classify(exc)
    return target is not None and issubclass(target, ServiceUnavailableError)


def short(exc: BaseException | None) -> str:
    """One line about ``exc`` for a message: its HTTP status and error code, or its type and first line."""
    if exc is None:
        return "unknown error"
    if isinstance(exc, HttpResponseError):
        code = getattr(exc, "error_code", None)
        return f"HTTP {exc.status_code} {code or ''}".strip() + f" ({type(exc).__name__})"
    return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"


@contextmanager
def storage_errors(
    operation: str, resource: str, endpoint: str, table: ErrorTable = STORAGE_ERRORS
) -> Iterator[None]:
    """Raise the weirflow error ``table`` maps an exception of the block to, naming the operation, the resource
    and the endpoint, with the SDK's exception as its cause; anything unmapped, and weirflow's own errors,
    pass through. `Storage.call` wraps its retries in it (what they gave up on is reported by the call)."""
    with raising_mapped(
        lambda exc: classify(exc, table),
        lambda target, exc: f"{operation} {resource} on {endpoint} failed: {short(exc)}",
    ):
        yield
