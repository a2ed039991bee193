"""deltalake (delta-rs) errors as weirflow errors: one table (`DELTA_ERRORS`), applied around every table
operation by `weirflow_delta.tables.DeltaTables.call`.

Callers see weirflow's errors, never delta-rs's: storage that stays unreachable, slow or busy is a
`ServiceUnavailableError` once the retry policy gave up (`weirflow.base.service_calls`), credentials the account
refuses are a `DeltaAccessError`, rows the table cannot take a `DeltaSchemaError`, a missing table a
`StreamNotFoundError`, and the rest a `DeltaTableError`; every message names the table's location.

**How failures are told apart.** delta-rs raises its own types for what it decides (`TableNotFoundError`,
`SchemaMismatchError`, `CommitFailedError`, `DeltaError`), and those are table keys. A storage failure, though,
reaches Python only as a plain `OSError` whose text is object_store's report: delta-rs keeps no status code or
kind on it. So for an `OSError` alone the HTTP status the service answered is read from that report
(``Server returned non-2xx status code`` followed by the status), and a request that got no reply at all is
recognised by object_store's ``HTTP error`` / ``error sending request`` / ``timed out`` wording. This is the one
place the plugin reads message text, and only object_store's fixed phrases, never the service's message.
Keys are then ``(OSError, status)`` (``None``: no reply) as in the Azure suite's table
(`weirflow_azure.coordinator.errors`), and the same table says what is transient (`is_transient`).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from deltalake.exceptions import (
    CommitFailedError,
    DeltaError,
    DeltaProtocolError,
    SchemaMismatchError,
    TableNotFoundError,
)

from weirflow.base.errors import (
    ServiceUnavailableError,
    StreamNotFoundError,
    WeirflowError,
    raising_mapped,
    table_entry,
)


class DeltaTableError(WeirflowError):
    """A Delta table operation failed for a reason retrying does not fix; the message names the table's
    location and says what to do."""


class DeltaAccessError(DeltaTableError):
    """The storage account refused the system's credentials (HTTP 401/403), or no Entra ID identity could sign
    in: fix ``systems.<name>.storage.connection.string``, or the role of the identity signing in to
    ``systems.<name>.storage.account`` (Storage Blob Data Contributor on the container)."""


class DeltaSchemaError(DeltaTableError, ValueError):
    """Rows the table cannot take: a column it lacks or holds in another type, a column it has and the rows
    lack, partitioning other than configured. The message names the table and the columns."""


# No reply at all: the request did not reach the service, or its answer did not come back.
NO_REPLY = None
TRANSIENT_STATUS = frozenset({408, 429, 500, 502, 503, 504})

ErrorKey = type[BaseException] | tuple[type[BaseException], int | None]
ErrorTable = Mapping[ErrorKey, type[WeirflowError]]

DELTA_ERRORS: ErrorTable = {
    # Storage failures (object_store, through delta-rs), by the status the service answered.
    (OSError, NO_REPLY): ServiceUnavailableError,
    **{(OSError, status): ServiceUnavailableError for status in sorted(TRANSIENT_STATUS)},
    (OSError, 401): DeltaAccessError,
    (OSError, 403): DeltaAccessError,
    (OSError, 404): DeltaTableError,
    OSError: DeltaTableError,
    # delta-rs's own verdicts.
    TableNotFoundError: StreamNotFoundError,
    SchemaMismatchError: DeltaSchemaError,
    CommitFailedError: DeltaTableError,
    DeltaProtocolError: DeltaTableError,
    DeltaError: DeltaTableError,
}

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_CODE = re.compile(r"<Code>([^<]+)</Code>")
_STATUS = re.compile(r"non-2xx status code\W+(\d{3})\b")
_NO_REPLY = re.compile(r"\bHTTP error\b|error sending request|timed out|connection reset|broken pipe", re.I)


def _plain(exc: BaseException) -> str:
    """delta-rs's report without its terminal colours (nested causes are drawn with them)."""
    return _ANSI.sub("", str(exc))


