"""`MetadataStore` on SQLite: JSON documents with uuid etags (never repeated, even after delete)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

from weirflow.errors import EtagMismatchError
from weirflow.interfaces.metadata import Document, MetadataStore
from weirflow.local.database import Database

SCHEMA = "CREATE TABLE IF NOT EXISTS metadata (key TEXT PRIMARY KEY, value TEXT NOT NULL, etag TEXT NOT NULL);"


class SqliteMetadataStore(MetadataStore):
    def __init__(self, db_path: Path, busy_timeout_ms: int = 10000) -> None:
        self._db = Database(db_path, SCHEMA, busy_timeout_ms)

    def get(self, key: str) -> Document | None:
        row = self._db.connection().execute("SELECT value, etag FROM metadata WHERE key = ?", (key,)).fetchone()
        return Document(key, json.loads(row[0]), row[1]) if row else None

    def put(
        self, key: str, value: dict[str, Any], *, if_match: str | None = None, if_none_match: bool = False
    ) -> str:
        etag = uuid.uuid4().hex
        with self._db.transaction() as conn:
            row = conn.execute("SELECT etag FROM metadata WHERE key = ?", (key,)).fetchone()
            current = row[0] if row else None
            if (if_none_match and current is not None) or (if_match is not None and current != if_match):
                raise EtagMismatchError(key, if_match)
            conn.execute(
                "INSERT INTO metadata (key, value, etag) VALUES (?, ?, ?) "
                "ON CONFLICT(key) DO UPDATE SET value = excluded.value, etag = excluded.etag",
                (key, json.dumps(value), etag),
            )
        return etag

    def delete(self, key: str, *, if_match: str | None = None) -> None:
        with self._db.transaction() as conn:
            row = conn.execute("SELECT etag FROM metadata WHERE key = ?", (key,)).fetchone()
            if if_match is not None and (row is None or row[0] != if_match):
                raise EtagMismatchError(key, if_match)
            conn.execute("DELETE FROM metadata WHERE key = ?", (key,))

    def list(self, prefix: str = "") -> list[Document]:
        rows = (
            self._db.connection()
            .execute(
                "SELECT key, value, etag FROM metadata WHERE substr(key, 1, ?) = ? ORDER BY key",
                (len(prefix), prefix),
            )
            .fetchall()
        )
        return [Document(k, json.loads(v), e) for k, v, e in rows]

    def stop(self) -> None:
        self._db.close()
