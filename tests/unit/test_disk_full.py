"""A full disk is told apart from other failures and said with the path and its free space (weirflow/base/disk.py);
the end-to-end behaviour is tests/integration/test_full_disk.py."""

from __future__ import annotations

import errno
import sqlite3
from pathlib import Path

from weirflow.base.disk import disk_full_message, free_space, is_disk_full


def test_a_full_disk_is_recognised_whoever_reports_it() -> None:
    assert is_disk_full(OSError(errno.ENOSPC, "No space left on device"))
    assert is_disk_full(sqlite3.OperationalError("database or disk is full"))
    spark = "query stopped: java.io.IOException: No space left on device\n\tat java.base/..."
    assert is_disk_full(spark), "a Spark query's failure text"
    assert not is_disk_full(OSError(errno.EACCES, "Permission denied"))
    assert not is_disk_full("PythonException: KeyError: 'page'")


def test_the_message_names_the_path_and_its_free_space(tmp_path: Path) -> None:
    missing = tmp_path / "not" / "yet"
    assert "MB free of" in free_space(missing), "the nearest existing ancestor's filesystem"
    said = disk_full_message(tmp_path, "task views-0", sqlite3.OperationalError("database or disk is full"))
    assert said.startswith(f"task views-0: the disk is full: {tmp_path} has ")
    assert "database or disk is full" in said and "resumes from its last checkpoint" in said
    spark = (
        "query stopped: PythonException: Traceback (most recent call last):\n  ...\n"
        "sqlite3.OperationalError: database or disk is full"
    )
    assert "(sqlite3.OperationalError: database or disk is full)" in disk_full_message(tmp_path, "task t", spark)
