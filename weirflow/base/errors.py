"""Exceptions shared by the runtime and its plugins: every error that crosses an interface or reaches a user.

Every error a user can meet says what happened and what to do; the classes below carry the pieces
(key, file, endpoint) so messages stay consistent across backends. A plugin defines its own classes in its
own ``errors`` module, under these, and maps its SDK's exceptions to them through one table there.

The whole tree (``(ValueError)`` / ``(RuntimeError)``: the class is that built-in too, because it was one
before it was a `WeirflowError` and callers may still catch it so)::

    WeirflowError
    ├── ConfigError
    │   └── FactoryError
    ├── PipelineError (ValueError)
    ├── InvalidArgumentError (ValueError)
    │   ├── PartitionNotFoundError
    │   └── InvalidOffsetError
    ├── StreamExistsError (ValueError)
    ├── StreamNotFoundError
    ├── RecordTooLargeError
    ├── MalformedDocumentError (ValueError)
    ├── MalformedMessageError (ValueError)
    ├── DecodeError (ValueError)
    ├── UnreadableRangeError (RuntimeError)
    ├── RecordsDeletedError (LookupError)
    ├── StateError (RuntimeError)
    ├── StartupError (RuntimeError)
    ├── EtagMismatchError
    ├── LockLostError
    │   └── FencedOffError
    ├── DuplicateProcessorError
    ├── JavaMissingError
    ├── PeerError
    ├── TapError (ValueError)
    ├── ServiceUnavailableError
    │   ├── KinesisThrottledError ............ weirflow_kinesis.errors
    │   └── EventsNotReceivedError (TimeoutError) .. weirflow_azure.eventhubs.errors
    ├── EventHubsError ....................... weirflow_azure.eventhubs.errors
    │   └── EventHubsAccessError
    ├── EventTooLargeError ................... weirflow_azure.eventhubs.errors
    ├── KinesisError ......................... weirflow_kinesis.errors
    │   ├── KinesisAccessError
    │   └── KinesisStreamInUseError
    ├── ReadAheadError ....................... weirflow_kinesis.errors
    ├── AzureStorageError .................... weirflow_azure.coordinator.errors
    │   └── AzureStorageAccessError
    ├── DeltaTableError ...................... weirflow_delta.errors
    │   ├── DeltaAccessError
    │   └── DeltaSchemaError (ValueError)
    └── AwsError ............................. weirflow_aws.errors
        ├── AwsAccessError
        ├── AwsResourceError
        └── CheckpointTooLargeError

Each plugin's SDK errors become these through one table in its errors module: `EVENTHUB_ERRORS`
(Event Hubs, by exception type and AMQP condition), `KINESIS_ERRORS` (botocore, by error code and
exception type), `STORAGE_ERRORS` (azure.core, by exception type and HTTP status), `AWS_ERRORS` (botocore
for DynamoDB and S3, by error code, HTTP status and exception type) and `DELTA_ERRORS` (deltalake, by exception
type and, for a storage failure, the HTTP status object_store reports). Every plugin looks its table up the same
way, through `table_entry` (the service's answer first, then the exception's type; `lineage_keys` for an answer
that means something only on one exception type), and applies it through `raising_mapped`; the AWS-based
plugins read botocore's error code with `error_code`. Every class here calls its parent's ``__init__``
(tests/unit/test_errors.py checks it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any


class WeirflowError(Exception):
    """Base class of every error weirflow raises on purpose."""


class ConfigError(WeirflowError):
    """A configuration value is missing, malformed or unknown.

    The message always names the key and, when known, the file it came from.
    """

    def __init__(self, message: str, *, key: str | None = None, source: str | None = None) -> None:
        self.key = key
        self.source = source
        where = []
        if key:
            where.append(f"key '{key}'")
        if source:
            where.append(f"in {source}")
        prefix = f"{' '.join(where)}: " if where else ""
        super().__init__(f"{prefix}{message}")


class FactoryError(ConfigError):
    """A `*.factory` value names no importable class and no known alias."""


class PipelineError(WeirflowError, ValueError):
    """The pipeline graph is not valid (a join across stages, a stream used by two apps, a transform that
    returns no DataFrame...). Still a `ValueError`, which it was before it was a `WeirflowError`."""


class InvalidArgumentError(WeirflowError, ValueError):
    """A call's argument is not one the callee can act on (a stream of no partitions, a stage name task names
    cannot hold, a drain notification without a run id). A `ValueError` too, which it was before."""


class PartitionNotFoundError(InvalidArgumentError):
    """A record or a read names a partition its stream does not have; the message says how many it has."""


class InvalidOffsetError(InvalidArgumentError):
    """A text given as an offset is not one of the system's offsets (a Kinesis position is JSON)."""


