"""Exceptions shared by the runtime and its plugins.

Every error a user can meet says what happened and what to do; the classes below carry the pieces
(key, file, endpoint) so messages stay consistent across backends.
"""

from __future__ import annotations


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


class EtagMismatchError(WeirflowError):
    """A conditional write lost a race: the document changed (or appeared) since it was read."""

    def __init__(self, key: str, expected: str | None) -> None:
        self.key = key
        self.expected = expected
        super().__init__(
            f"metadata document '{key}' changed concurrently (expected etag {expected!r}); read it again and retry"
        )


class LockLostError(WeirflowError):
    """This processor no longer holds a task's lock, so it must not act for that task (the fence)."""

    def __init__(self, lock_name: str, owner: str) -> None:
        self.lock_name = lock_name
        self.owner = owner
        super().__init__(f"lock '{lock_name}' is no longer held by '{owner}'; the task must stop")


class FencedOffError(LockLostError):
    """A checkpoint write carried an older fencing token (lock epoch) than the one the store holds for the
    task: a later holder of the task's lock has written since, so this write was refused and changed nothing."""

    def __init__(self, task_name: str, epoch: int, stored: int, reason: str = "") -> None:
        self.task_name = task_name
        self.epoch = epoch
        self.stored = stored
        why = reason or ("a later holder " + (f"(epoch {stored}) " if stored >= 0 else "") + "has written since")
        WeirflowError.__init__(
            self,
            f"checkpoint of task '{task_name}' refused: written with lock epoch {epoch}, but {why}; "
            "this processor lost the task and must stop it",
        )
        self.lock_name = f"task-{task_name}"
        self.owner = ""


class DuplicateProcessorError(WeirflowError):
    """Another live process runs with the same processor id; two of them would fight over one identity."""


class StreamNotFoundError(WeirflowError):
    """A stream does not exist on its system."""


class ServiceUnavailableError(WeirflowError):
    """A remote service stayed unreachable after bounded retries; the message names the endpoint."""


class RecordTooLargeError(WeirflowError):
    """Some records of a `SystemProducer.send` can never be written (bigger than the system accepts).

    Raised before anything of that call was sent, so the caller can dead-letter ``records`` (the offending
    ones, each with ``reasons[i]``) and send the rest again."""

    def __init__(self, records: list, reasons: list[str]) -> None:
        self.records = records
        self.reasons = reasons
        super().__init__(f"{len(records)} record(s) too large to send: {reasons[0]}")
