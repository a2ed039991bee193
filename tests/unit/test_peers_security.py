"""Processors calling each other carry the bearer token (docs/endpoints.md, "Peers"): an ``https`` peer gets TLS
and never plain text, a redirect is never followed, and no processor registers an address no peer can reach."""

from __future__ import annotations

import asyncio
import datetime
import http.server
import ipaddress
import json
import socket
import ssl
import threading
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from weirflow.base.errors import PeerError, StartupError
from weirflow.endpoints.advertise import advertised_url, machine_addresses
from weirflow.endpoints.peers import PeerClient, peer_target
from weirflow.endpoints.server import EndpointServer
from weirflow.endpoints.settings import EndpointSettings
from weirflow.endpoints.task_report import gather

TOKEN = "s3cret-token"


# --- helpers ---------------------------------------------------------------------------------------------------
def _self_signed(tmp_path: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and localhost, and its key, as PEM files."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "weirflow test peer")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = tmp_path / "peer.pem", tmp_path / "peer.key"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return cert_file, key_file


class _Recorder(http.server.BaseHTTPRequestHandler):
    """Answers every GET with ``server.answer`` (status, headers, body) and records what it received."""

    protocol_version = "HTTP/1.1"
    server: _Server

    def do_GET(self) -> None:
        tls = self.connection.version() if isinstance(self.connection, ssl.SSLSocket) else None
        self.server.seen.append({"path": self.path, "headers": dict(self.headers), "tls": tls})
        status, headers, body = self.server.answer
        self.send_response(status)
        for key, value in {**headers, "Content-Length": str(len(body))}.items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    seen: list[dict[str, Any]]
    answer: tuple[int, dict[str, str], bytes]


def _serve(answer: tuple[int, dict[str, str], bytes], tls: ssl.SSLContext | None = None) -> _Server:
    server = _Server(("127.0.0.1", 0), _Recorder)
    server.seen = []
    server.answer = answer
    if tls is not None:
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture
def cert(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    yield _self_signed(tmp_path)


def _tls_server(cert: tuple[Path, Path]) -> _Server:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(*cert)
    return _serve((200, {"Content-Type": "application/json"}, b'{"ok": true}'), tls=context)


def _get(client: PeerClient, url: str, path: str) -> tuple[int, bytes]:
    async def go() -> tuple[int, bytes]:
        try:
            return await client.get(url, path)
        finally:
            client.close()

    return asyncio.run(go())


# --- 1. https peers get TLS --------------------------------------------------------------------------------------
def test_an_https_peer_is_asked_over_tls_with_the_token(cert: tuple[Path, Path]) -> None:
    server = _tls_server(cert)
    try:
        trusting = ssl.create_default_context(cafile=str(cert[0]))
        client = PeerClient({"authorization": f"Bearer {TOKEN}"}, ssl_context=trusting)
        status, body = _get(client, f"https://127.0.0.1:{server.server_port}", "/tables/t/k")
    finally:
        server.shutdown()
    assert (status, json.loads(body)) == (200, {"ok": True})
    [seen] = server.seen
    assert seen["path"] == "/tables/t/k"
    assert seen["headers"]["authorization"] == f"Bearer {TOKEN}"
    assert seen["tls"] in ("TLSv1.2", "TLSv1.3")  # it arrived through the TLS socket


def test_ssl_cert_file_names_a_private_ca(cert: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SSL_CERT_FILE", str(cert[0]))
    server = _tls_server(cert)
    try:
        status, _ = _get(PeerClient({}), f"https://127.0.0.1:{server.server_port}", "/healthz")
    finally:
        server.shutdown()
    assert status == 200


def test_an_untrusted_certificate_is_refused_before_the_token_is_sent(cert: tuple[Path, Path]) -> None:
    server = _tls_server(cert)
    try:
        with pytest.raises(PeerError, match="CERTIFICATE_VERIFY_FAILED"):
            _get(PeerClient({"authorization": f"Bearer {TOKEN}"}), f"https://127.0.0.1:{server.server_port}", "/")
    finally:
        server.shutdown()
    assert server.seen == []


def test_an_https_url_is_never_spoken_to_in_plain_text() -> None:
    """A listener on the https URL's port records the first bytes it gets: a TLS ClientHello, never the request."""
    listener = socket.create_server(("127.0.0.1", 0))
    received: list[bytes] = []

    def first_bytes() -> None:
        conn, _ = listener.accept()
        with conn:
            received.append(conn.recv(65536))

    reader = threading.Thread(target=first_bytes, daemon=True)
    reader.start()
    try:
        with pytest.raises(PeerError):  # the listener hangs up instead of finishing the handshake
            _get(
                PeerClient({"authorization": f"Bearer {TOKEN}"}),
                f"https://127.0.0.1:{listener.getsockname()[1]}",
                "/tables/t/k",
            )
        reader.join(5)
    finally:
        listener.close()
    [data] = received
    assert data[:1] == b"\x16"  # a TLS handshake record
    assert b"GET" not in data and TOKEN.encode() not in data


def test_default_ports_follow_the_scheme() -> None:
    assert peer_target("https://peer.example") == ("https", "peer.example", 443, "")
    assert peer_target("http://peer.example/base/") == ("http", "peer.example", 80, "/base")
    assert peer_target("HTTPS://[fd00::2]:8443") == ("https", "fd00::2", 8443, "")
    with pytest.raises(PeerError, match="endpoints.advertised.url"):
        peer_target("ftp://peer.example")


# --- 2. never advertise an unspecified address -------------------------------------------------------------------
def test_an_unspecified_host_advertises_the_machines_address() -> None:
    def addresses(family: socket.AddressFamily) -> list[str]:
        return {
            socket.AF_INET: ["127.0.0.1", "0.0.0.0", "10.1.2.3"],
            socket.AF_INET6: ["::1", "fe80::1", "fd00::5"],
        }[family]

    assert advertised_url("0.0.0.0", 8080, addresses=addresses) == "http://10.1.2.3:8080"
    assert advertised_url("::", 8080, addresses=addresses) == "http://[fd00::5]:8080"
    assert advertised_url("", 8080, addresses=addresses) == "http://10.1.2.3:8080"
    # "::" is dual-stack: with no IPv6 address but loopback/link-local, an IPv4 one does
    only_v4 = {socket.AF_INET: ["10.1.2.3"], socket.AF_INET6: ["::1", "fe80::1"]}
    assert advertised_url("::", 8080, addresses=only_v4.__getitem__) == "http://10.1.2.3:8080"
    # a specific address is advertised as bound, endpoints.advertised.url over everything
    assert advertised_url("192.0.2.7", 81, addresses=addresses) == "http://192.0.2.7:81"
    assert advertised_url("fd00::7", 81, addresses=addresses) == "http://[fd00::7]:81"
    assert advertised_url("0.0.0.0", 81, "https://job.example", addresses) == "https://job.example"


def test_only_loopback_refuses_to_start_naming_the_key() -> None:
    loopback = {socket.AF_INET: ["127.0.0.1", "127.0.1.1"], socket.AF_INET6: ["::1"]}
    for host in ("0.0.0.0", "::"):
        with pytest.raises(StartupError, match="endpoints.advertised.url"):
            advertised_url(host, 8080, addresses=loopback.__getitem__)
    with pytest.raises(StartupError, match="endpoints.advertised.url"):
        advertised_url("127.0.0.1", 8080, "http://0.0.0.0:8080")


@pytest.mark.parametrize("bound", ["0.0.0.0", "::"])
def test_a_server_bound_to_every_address_registers_one_peers_reach(bound: str) -> None:
    family = socket.AF_INET6 if ":" in bound else socket.AF_INET
    if not any(not ipaddress.ip_address(a).is_loopback for a in machine_addresses(family)):
        pytest.skip(f"this machine has no {family.name} address but loopback")

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": b"here"})

    settings = EndpointSettings(enabled=True, host=bound, port=0, advertised_url=None, token=TOKEN)
    server = EndpointServer(settings, app)
    url = server.start()
    try:
        host = ipaddress.ip_address(urllib.parse.urlsplit(url).hostname or "")
        assert not host.is_unspecified and not host.is_loopback
        with urllib.request.urlopen(url + "/healthz", timeout=5) as answer:
            assert answer.read() == b"here"
        port = urllib.parse.urlsplit(url).port
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as answer:  # "::": IPv4 too
            assert answer.read() == b"here"
    finally:
        server.stop()


# --- 3. a redirect is never followed with the token --------------------------------------------------------------
@pytest.fixture
def redirect_to_elsewhere() -> Iterator[tuple[_Server, _Server]]:
    elsewhere = _serve((200, {"Content-Type": "application/json"}, b'{"t-0": {}}'))
    redirecting = _serve((302, {"Location": f"http://127.0.0.1:{elsewhere.server_port}/tasks"}, b""))
    yield redirecting, elsewhere
    redirecting.shutdown()
    elsewhere.shutdown()


def test_task_reports_refuse_a_redirect_and_report_it(redirect_to_elsewhere: tuple[_Server, _Server]) -> None:
    redirecting, elsewhere = redirect_to_elsewhere
    urls = {"me": "http://unused", "peer": f"http://127.0.0.1:{redirecting.server_port}"}
    reports = gather(urls, "me", lambda: {"mine": {}}, TOKEN)
    assert reports["me"] == {"mine": {}}
    assert "302" in reports["peer"]["error"] and "not followed" in reports["peer"]["error"]
    assert [s["headers"].get("Authorization") for s in redirecting.seen] == [f"Bearer {TOKEN}"]
    assert elsewhere.seen == []


def test_forwarded_lookups_return_a_redirect_as_it_is(redirect_to_elsewhere: tuple[_Server, _Server]) -> None:
    redirecting, elsewhere = redirect_to_elsewhere
    client = PeerClient({"authorization": f"Bearer {TOKEN}"})
    status, _ = _get(client, f"http://127.0.0.1:{redirecting.server_port}", "/tables/t/k")
    assert status == 302
    assert len(redirecting.seen) == 1 and elsewhere.seen == []