class StreamExistsError(WeirflowError, ValueError):
    """`SystemAdmin.create_stream` found the stream with another partition count than the one asked for. A
    `ValueError` too: the interface asked for one before this class existed, and callers may catch that."""


class StreamNotFoundError(WeirflowError):
    """A stream does not exist on its system."""


class RecordTooLargeError(WeirflowError):
    """Some records of a `SystemProducer.send` can never be written (bigger than the system accepts).

    Raised before anything of that call was sent, so the caller can dead-letter ``records`` (the offending
    ones, each with ``reasons[i]``) and send the rest again."""

    def __init__(self, records: list[Any], reasons: list[str]) -> None:
        self.records = records
        self.reasons = reasons
        super().__init__(f"{len(records)} record(s) too large to send: {reasons[0]}")


class MalformedDocumentError(WeirflowError, ValueError):
    """A metadata document (the job model, a drain notification) that this weirflow cannot read: another
    format, or a field missing. A `ValueError` too, which it was before it was a `WeirflowError`."""


class MalformedMessageError(WeirflowError, ValueError):
    """An intermediate-stream message whose type byte or control payload cannot be understood (a
    `ValueError` too, as it was before it was a `WeirflowError`)."""


class DecodeError(WeirflowError, ValueError):
    """A value the serde cannot decode; the message is the dead letter's reason. A `ValueError` too, so the
    decoders' ``except ValueError`` around the libraries they call takes it with theirs."""


class UnreadableRangeError(WeirflowError, RuntimeError):
    """A range of offsets that was planned (its end is known) cannot be read back in time: the system lost
    or did not yet deliver records the plan counted on. A `RuntimeError` too, which it was before."""


class RecordsDeletedError(WeirflowError, LookupError):
    """A read asked for records its system deleted (a trim of an intermediate stream, a stream's retention):
    reading on from the first record held would skip them without a word. The message names the stream, the
    partition, the offset asked for and the first one still held."""


class StateError(WeirflowError, RuntimeError):
    """A processor state change the protocol does not allow (docs/coordination.md). A `RuntimeError` too,
    which it was before it was a `WeirflowError`."""


class StartupError(WeirflowError, RuntimeError):
    """A part of a processor could not start (its Spark data plane, its endpoint server): the message says
    which and why. A `RuntimeError` too, which it was before it was a `WeirflowError`."""


class EtagMismatchError(WeirflowError):
    """A conditional write lost a race: the document changed (or appeared) since it was read."""

    def __init__(self, key: str, expected: str | None) -> None:
        self.key = key
        self.expected = expected
        super().__init__(
            f"metadata document '{key}' changed concurrently (expected etag {expected!r}); read it again and retry"
        )


class LockLostError(WeirflowError):
    """This processor no longer holds a task's lock, so it must not act for that task (the fence).

    ``message`` replaces the default text (a subclass says more precisely how the lock was lost)."""

    def __init__(self, lock_name: str, owner: str, message: str | None = None) -> None:
        self.lock_name = lock_name
        self.owner = owner
        super().__init__(message or f"lock '{lock_name}' is no longer held by '{owner}'; the task must stop")


