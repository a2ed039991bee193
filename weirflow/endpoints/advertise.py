"""The URL a processor registers for its endpoint server: what other processors and clients use to reach it.

It goes into the processor's row in the registry, and every peer forwards lookups to it (docs/endpoints.md,
"Peers"). ``endpoints.advertised.url`` wins when set. Otherwise the bound host is the URL's host, except an
*unspecified* one (``0.0.0.0``, ``::``: every address of the machine), which names no machine: a peer
connecting to it reaches itself. Then the machine's address towards the network is advertised instead — the
source address the kernel picks for a route out (a UDP ``connect``, which sends nothing), else what the host
name resolves to — and with none but loopback the server refuses to start rather than register an address
nobody else can use.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
from collections.abc import Callable, Iterable
from urllib.parse import urlsplit

from weirflow.base.errors import StartupError

log = logging.getLogger("weirflow.endpoints")

# Destinations only for the kernel's route lookup: a UDP connect sends no packet. Private / documentation ranges,
# so nothing is ever contacted even if a packet were sent.
_PROBES = {socket.AF_INET: "10.255.255.255", socket.AF_INET6: "2001:db8::1"}


def unspecified(host: str) -> bool:
    """Whether binding ``host`` means every address of the machine (``0.0.0.0``, ``::``, ``""``)."""
    if host == "":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_unspecified
    except ValueError:
        return False


def machine_addresses(family: socket.AddressFamily) -> list[str]:
    """This machine's candidate addresses in ``family``, best first: the source address of its route out, then
    the addresses its host name resolves to (either may be loopback; `advertised_url` filters)."""
    found: list[str] = []
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect((_PROBES[family], 9))
            found.append(str(probe.getsockname()[0]))
    except OSError as exc:  # no route in this family
        log.debug("no route out over %s: %s", family.name, exc)
    try:
        infos = socket.getaddrinfo(socket.gethostname(), None, family, socket.SOCK_STREAM)
        found += [str(info[4][0]) for info in infos]
    except OSError as exc:
        log.debug("host name %s does not resolve over %s: %s", socket.gethostname(), family.name, exc)
    return found


def _reachable(address: str) -> bool:
    try:
        ip = ipaddress.ip_address(address.split("%")[0])
    except ValueError:
        return False
    if ip.is_loopback or ip.is_unspecified or ip.is_multicast:
        return False
    return not (ip.version == 6 and ip.is_link_local)  # fe80::/10 needs the interface's scope: not a peer's URL


def _url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def advertised_url(
    host: str,
    port: int,
    configured: str | None = None,
    addresses: Callable[[socket.AddressFamily], Iterable[str]] = machine_addresses,
) -> str:
    """The URL to register for a server bound to ``host``:``port``; ``configured`` is ``endpoints.advertised.url``.

    `StartupError` when it would name no machine (an unspecified host in ``configured``, or bound to every
    address of a machine that has only loopback): set ``endpoints.advertised.url``.
    """
    if configured:
        named = urlsplit(configured).hostname or ""
        if unspecified(named):
            raise StartupError(
                f"endpoints.advertised.url {configured!r} names no machine ('{named}' means every address): "
                "set it to a host or address the other processors and clients can reach"
            )
        return configured
    if not unspecified(host):
        return _url(host.strip("[]"), port)
    # "::" is bound dual-stack (EndpointServer.start): an IPv4 address reaches it too.
    families = [socket.AF_INET6, socket.AF_INET] if ":" in host else [socket.AF_INET]
    for family in families:
        for address in addresses(family):
            if _reachable(address):
                url = _url(address, port)
                log.info(
                    "endpoints.host %r is every address of this machine: advertising %s, its address towards the "
                    "network (set endpoints.advertised.url to advertise another)",
                    host,
                    url,
                )
                return url
    raise StartupError(
        f"endpoints.host {host!r} listens on every address, but this machine has no address other processors "
        "can reach (only loopback): set endpoints.advertised.url to the URL they should use (e.g. "
        f"http://<this machine's name>:{port}, with endpoints.port fixed), or bind endpoints.host to 127.0.0.1"
    )
