"""The job's streams and systems: resolve a stream id to its system and physical name, and build each system's
admin, consumer and producer once, from `systems.<name>.factory`.

A *stream id* is the name used in config and code (`streams.<id>.*`); its *physical name* is what the system
calls it (`streams.<id>.physical.name`, default the id). Its system is `streams.<id>.system`, default
`job.default.system` (itself `local` by default, the embedded SQLite log).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
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
            system = self._config.get(f"streams.{stream_id}.system") or self._config.get("job.default.system")
            physical = self._config.get(f"streams.{stream_id}.physical.name") or stream_id
            ref = self._refs[stream_id] = StreamRef(stream_id, system, physical)
        return ref

    def stream_id_of(self, system: str, physical: str) -> str:
        """Inverse of `resolve` for streams declared in config; undeclared streams are their own id."""
        for stream_id in self._config.names("streams"):
            ref = self.resolve(stream_id)
            if ref.system == system and ref.physical == physical:
                return stream_id
        return physical

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
