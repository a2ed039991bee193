"""The job's streams and systems: resolve a stream id to its system and physical name, and build each system's
admin, consumer and producer once, from `systems.<name>.factory`.

A *stream id* is the name used in config and code (`streams.<id>.*`); its *physical name* is what the system
calls it (`streams.<id>.physical.name`, default the id). Its system is `streams.<id>.system`, default
`job.default.system` (itself `local` by default, the embedded SQLite log). A pipeline's intermediate stream
resolves differently (`stream_ref`), and every stream's dead letters go to `dead_letter_stream`.

These naming rules live here and only here (`stream_ref`, `stream_id_of`, `dead_letter_stream`): the CLI,
the planners, the Spark source and sink and the plugins all call them, so a stream is never found under one
name by one component and written under another by the next.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from weirflow.factories import system_factory
from weirflow.interfaces.system import (
    SystemAdmin,
    SystemConsumer,
    SystemFactory,
    SystemProducer,
    SystemStream,
)


@dataclass(frozen=True)
class StreamRef:
    """A stream id resolved: ``system`` (config name) and ``physical`` (name on the system)."""

    stream_id: str
    system: str
    physical: str

    @property
    def system_stream(self) -> SystemStream:
        return SystemStream(self.system, self.physical)


def stream_ref(config: Any, stream_id: str, *, intermediate: bool = False) -> StreamRef:
    """Stream id -> system and physical name: the one rule.

    A declared stream is on `streams.<id>.system` (default `job.default.system`) and called
    `streams.<id>.physical.name` (default the id). An ``intermediate`` stream (a pipeline's ``partition_by``)
    is on `job.intermediate.system` (default `job.default.system`) and called `streams.<id>.physical.name`
    (default ``<job.name>-<job.id>-<id>``: weirflow creates and owns it, so two jobs must not share it).
    """
    physical = config.get(f"streams.{stream_id}.physical.name")
    if intermediate:
        system = config.get("job.intermediate.system") or config.get("job.default.system")
        physical = physical or f"{config.get('job.name')}-{config.get('job.id')}-{stream_id}"
    else:
        system = config.get(f"streams.{stream_id}.system") or config.get("job.default.system")
        physical = physical or stream_id
    return StreamRef(stream_id, system, physical)


def declared_streams(config: Any) -> list[StreamRef]:
    """Every stream declared under `streams.<id>`, resolved by `stream_ref`."""
    return [stream_ref(config, stream_id) for stream_id in config.names("streams")]


def stream_id_of(refs: Iterable[StreamRef], system: str, physical: str) -> str:
    """The inverse of `stream_ref` over ``refs``: the id of the stream called ``physical`` on ``system``. A
    stream none of them names is its own id (its physical name), as an undeclared stream id is."""
    for ref in refs:
        if ref.system == system and ref.physical == physical:
            return ref.stream_id
    return physical


DEAD_LETTER_SUFFIX = ".dlq"


#: The columns of the records an ``http`` stream's requests become (docs/endpoints.md "Request/response"), as
#: Spark DDL: the ``http`` system writes them (`weirflow.endpoints.http_system`) and the Spark source reads an
#: ``http`` stream with this schema unless the stream declares its own.
HTTP_REQUEST_SCHEMA = "connection string, kind string, request string, body string, partition int, tasks int"


def is_http_stream(config: Any, stream_id: str) -> bool:
    """Whether ``stream_id`` is on a system whose factory is ``http`` (request/response, docs/endpoints.md):
    such a stream is both read (requests) and written (responses) by the job."""
    from weirflow.factories import system_factory_value

    if config is None:
        return False
    return system_factory_value(config, stream_ref(config, stream_id).system) == "http"


def dead_letter_stream(physical: str) -> str:
    """Physical name of the dead-letter stream of the stream called ``physical``: ``<physical>.dlq``, on the
    same system and partition. The planner creates it for every input, the source and the sink write to it
    and `weirflow streams consume` reads it, so all of them must spell it this one way."""
    return f"{physical}{DEAD_LETTER_SUFFIX}"


class Systems:
    """Lazily built, cached clients of every system the job uses. Thread-safe; `close` releases them all."""

    def __init__(self, config: Any) -> None:
        self._config = config
        self._lock = threading.Lock()
        self._refs: dict[str, StreamRef] = {}
        self._factories: dict[str, SystemFactory] = {}
        self._admins: dict[str, SystemAdmin] = {}
        self._consumers: dict[str, SystemConsumer] = {}
        self._producers: dict[str, SystemProducer] = {}

    @property
    def config(self) -> Any:
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

    def close(self) -> None:
        with self._lock:
            clients = [*self._producers.values(), *self._consumers.values(), *self._admins.values()]
            self._producers.clear()
            self._consumers.clear()
            self._admins.clear()
        for client in clients:
            client.close()
