"""Where a processor's HTTP server listens and who may call it: ``endpoints.*``.

Loopback by default, and then open (only this machine reaches it). Bound to any other address it requires a
bearer token on every route (``endpoints.auth.token``, set it from the environment: ``${WEIRFLOW_TOKEN}``); a
non-loopback address without one is a config error, so a job is never exposed by accident.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from urllib.parse import urlsplit

from weirflow.interfaces.config import ConfigView


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or an address, IPv6 with or without brackets) is this machine's loopback."""
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class EndpointSettings:
    enabled: bool
    host: str
    port: int  # 0: any free port
    advertised_url: str | None
    token: str | None
    route_wait_ms: int = 2000
    tap_queue_size: int = 10_000
    rpc_timeout_ms: int = 10_000
    rpc_timeout_max_ms: int = 300_000
    request_max_bytes: int = 1_048_576
    tap_max: int = 16
    conversations_max: int = 1_000
    allowed_origins: tuple[str, ...] = ()
    read_threads: int = 4
    allowed_hosts: tuple[str, ...] = ()
    history_interval_ms: int = 5_000
    history_window_ms: int = 600_000

    @classmethod
    def from_config(cls, config: ConfigView) -> EndpointSettings:
        host = str(config.get("endpoints.host"))
        token = config.get("endpoints.auth.token") or None
        if not is_loopback(host) and not token:
            raise config.error(
                "endpoints.host",
                f"'{host}' is reachable from other machines: set endpoints.auth.token (from the environment, "
                "e.g. ${WEIRFLOW_ENDPOINTS_TOKEN}) so every request must carry it, or bind to 127.0.0.1",
            )
        port = int(config.get("endpoints.port"))
        if not 0 <= port <= 65535:
            raise config.error("endpoints.port", f"{port} is not a port (0-65535; 0 picks a free one)")
        timeout_ms, timeout_max_ms = (
            int(config.get("endpoints.rpc.timeout.ms")),
            int(config.get("endpoints.rpc.timeout.max.ms")),
        )
        if not 0 < timeout_ms <= timeout_max_ms:
            raise config.error(
                "endpoints.rpc.timeout.ms",
                f"{timeout_ms} ms must be positive and at most endpoints.rpc.timeout.max.ms ({timeout_max_ms} ms)",
            )
        origins = tuple(str(o).rstrip("/") for o in config.get("endpoints.allowed.origins") or ())
        for origin in origins:
            if not _is_origin(origin):
                raise config.error(
                    "endpoints.allowed.origins",
                    f"'{origin}' is not an origin: write scheme, host and port only, e.g. https://ops.example.com "
                    "or http://localhost:8080",
                )
        hosts = tuple(str(h).strip().lower() for h in config.get("endpoints.allowed.hosts") or ())
        for name in hosts:
            if not name or any(c in name for c in "/:@[] "):
                raise config.error(
                    "endpoints.allowed.hosts",
                    f"'{name}' is not a host name: write the name clients put in the Host header, without scheme "
                    "or port, e.g. ops.example.com (IP addresses are always accepted)",
                )
        interval_ms = _positive(config, "endpoints.history.interval.ms")
        window_ms = _positive(config, "endpoints.history.window.ms")
        if window_ms < interval_ms:
            raise config.error(
                "endpoints.history.window.ms",
                f"{window_ms} ms is shorter than endpoints.history.interval.ms ({interval_ms} ms): "
                "the window would hold no more than one sample",
            )
        return cls(
            enabled=bool(config.get("endpoints.enabled")),
            host=host,
            port=port,
            advertised_url=config.get("endpoints.advertised.url") or None,
            token=token,
            route_wait_ms=int(config.get("endpoints.route.wait.ms")),
            tap_queue_size=int(config.get("endpoints.tap.queue.size")),
            rpc_timeout_ms=timeout_ms,
            rpc_timeout_max_ms=_positive(config, "endpoints.rpc.timeout.max.ms"),
            request_max_bytes=_positive(config, "endpoints.request.max.bytes"),
            tap_max=_positive(config, "endpoints.tap.max"),
            conversations_max=_positive(config, "endpoints.conversations.max"),
            allowed_origins=origins,
            read_threads=_positive(config, "endpoints.read.threads"),
            allowed_hosts=hosts,
            history_interval_ms=interval_ms,
            history_window_ms=window_ms,
        )


def _is_origin(text: str) -> bool:
    """Whether ``text`` is a browser origin: ``http`` or ``https``, a host, perhaps a port, nothing else."""
    try:
        parts = urlsplit(text)
        parts.port  # noqa: B018 - raises ValueError for a port out of range
    except ValueError:
        return False
    return (
        parts.scheme in ("http", "https")
        and bool(parts.hostname)
        and not (parts.path or parts.query or parts.fragment or parts.username)
    )


def _positive(config: ConfigView, key: str) -> int:
    value = int(config.get(key))
    if value <= 0:
        raise config.error(key, f"{value} must be positive")
    return value
