"""A full disk, told apart from every other failure, and said with the path and the space left on it.

A write that fails for lack of space fails the same way wherever it happens: SQLite says "database or disk is
full" (the embedded log, checkpoints, coordination), Python raises `OSError` with ``ENOSPC``, and Spark's JVM
"No space left on device" (its checkpoint and state directories), which reaches the processor as the text of a
query's failure. Retrying does not help until someone frees space, and each retry may leave a little more behind,
so the processor stops with this error instead (`weirflow.coordination.processor`). Nothing is half-written:
every write weirflow makes is one SQLite transaction, one conditional write or one renamed file, and a restart
after space was freed resumes from the last complete checkpoint (docs/operations.md, "Running for months").
"""

from __future__ import annotations

import errno
import shutil
from pathlib import Path

NO_SPACE = ("no space left on device", "database or disk is full", "disk quota exceeded")


def is_disk_full(error: BaseException | str) -> bool:
    """Whether ``error`` (an exception, or a failure's text) says a write found no space."""
    if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    text = str(error).lower()
    return any(phrase in text for phrase in NO_SPACE)


def free_space(path: Path) -> str:
    """The space left on the filesystem holding ``path`` (its nearest existing ancestor), for people."""
    existing = Path(path)
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    usage = shutil.disk_usage(existing)
    return f"{usage.free / 1e6:,.1f} MB free of {usage.total / 1e6:,.1f} MB"


def disk_full_message(path: Path, what: str, error: BaseException | str) -> str:
    """What the processor says when it stops on a full disk: what failed, the path, and its free space."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()] or [type(error).__name__]
    said = next((line for line in lines if any(p in line.lower() for p in NO_SPACE)), lines[0])
    return (
        f"{what}: the disk is full: {path} has {free_space(path)} ({said[:300]}). Nothing was half-written: free "
        'space and start the processor again; it resumes from its last checkpoint (docs/operations.md, "Running '
        'for months")'
    )
