"""The job's systems: build each system's admin, consumer and producer once, from `systems.<name>.factory`.

Streams are named by `weirflow.interfaces.stream_names` (a stream id resolved to its system and physical name,
the name
of its dead letters), re-exported here for the core's modules that import them with the systems.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from weirflow.interfaces.config import ConfigView
from weirflow.interfaces.plugins import system_factory
from weirflow.interfaces.stream_names import (
    DEAD_LETTER_SUFFIX,
    StreamRef,
    dead_letter_stream,
    declared_streams,
    stream_id_of,
    stream_ref,
)
from weirflow.interfaces.system import (
    SystemAdmin,
    SystemConsumer,
    SystemFactory,
    SystemProducer,
)
from weirflow.interfaces.table import TableWriter

__all__ = [
    "DEAD_LETTER_SUFFIX",
    "HTTP_REQUEST_SCHEMA",
    "StreamRef",
    "Systems",
    "dead_letter_stream",
    "declared_streams",
    "is_http_stream",
    "stream_id_of",
    "stream_ref",
]


#: The columns of the records an ``http`` stream's requests become (docs/endpoints.md "Request/response"), as
#: Spark DDL: the ``http`` system writes them (`weirflow.endpoints.http_system`) and the Spark source reads an
#: ``http`` stream with this schema unless the stream declares its own.
HTTP_REQUEST_SCHEMA = "connection string, kind string, request string, body string, partition int, tasks int"


def is_http_stream(config: ConfigView | None, stream_id: str) -> bool:
    """Whether ``stream_id`` is on a system whose factory is ``http`` (request/response, docs/endpoints.md):
    such a stream is both read (requests) and written (responses) by the job."""
    from weirflow.interfaces.plugins import system_factory_value

    if config is None:
        return False
    return system_factory_value(config, stream_ref(config, stream_id).system) == "http"


class Systems:
    """Lazily built, cached clients of every system the job uses. Thread-safe; `close` releases them all."""

    def __init__(self, config: ConfigView) -> None:
        self._config = config
        self._lock = threading.Lock()
        self._refs: dict[str, StreamRef] = {}
        self._factories: dict[str, SystemFactory] = {}
        self._admins: dict[str, SystemAdmin] = {}
        self._consumers: dict[str, SystemConsumer] = {}
        self._producers: dict[str, SystemProducer] = {}
        self._tables: dict[str, TableWriter | None] = {}

    @property
    def config(self) -> ConfigView:
        """The job config the systems were built from (stream settings live there too)."""
        return self._config

    def resolve(self, stream_id: str) -> StreamRef:
        """Cached: the record runner resolves the stream of every outgoing record."""
        ref = self._refs.get(stream_id)
        if ref is None:
            ref = self._refs[stream_id] = stream_ref(self._config, stream_id)
        return ref

    def stream_id_of(self, system: str, physical: str) -> str:
        """Inverse of `resolve` for streams declared in config; undeclared streams are their own id."""
        return stream_id_of((self.resolve(s) for s in self._config.names("streams")), system, physical)

    def factory(self, system: str) -> SystemFactory:
        with self._lock:
            if system not in self._factories:
                self._factories[system] = system_factory(self._config, system)
            return self._factories[system]

    def _client(self, cache: dict[str, Any], system: str, make: Callable[[str, Any], Any]) -> Any:
        with self._lock:
            if system not in cache:
                cache[system] = make(system, self._config)
            return cache[system]

    def admin(self, system: str) -> SystemAdmin:
        return self._client(self._admins, system, self.factory(system).get_admin)

    def consumer(self, system: str) -> SystemConsumer:
        return self._client(self._consumers, system, self.factory(system).get_consumer)

    def producer(self, system: str) -> SystemProducer:
        return self._client(self._producers, system, self.factory(system).get_producer)

    def table_writer(self, system: str) -> TableWriter | None:
        """The system's `TableWriter` when its streams are tables, else None."""
        return self._client(self._tables, system, self.factory(system).get_table_writer)

    def close(self) -> None:
        with self._lock:
            clients: list[SystemProducer | SystemConsumer | SystemAdmin | TableWriter] = [
                *self._producers.values(),
                *self._consumers.values(),
                *self._admins.values(),
                *(t for t in self._tables.values() if t is not None),
            ]
            self._tables.clear()
            self._producers.clear()
            self._consumers.clear()
            self._admins.clear()
        for client in clients:
            client.close()
