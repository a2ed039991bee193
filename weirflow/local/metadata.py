"""`MetadataStore` on SQLite: JSON documents with uuid etags (never repeated, even after delete).

The documents live in the job's database beside the embedded coordinator's ``leases`` table, so
`put_as_holder` checks the lease in the same transaction as the write: a leader whose lease expired and was
taken cannot publish, whatever its own clock or deadline says.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

from weirflow.base import clock, malformed
from weirflow.base.errors import EtagMismatchError, LockLostError, MalformedDocumentError
from weirflow.base.sqlite import Database
from weirflow.interfaces.metadata import Document, LeaseHolder, MetadataStore, decode_value

SCHEMA = "CREATE TABLE IF NOT EXISTS metadata (key TEXT PRIMARY KEY, value TEXT NOT NULL, etag TEXT NOT NULL);"


class SqliteMetadataStore(MetadataStore):
    def __init__(self, db_path: Path, busy_timeout_ms: int = 10000) -> None:
        self._db = Database(db_path, SCHEMA, busy_timeout_ms)

    def get(self, key: str) -> Document | None:
        row = self._db.connection().execute("SELECT value, etag FROM metadata WHERE key = ?", (key,)).fetchone()
        return Document(key, decode_value(key, row[0]), row[1]) if row else None

    def put(
        self, key: str, value: dict[str, Any], *, if_match: str | None = None, if_none_match: bool = False
    ) -> str:
        return self._put(key, value, None, if_match, if_none_match)

    def put_as_holder(
        self,
        key: str,
        value: dict[str, Any],
        holder: LeaseHolder,
        *,
        if_match: str | None = None,
        if_none_match: bool = False,
    ) -> str:
        return self._put(key, value, holder, if_match, if_none_match)

    @staticmethod
    def _check_holder(conn: Any, holder: LeaseHolder) -> None:
        if conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'leases'").fetchone() is None:
            return  # the leases live elsewhere (another coordinator): the caller's self-fence is the guard
        row = conn.execute(
            "SELECT 1 FROM leases WHERE name = ? AND owner = ? AND instance = ? AND expires_ms > ?",
            (holder.name, holder.owner, holder.instance, clock.now_ms()),
        ).fetchone()
        if row is None:
            raise LockLostError(holder.name, holder.owner)

    def _put(
        self,
        key: str,
        value: dict[str, Any],
        holder: LeaseHolder | None,
        if_match: str | None,
        if_none_match: bool,
    ) -> str:
        etag = uuid.uuid4().hex
        with self._db.transaction() as conn:
            if holder is not None:
                self._check_holder(conn, holder)
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
        documents = []
        for key, value, etag in rows:
            try:
                documents.append(Document(key, decode_value(key, value), etag))
            except MalformedDocumentError as exc:
                malformed.report(key, exc, value, action="skipped")
        return documents

    def stop(self) -> None:
        self._db.close()