class FencedOffError(LockLostError):
    """A checkpoint write carried an older fencing token (lock epoch) than the one the store holds for the
    task: a later holder of the task's lock has written since, so this write was refused and changed nothing.
    Its ``lock_name`` is the task's lock; the holder that wrote is not known here (``owner`` is empty)."""

    def __init__(self, task_name: str, epoch: int, stored: int, reason: str = "") -> None:
        self.task_name = task_name
        self.epoch = epoch
        self.stored = stored
        why = reason or ("a later holder " + (f"(epoch {stored}) " if stored >= 0 else "") + "has written since")
        super().__init__(
            f"task-{task_name}",
            "",
            f"checkpoint of task '{task_name}' refused: written with lock epoch {epoch}, but {why}; "
            "this processor lost the task and must stop it",
        )


class DuplicateProcessorError(WeirflowError):
    """Another live process runs with the same processor id; two of them would fight over one identity."""


class JavaMissingError(WeirflowError):
    """No Java runtime: Spark cannot start."""


class PeerError(WeirflowError):
    """The peer could not be reached, closed the connection, or did not answer in time."""


class TapError(WeirflowError, ValueError):
    """A tap request that cannot be served (unknown stream, bad regex): the client's error, HTTP 400/404. A
    `ValueError` too, which it was before it was a `WeirflowError`."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class ServiceUnavailableError(WeirflowError):
    """A remote service stayed unreachable after bounded retries; the message names the endpoint."""


def table_entry(
    table: Mapping[Any, type[WeirflowError]], exc: BaseException, *keys: Any
) -> type[WeirflowError] | None:
    """The weirflow error a plugin's error table maps ``exc`` to, or None: the entry of the first of ``keys``
    the table has (what the service answered: an error code, an HTTP status, or `lineage_keys` of one; a None
    or empty key is skipped), else the entry of the most derived type of ``exc``. The lookup each plugin's
    ``classify`` makes, so that every plugin weighs the service's verdict over the type that carried it alike."""
    for key in keys:
        if key is not None and key != "" and key in table:
            return table[key]
    for cls in type(exc).__mro__:
        target = table.get(cls)
        if target is not None:
            return target
    return None


def lineage_keys(exc: BaseException, answer: object) -> tuple[tuple[type, object], ...]:
    """``(type, answer)`` for each type of ``exc``'s lineage, most derived first: the keys to give `table_entry`
    when an SDK's answer means something only on its own exception type (azure.core's HTTP status on an
    ``HttpResponseError``, an AMQP condition on an ``EventHubError``). The table's entry for a subclass then
    wins over its base's for the same answer, as it does for types alone; ``answer`` may be None (no reply)."""
    return tuple((cls, answer) for cls in type(exc).__mro__)


def error_code(exc: BaseException) -> str:
    """The service's error code of a botocore ``ClientError`` (``""`` for anything else), which the AWS-based
    plugins key their tables on. Read from the reply the error keeps (``exc.response["Error"]["Code"]``), not
    by its type, so that the shared leaves import no botocore: no other error keeps such a reply (where another
    SDK's error has a ``response``, it is an HTTP response object, not a mapping)."""
    response = getattr(exc, "response", None)
    error = response.get("Error", {}) if isinstance(response, Mapping) else None
    return str(error.get("Code", "")) if isinstance(error, Mapping) else ""


@contextmanager
def raising_mapped(
    classify: Callable[[BaseException], type[WeirflowError] | None],
    message: Callable[[type[WeirflowError], BaseException], str],
) -> Iterator[None]:
    """Raise the weirflow error ``classify`` maps an exception of the block to, with ``message(target, exc)``
    and the SDK's exception as its cause; anything unmapped, and weirflow's own errors, pass through. Each
    plugin's error table is applied through it (its ``classify``)."""
    try:
        yield
    except WeirflowError:
        raise
    except Exception as exc:
        target = classify(exc)
        if target is None:
            raise
        raise target(message(target, exc)) from exc
