"""The test tree's TCP proxy (`tests/support/tcp_proxy.py`): forwards, blackholes (holds without a byte through),
heals."""

from __future__ import annotations

import socket
import threading

import pytest

from tests.support.tcp_proxy import AzuriteProxy, TcpProxy


def echo_server() -> tuple[socket.socket, int]:
    server = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=echo, args=(conn,), daemon=True).start()

    def echo(conn: socket.socket) -> None:
        try:
            while data := conn.recv(1024):
                conn.sendall(data)
        except OSError:
            pass  # the proxy reset it

    threading.Thread(target=serve, daemon=True).start()
    return server, int(server.getsockname()[1])


def roundtrip(port: int, timeout_s: float = 2) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
        sock.sendall(b"ping")
        return sock.recv(16)


def test_the_proxy_forwards_holds_while_blackholed_and_resets_held_connections_on_heal() -> None:
    server, port = echo_server()
    proxy = TcpProxy(("127.0.0.1", port)).start()
    try:
        assert roundtrip(proxy.port) == b"ping"
        held = socket.create_connection(("127.0.0.1", proxy.port), timeout=0.5)
        held.sendall(b"x")
        assert held.recv(16) == b"x"
        proxy.blackhole()
        held.sendall(b"lost")
        with pytest.raises(TimeoutError):
            held.recv(16)  # no answer, no error: the request hangs
        with pytest.raises(TimeoutError):
            roundtrip(proxy.port, timeout_s=0.5)  # a new connection is held too
        proxy.heal()
        held.settimeout(2)
        try:
            assert held.recv(16) == b""  # reset, never delivered late
        except ConnectionResetError:
            pass
        assert roundtrip(proxy.port) == b"ping"
    finally:
        proxy.stop()
        server.close()


def test_the_azurite_proxy_rewrites_both_endpoints() -> None:
    upstream = (
        "DefaultEndpointsProtocol=http;AccountName=a;AccountKey=k;"
        "BlobEndpoint=http://127.0.0.1:10000/a;TableEndpoint=http://127.0.0.1:10002/a;"
    )
    proxy = AzuriteProxy(upstream)
    try:
        text = proxy.connection_string
        assert f"BlobEndpoint=http://127.0.0.1:{proxy.blob.port}/a;" in text
        assert f"TableEndpoint=http://127.0.0.1:{proxy.table.port}/a;" in text
        assert proxy.blob.upstream == ("127.0.0.1", 10000) and proxy.table.upstream == ("127.0.0.1", 10002)
    finally:
        proxy.stop()
