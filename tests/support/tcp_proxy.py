"""A TCP proxy for fault tests: forwards a local port to an upstream port, and can *blackhole* it.

Blackholed, the proxy stops forwarding in both directions and holds every connection open without a byte
going through (new connections are accepted and held too): what a network partition looks like to a client —
requests that neither fail nor get an answer. `heal` resets the connections held during the blackhole (as a
partition's connections eventually are) and forwards new ones again, so a request held during the outage is
never delivered late.

`AzuriteProxy` puts one proxy in front of each of Azurite's blob and table ports and gives a connection string
through them, so one processor can be cut off from storage while others reach it directly::

    with AzuriteProxy(azurite_connection_string) as proxy:
        start_processor(..., overrides=[f"azure.storage.connection.string={proxy.connection_string}"])
        proxy.blackhole(); ...; proxy.heal()
"""

from __future__ import annotations

import re
import select
import socket
import threading
from urllib.parse import urlparse

_CHUNK = 65536
_TICK_S = 0.05


class TcpProxy:
    """Forwards ``127.0.0.1:<port>`` to ``upstream`` (host, port)."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self._blackholed = False
        self._generation = 0  # bumped by heal: connections of an older generation are reset
        self._closed = threading.Event()
        self._guard = threading.Lock()
        self._sockets: set[socket.socket] = set()
        self._accepter = threading.Thread(target=self._accept, name=f"proxy-{self.port}", daemon=True)

    def start(self) -> TcpProxy:
        self._accepter.start()
        return self

    def blackhole(self) -> None:
        with self._guard:
            self._blackholed = True

    def heal(self) -> None:
        with self._guard:
            self._blackholed = False
            self._generation += 1

    @property
    def blackholed(self) -> bool:
        return self._blackholed

    def stop(self) -> None:
        self._closed.set()
        self._listener.close()
        with self._guard:
            sockets, self._sockets = set(self._sockets), set()
        for sock in sockets:
            _close(sock)

    # --- internals ------------------------------------------------------------------------------------
    def _accept(self) -> None:
        self._listener.settimeout(_TICK_S * 4)
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _track(self, sock: socket.socket) -> None:
        with self._guard:
            self._sockets.add(sock)

    def _serve(self, client: socket.socket) -> None:
        self._track(client)
        upstream: socket.socket | None = None
        try:
            while self._blackholed and not self._closed.is_set():  # held from the start: never connected
                threading.Event().wait(_TICK_S)
                if not self._blackholed:
                    return  # reset: it was held during the outage
            upstream = socket.create_connection(self.upstream, timeout=5)
            self._track(upstream)
            self._pump(client, upstream, self._generation)
        except OSError:
            pass
        finally:
            for sock in (client, upstream):
                if sock is not None:
                    _close(sock)
                    with self._guard:
                        self._sockets.discard(sock)

    def _pump(self, client: socket.socket, upstream: socket.socket, generation: int) -> None:
        held = False
        while not self._closed.is_set():
            if self._blackholed:
                held = True
                threading.Event().wait(_TICK_S)
                continue
            if held or generation != self._generation:
                return  # held during a blackhole: reset it
            readable, _, _ = select.select([client, upstream], [], [], _TICK_S)
            for sock in readable:
                data = sock.recv(_CHUNK)
                if not data:
                    return
                (upstream if sock is client else client).sendall(data)


def _close(sock: socket.socket) -> None:
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # RST
    except OSError:
        pass
    try:
        sock.close()
    except OSError:
        pass


class AzuriteProxy:
    """Proxies in front of the blob and table endpoints of a connection string (Azurite's, on 127.0.0.1)."""

    def __init__(self, connection_string: str) -> None:
        self._upstream = connection_string
        self.blob = TcpProxy(_endpoint(connection_string, "BlobEndpoint"))
        self.table = TcpProxy(_endpoint(connection_string, "TableEndpoint"))

    @property
    def connection_string(self) -> str:
        text = re.sub(r"(BlobEndpoint=http://[^:/;]+:)\d+", rf"\g<1>{self.blob.port}", self._upstream)
        return re.sub(r"(TableEndpoint=http://[^:/;]+:)\d+", rf"\g<1>{self.table.port}", text)

    def start(self) -> AzuriteProxy:
        self.blob.start()
        self.table.start()
        return self

    def blackhole(self) -> None:
        self.blob.blackhole()
        self.table.blackhole()

    def heal(self) -> None:
        self.blob.heal()
        self.table.heal()

    def stop(self) -> None:
        self.blob.stop()
        self.table.stop()

    def __enter__(self) -> AzuriteProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _endpoint(connection_string: str, name: str) -> tuple[str, int]:
    match = re.search(rf"{name}=([^;]+)", connection_string)
    if match is None:
        raise ValueError(f"the connection string has no {name}")
    url = urlparse(match.group(1))
    if url.hostname is None or url.port is None:
        raise ValueError(f"{name} {match.group(1)} names no host and port")
    return url.hostname, url.port
