"""Offsets of a Delta stream: **positions** ``<version>:<row>``, the row-th row (from 0) that commit ``version``
added (`weirflow_delta.log`: data files in the order of the log entry, rows in file order).

A table is one partition. The offset after a commit's last row is the next commit's first, ``<version + 1>:0``,
so one place has one name wherever a read stops; a commit that added no rows (marks only, a rewrite) holds no
position, and ``<v>:0`` then means the first row at or after commit v. Positions are never dense sequence
numbers (commits add many rows at once, and their counts are in the log, not in the offsets), so the admin
compares and counts them (`SystemAdmin.dense_offsets` False).
"""

from __future__ import annotations

import re
from typing import NamedTuple

from weirflow.base.errors import InvalidOffsetError

_POSITION = re.compile(r"^(\d+):(\d+)$")


class Position(NamedTuple):
    """A place in a table: a commit's version and a row of it; ordered as the table's rows are."""

    version: int
    row: int

    def __str__(self) -> str:
        return f"{self.version}:{self.row}"

    @classmethod
    def parse(cls, text: str) -> Position:
        match = _POSITION.match(text.strip())
        if not match:
            raise InvalidOffsetError(
                f"'{text}' is not an offset of a Delta stream: <version>:<row>, the row-th row of a commit"
            )
        return cls(int(match.group(1)), int(match.group(2)))


START = Position(0, 0)