def http_status(exc: BaseException) -> int | None:
    """The HTTP status the service answered, as object_store reports it in an `OSError`, else None."""
    match = _STATUS.search(_plain(exc)) if isinstance(exc, OSError) else None
    return int(match.group(1)) if match else None


def got_no_reply(exc: BaseException) -> bool:
    """Whether object_store reports a request that got no reply (refused, reset, timed out)."""
    return isinstance(exc, OSError) and http_status(exc) is None and bool(_NO_REPLY.search(_plain(exc)))


def _storage_key(exc: BaseException) -> tuple[type[BaseException], int | None] | None:
    if not isinstance(exc, OSError) or isinstance(exc, FileNotFoundError):
        return None  # a missing file is a missing resource, never a status to look up
    status = http_status(exc)
    if status is not None:
        return (OSError, status)
    return (OSError, NO_REPLY) if got_no_reply(exc) else None


def classify(exc: BaseException, table: ErrorTable = DELTA_ERRORS) -> type[WeirflowError] | None:
    """The weirflow error ``table`` maps ``exc`` to, or None: for a storage failure its status entry first,
    then the entry of its most derived type (`weirflow.base.errors.table_entry`)."""
    return table_entry(table, exc, _storage_key(exc))


def is_transient(exc: BaseException) -> bool:
    """Worth another try: what the table calls the storage being unavailable (no reply, timeouts, throttling,
    server errors)."""
    target = classify(exc)
    return target is not None and issubclass(target, ServiceUnavailableError)


def _text(exc: BaseException) -> str:
    """delta-rs's report on one line: its nested causes (one per line, drawn with colour codes and arrows)
    joined by colons."""
    report = re.split(r"<\?xml|<Error>", _plain(exc))[0]  # the service's XML body: its code is said apart
    lines = (line.replace("\u21b3", "").strip() for line in report.splitlines())
    return ": ".join(line for line in lines if line)


def short(exc: BaseException | None) -> str:
    """One line about ``exc`` for a message: its HTTP status and the service's error code when storage
    answered, else its type and report (at most 400 characters)."""
    if exc is None:
        return "unknown error"
    status = http_status(exc)
    if status is not None:
        code = _CODE.search(str(exc))
        return f"HTTP {status}" + (f" {code.group(1)}" if code else "") + f" ({type(exc).__name__})"
    text = _text(exc)
    text = text if len(text) <= 400 else text[:397] + "..."
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def message(target: type[WeirflowError], exc: BaseException, operation: str, resource: str, where: str) -> str:
    """What a user reads for ``exc``, mapped to ``target``: the operation, the table and its location, and what
    to do."""
    cause = short(exc)
    if issubclass(target, StreamNotFoundError):
        return (
            f"{resource} does not exist at {where}: a Delta table is created by its first commit (its columns "
            "come from the rows), so nothing can be read or appended by JSON before then"
        )
    if issubclass(target, DeltaAccessError):
        return (
            f"{operation} {resource} at {where}: the storage account refused the credentials ({cause}); check "
            "systems.<name>.storage.connection.string, or the role of the identity signing in to "
            "systems.<name>.storage.account (Storage Blob Data Contributor on the container)"
        )
    if issubclass(target, ServiceUnavailableError):
        return f"{operation} {resource} at {where}: storage unavailable ({cause})"
    if issubclass(target, DeltaSchemaError):
        return f"{operation} {resource} at {where}: the rows do not fit the table ({cause})"
    if http_status(exc) == 404:
        return (
            f"{operation} {resource} at {where}: not found ({cause}); does the container of systems.<name>.path "
            "exist? weirflow does not create containers (az storage container create -n <container> ...)"
        )
    return f"{operation} {resource} at {where}: {cause}"


@contextmanager
def delta_errors(operation: str, resource: str, where: str, table: ErrorTable = DELTA_ERRORS) -> Iterator[None]:
    """Raise the weirflow error ``table`` maps an exception of the block to, with `message` and delta-rs's
    exception as its cause; anything unmapped, and weirflow's own errors, pass through."""
    with raising_mapped(
        lambda exc: classify(exc, table), lambda target, exc: message(target, exc, operation, resource, where)
    ):
        yield
