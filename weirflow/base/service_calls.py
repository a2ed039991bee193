"""One retry policy for the calls a storage backend makes to its service (Azure Storage, DynamoDB and S3), so
that every backend bounds, logs, counts and reports its retries alike (docs/azure.md, "Failures and retries";
docs/aws.md).

A call is retried while its error is transient (the backend's error table says which), with exponential
backoff plus jitter, for at most ``attempts`` attempts and never starting one that could time out past the
deadline. Then it fails with `ServiceUnavailableError` naming the operation, the resource and the endpoint.
Each retry is logged at WARNING and counted for ``GET /metrics`` (`weirflow.base.telemetry`: labelled by store and
operation, never the resource, so the series stay few).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Protocol, TypeVar

from tenacity import (
    RetryCallState,
    RetryError,
    Retrying,
    retry_if_exception,
    stop_after_attempt,
    stop_before_delay,
    wait_exponential,
    wait_random,
)

from weirflow.base import telemetry
from weirflow.base.errors import ServiceUnavailableError

T = TypeVar("T")


class RetrySettings(Protocol):
    """The settings a backend's retry policy reads (its ``*.retry.*`` and ``*.request.timeout.ms`` keys)."""

    @property
    def request_timeout_s(self) -> float: ...

    @property
    def retry_deadline_s(self) -> float: ...

    @property
    def retry_attempts(self) -> int: ...

    @property
    def retry_initial_s(self) -> float: ...

    @property
    def retry_max_s(self) -> float: ...


@dataclass(frozen=True)
class ServiceCalls:
    """How one backend calls its service: its ``store`` label, its retry settings, which errors are transient,
    how an error reads in one line (``short``), the context that maps the SDK's errors to weirflow's
    (``errors(operation, resource, endpoint)``), the weirflow errors that mapping raises (``mapped``, counted
    as failures) and what a message about an unreachable service suggests (``hint``)."""

    store: str
    settings: RetrySettings
    is_transient: Callable[[BaseException], bool]
    short: Callable[[BaseException | None], str]
    errors: Callable[[str, str, str], AbstractContextManager[None]]
    mapped: tuple[type[BaseException], ...]
    hint: str
    log: logging.Logger

    def call(self, operation: str, resource: str, endpoint: str, fn: Callable[[], T]) -> T:
        """Run ``fn`` under the policy. ``fn`` handles the errors it expects (a failed condition, a taken
        lease) and returns; transient ones are retried; the rest are raised as the backend's table maps them."""
        s = self.settings
        counted: tuple[type[BaseException], ...] = (ServiceUnavailableError, *self.mapped)
        retrying = Retrying(
            # no attempt starts (backoff included) when one timing out could end past the deadline
            stop=stop_after_attempt(s.retry_attempts)
            | stop_before_delay(max(0.0, s.retry_deadline_s - s.request_timeout_s)),
            wait=wait_exponential(multiplier=s.retry_initial_s, max=s.retry_max_s)
            + wait_random(0, s.retry_initial_s),
            retry=retry_if_exception(self.is_transient),
            reraise=False,
            before_sleep=lambda state: self._retrying(operation, resource, endpoint, state),
        )
        try:
            with self.errors(operation, resource, endpoint):
                return retrying(fn)
        except RetryError as exc:
            telemetry.count(telemetry.STORAGE_ERRORS, store=self.store, operation=operation)
            cause = exc.last_attempt.exception()
            raise ServiceUnavailableError(
                f"{operation} {resource} on {endpoint} still failed after {exc.last_attempt.attempt_number} "
                f"attempts ({s.retry_deadline_s:.1f} s at most): {self.short(cause)}. {self.hint}"
            ) from cause
        except counted:  # the table's errors; a call's own (a conflict) are not
            telemetry.count(telemetry.STORAGE_ERRORS, store=self.store, operation=operation)
            raise

    def _retrying(self, operation: str, resource: str, endpoint: str, state: RetryCallState) -> None:
        """Before a retry's backoff: said in the log, counted for ``GET /metrics``."""
        telemetry.count(telemetry.STORAGE_RETRIES, store=self.store, operation=operation)
        self.log.warning(
            "%s %s on %s failed (attempt %d of %d): %s; retrying",
            operation,
            resource,
            endpoint,
            state.attempt_number,
            self.settings.retry_attempts,
            self.short(state.outcome.exception()) if state.outcome else "?",
        )
