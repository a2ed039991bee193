"""Malformed documents in the job's stores: reported once, then skipped (docs/architecture.md, "Malformed
documents").

A document read from the metadata, coordination or checkpoint store that this weirflow cannot decode (another
format, a field missing or of the wrong type, not JSON) is written by something outside this process: an older
or newer weirflow, a tool, a person. It must never fail a processor nor make ``/status`` answer 500, because
nothing a processor retries can repair it. Whoever reads one calls `report` and goes on without it; what
"without it" means is the reader's decision, stated where it calls `report` (a drain notice or a registry row is
skipped, a job model is not used, a task whose checkpoint is malformed is not started).

"Once": the WARNING is logged the first time a document's problem is seen in this process, keyed by the
document's name and a hash of its content, so a follower polling every second does not repeat it, while a
document rewritten with another problem is logged again. `collect` gathers what the reads of one call met, for
`weirflow.ops.status.job_status` to list under ``"malformed"``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("weirflow.base.malformed")

_MAX_REMEMBERED = 10_000  # (document, content hash) pairs kept; past it the set starts afresh (logs once more)

_guard = threading.Lock()
_logged: set[tuple[str, str]] = set()
_collectors = threading.local()


@dataclass(frozen=True)
class Malformed:
    """One malformed document: its name in its store (``drain/<uuid>``, ``job-model``, ``checkpoint/<task>``,
    ``processor/<id>``) and why it cannot be read."""

    document: str
    reason: str

    def to_json(self) -> dict[str, str]:
        return {"document": self.document, "reason": self.reason}


def content_hash(content: Any) -> str:
    """A short stable hash of a document's content (JSON, or its repr when it is not JSON-serialisable)."""
    try:
        text = json.dumps(content, sort_keys=True, default=repr)
    except (TypeError, ValueError):
        text = repr(content)
    return hashlib.sha256(text.encode("utf-8", errors="replace")).hexdigest()[:16]


def report(document: str, reason: str | BaseException, content: Any = None, *, action: str = "skipped") -> bool:
    """Report a malformed ``document`` (``content``: what was read, for the hash) that the caller ``action``
    (``skipped``, ``not used: ...``). Logs a WARNING the first time this content of the document is seen in the
    process and adds it to every `collect` of the calling thread. Returns whether it was logged now."""
    entry = Malformed(document, str(reason))
    for found in getattr(_collectors, "stack", ()):
        if entry not in found:
            found.append(entry)
    key = (document, content_hash(content if content is not None else entry.reason))
    with _guard:
        new = key not in _logged
        if new:
            if len(_logged) >= _MAX_REMEMBERED:
                _logged.clear()
            _logged.add(key)
    if new:
        log.warning(
            "malformed document %s in the job's store, %s: %s (fix or delete it)", document, action, reason
        )
    return new


@contextmanager
def collect() -> Iterator[list[Malformed]]:
    """Gather the malformed documents that the calling thread's reads report inside the block (logged or not)."""
    stack: list[list[Malformed]] = getattr(_collectors, "stack", None) or []
    _collectors.stack = stack
    found: list[Malformed] = []
    stack.append(found)
    try:
        yield found
    finally:
        stack[:] = [other for other in stack if other is not found]


def forget() -> None:
    """Forget what was logged (tests: each starts with nothing reported)."""
    with _guard:
        _logged.clear()
