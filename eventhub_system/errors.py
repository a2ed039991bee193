"""Event Hubs SDK errors as weirflow errors: one table (`EVENTHUB_ERRORS`), applied where the SDK is called.

Callers of a system see weirflow's errors, never the SDK's: a missing hub is a `StreamNotFoundError` (what
the planner and `weirflow streams` report for any system), a service that stays unreachable or busy is a
`ServiceUnavailableError` (what the processor's loops retry and report), and what retrying cannot fix is an
`EventHubsError`. Errors are told apart by **type** (`azure.eventhub.exceptions`, `azure.core.exceptions`),
never by their message text, which the SDK does not keep stable. Where only the service knows what went
wrong (a hub that does not exist, throttling, a refused claim), the SDK reports it as the AMQP error condition
it got, in ``EventHubError.error`` (``amqp:not-found`` arrives as ``"not-found"``), whichever exception type
the failing link or management call happened to raise; such entries are ``(type, condition)`` pairs.

`map_exceptions` applies a table in the style of httpx's context manager of the same name: the entry for
the exception's condition wins, then the entry for its most derived type; an exception no entry matches (and
every weirflow error) passes through unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager

from azure.core.exceptions import ClientAuthenticationError, ServiceRequestError, ServiceResponseError
from azure.eventhub.exceptions import (
    AuthenticationError,
    ClientClosedError,
    ConnectError,
    ConnectionLostError,
    EventDataError,
    EventDataSendError,
    EventHubError,
    OperationTimeoutError,
)

from weirflow.base.errors import (
    ServiceUnavailableError,
    StreamNotFoundError,
    WeirflowError,
    lineage_keys,
    raising_mapped,
    table_entry,
)


class EventHubsError(WeirflowError):
    """An Event Hubs call failed for a reason retrying cannot fix (a refused event, a closed client, an error
    the service reported); the message names the system and the hub."""


class EventHubsAccessError(EventHubsError):
    """The namespace refused this system's credentials or their rights on a hub: fix the connection string or
    the role of the identity signing in, then restart."""


class EventsNotReceivedError(ServiceUnavailableError, TimeoutError):
    """Events the partition holds (its properties say so) were not received within the read's wait: the
    namespace is slow or the receiving link failed. A `TimeoutError` too, which it was before it was a
    `WeirflowError`."""


class EventTooLargeError(WeirflowError):
    """One event is larger than the hub accepts in a batch; it cannot be sent at all. `send` checks every
    record first and refuses with `RecordTooLargeError` (this error's text as the reason); raised itself
    only if a batch with a run's partition arguments holds less than that check's empty batch."""

    def __init__(self, hub: str, size: int, limit: int) -> None:
        super().__init__(f"event of {size} bytes exceeds the {limit}-byte limit of event hub '{hub}'")
        self.hub, self.size, self.limit = hub, size, limit


ErrorKey = type[BaseException] | tuple[type[BaseException], str]
ErrorTable = Mapping[ErrorKey, type[WeirflowError]]

# AMQP error conditions as the SDK exposes them in `EventHubError.error` (the part after the first ":").
NOT_FOUND = "not-found"  # amqp:not-found: the hub (or partition) does not exist
SERVER_BUSY = "server-busy"  # com.microsoft:server-busy: throttled, try again later
UNAUTHORIZED = "unauthorized-access"  # amqp:unauthorized-access: a claim or link refused

EVENTHUB_ERRORS: ErrorTable = {
    (EventHubError, NOT_FOUND): StreamNotFoundError,
    (EventHubError, SERVER_BUSY): ServiceUnavailableError,
    (EventHubError, UNAUTHORIZED): EventHubsAccessError,
    # Transient: the SDK has already retried these (its own bounded policy); weirflow retries sends on top.
    ConnectionLostError: ServiceUnavailableError,
    OperationTimeoutError: ServiceUnavailableError,
    ConnectError: ServiceUnavailableError,
    ServiceRequestError: ServiceUnavailableError,  # azure.core: e.g. the token endpoint of the credential
    ServiceResponseError: ServiceUnavailableError,
    # Permanent.
    AuthenticationError: EventHubsAccessError,  # a ConnectError, but no retry will sign it in
    ClientAuthenticationError: EventHubsAccessError,  # azure.core: DefaultAzureCredential found no identity
    EventDataError: EventHubsError,
    EventDataSendError: EventHubsError,
    ClientClosedError: EventHubsError,
    EventHubError: EventHubsError,
}


def classify(exc: BaseException, table: ErrorTable = EVENTHUB_ERRORS) -> type[WeirflowError] | None:
    """The weirflow error ``table`` maps ``exc`` to, or None: its AMQP condition's entry first (the service's
    verdict says more than which SDK call reported it), else the entry of its most derived type (the shared
    lookup, `weirflow.base.errors.table_entry`; a condition is a key only with its exception's type)."""
    condition = exc.error if isinstance(exc, EventHubError) else None
    return table_entry(table, exc, *(lineage_keys(exc, condition) if condition else ()))


def is_transient(exc: BaseException) -> bool:
    """Worth another try: what the table calls the service being unavailable (connection lost, a timeout,
    throttling). Weirflow's own retries ask this, so what is retried and what is reported agree."""
    target = classify(exc)
    return target is not None and issubclass(target, ServiceUnavailableError)


@contextmanager
def map_exceptions(
    table: ErrorTable, message: Callable[[type[WeirflowError], BaseException], str]
) -> Iterator[None]:
    """Raise the weirflow error ``table`` maps an exception of the block to, with ``message(target, exc)``
    and the SDK's exception as its cause; anything unmapped, and weirflow's own errors, pass through."""
    with raising_mapped(lambda exc: classify(exc, table), message):
        yield


def _cause(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__


def hub_errors(system: str, hub: str) -> AbstractContextManager[None]:
    """`map_exceptions` with `EVENTHUB_ERRORS` for calls about event hub ``hub`` of system ``system``; each
    message names both and says what to do."""

    def message(target: type[WeirflowError], exc: BaseException) -> str:
        if issubclass(target, StreamNotFoundError):
            return (
                f"event hub '{hub}' does not exist in the namespace of system '{system}'; create it "
                f"(infra/ Bicep, the portal, or `weirflow emulator eventhubs --hub {hub}:N`)"
            )
        if issubclass(target, ServiceUnavailableError):
            return f"Event Hubs namespace of system '{system}' unavailable for event hub '{hub}' ({_cause(exc)})"
        if issubclass(target, EventHubsAccessError):
            return (
                f"system '{system}' was refused access to event hub '{hub}' ({_cause(exc)}); check "
                f"systems.{system}.connection.string, or the rights of the identity signing in to "
                f"systems.{system}.fully.qualified.namespace"
            )
        return f"event hub '{hub}' of system '{system}': {_cause(exc)}"

    return map_exceptions(EVENTHUB_ERRORS, message)
