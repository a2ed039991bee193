"""An AMQP 1.0 server that the unmodified `azure-eventhub` SDK takes for Event Hubs — a development tool.

One thread runs a selector loop over a listening socket and its clients. Each client connection is a proton
engine (`Connection` + server `Transport` + `Collector`), so the emulator owns the bytes in both directions:
input goes straight to proton, output passes through `FramePadder` (the SDK needs full-length
performatives). What it serves, as the SDK uses it:

* SASL ANONYMOUS, then claims-based auth: ``$cbs`` ``put-token`` is accepted (202) — no token is checked;
* ``$management`` ``READ`` of hub (``com.microsoft:eventhub``) and partition (``com.microsoft:partition``)
  properties; errors are replies with a ``status-code`` (404 for an unknown hub or partition);
* sending to ``<hub>`` (by partition key with Event Hubs' lookup3 routing, else round robin) or
  ``<hub>/Partitions/<n>``, single messages and batches (message format 0x80013700);
* receiving from ``<hub>/ConsumerGroups/<group>/Partitions/<n>`` from the selector filter's position (offset,
  sequence number or enqueue time, ``>`` or ``>=``, ``-1`` = start, ``@latest`` = end), consumer groups
  created on first use, and epoch receivers (``com.microsoft:epoch``): a receiver with an equal or higher
  epoch steals the partition from the group's other receivers, which are detached with ``amqp:link:stolen``;
  one with a lower epoch is refused.

It is not a broker for production: no auth, no retention limit, no throttling, one thread.
"""

from __future__ import annotations

import itertools
import logging
import re
import selectors
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from proton import Collector, Condition, Connection, Delivery, Event, Message, Transport, symbol, timestamp

from weirflow.base.errors import WeirflowError
from weirflow_azure.eventhubs.emulator.frames import FramePadder
from weirflow_azure.eventhubs.emulator.messages import reply, split_batch
from weirflow_azure.eventhubs.emulator.store import EventStore, Hub
from weirflow_azure.eventhubs.lookup3 import partition_for_key

log = logging.getLogger("weirflow.emulator")

MAX_MESSAGE_SIZE = 1024 * 1024
PUBLISH_CREDIT = 500
# How often the loop ticks every client's transport, whatever the traffic: far under any idle time-out the SDK
# asks for (its keep-alive is tens of seconds), and short enough that a close or a time-out is answered at once.
HOUSEKEEPING_S = 0.1
EPOCH = symbol("com.microsoft:epoch")
_FILTER = re.compile(r"amqp\.annotation\.x-opt-(offset|sequence-number|enqueued-time)\s*(>=|>)\s*'([^']*)'")
_PATH = re.compile(
    r"^(?:amqps?://[^/]+)?/?(?P<hub>[^/]+)(?:/ConsumerGroups/(?P<group>[^/]+))?(?:/Partitions/(?P<p>\d+))?/?$"
)


class FilterError(WeirflowError, ValueError):
    """A receiver's filter the emulator does not understand; the link is refused with its text."""


def start_index(hub: Hub, partition: int, selector: str | None) -> int:
    """Index of the first event a receiver with this selector gets."""
    events = hub.partitions[partition]
    if not selector:
        return len(events.events)  # no filter: new events only, like '@latest'
    match = _FILTER.search(selector)
    if not match:
        raise FilterError(f"unsupported filter {selector!r}")
    kind, op, value = match.groups()
    inclusive = op == ">="
    if kind == "offset":
        if value == "@latest":
            return len(events.events)
        if value == "-1":
            return 0
        return events.index_after_offset(int(value), inclusive)
    if kind == "sequence-number":
        seq = int(value)
        return max(0, seq if inclusive else seq + 1)
    return events.index_after_time(int(value), inclusive)


_T = TypeVar("_T")


def _present(value: _T | None) -> _T:
    """An event's connection, session, link or delivery: proton types each Optional, and every event kind
    `_dispatch` handles carries the ones it reads."""
    assert value is not None, "a proton event without the object its kind names"
    return value


@dataclass(eq=False)
class Consumer:
    link: Any
    client: _Client
    hub: str
    group: str
    partition: int
    next_index: int
    epoch: int | None
    tags: itertools.count = field(default_factory=itertools.count)


@dataclass(eq=False)
class _Client:
    sock: socket.socket
    transport: Transport
    connection: Connection
    collector: Collector
    padder: FramePadder = field(default_factory=FramePadder)
    closed: bool = False


class EventHubsEmulator:
    """Serve ``hubs`` ({name: partition count}) on ``host:port`` (0 = a free port).

    ``start()`` runs the loop in a background thread (tests); ``serve_forever()`` in the caller's.
    """

    def __init__(
        self,
        hubs: dict[str, int],
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        data_dir: str | Path | None = None,
    ) -> None:
        self.store = EventStore(hubs, Path(data_dir) if data_dir else None)
        self._listener = socket.create_server((host, port))
        self._listener.setblocking(False)
        self.host, self.port = self._listener.getsockname()[:2]
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ)
        self._clients: list[_Client] = []
        self._consumers: list[Consumer] = []
        self._sent_to: set[_Client] = set()  # clients `_pump` sent events to since the loop last flushed
        self._round_robin: dict[str, itertools.cycle] = {
            name: itertools.cycle(range(len(hub.partitions))) for name, hub in self.store.hubs.items()
        }
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # --- public -------------------------------------------------------------------------------------------
    def connection_string(self, hub: str | None = None) -> str:
        """What the SDK needs: plain AMQP to this port (``UseDevelopmentEmulator=true``)."""
        text = (
            f"Endpoint=sb://{self.host}:{self.port};SharedAccessKeyName=emulator;"
            "SharedAccessKey=ZW11bGF0b3I=;UseDevelopmentEmulator=true"
        )
        return f"{text};EntityPath={hub}" if hub else text

    def add_hub(self, name: str, partitions: int) -> bool:
        """Serve one more hub while running (as creating one in the portal would); False if it was there."""
        return self.store.add_hub(name, partitions)

    def receivers(self, hub: str, partition: int) -> int:
        """How many receivers are attached to a partition (all consumer groups); for tests and tools."""
        return sum(1 for c in list(self._consumers) if c.hub == hub and c.partition == partition)

    def start(self) -> EventHubsEmulator:
        self._thread = threading.Thread(target=self.serve_forever, name="eventhubs-emulator", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
        self.store.close()

    def serve_forever(self) -> None:
        """Each wake-up handles the clients that sent something (`_read` processes and flushes them) and
        flushes the ones events were pumped to; every client's timers (`Transport.tick`: idle time-outs,
        keep-alive frames) and leftover engine events are seen to every `HOUSEKEEPING_S`. Ticking and
        processing every client at every wake-up made the loop's cost grow with connections times frames."""
        next_housekeeping = 0.0
        try:
            while not self._stop.is_set():
                timeout = max(0.0, min(HOUSEKEEPING_S, next_housekeeping - time.monotonic()))
                for key, _ in self._selector.select(timeout=timeout):
                    if key.fileobj is self._listener:
                        self._accept()
                    else:
                        self._read(key.data)
                if time.monotonic() >= next_housekeeping:
                    next_housekeeping = time.monotonic() + HOUSEKEEPING_S
                    now = time.time()
                    for client in list(self._clients):
                        if not client.closed:
                            client.transport.tick(now)
                            self._process(client)
                while self._sent_to:
                    self._flush(self._sent_to.pop())
        finally:
            for client in list(self._clients):
                self._drop(client)
            self._selector.close()
            self._listener.close()

    def __enter__(self) -> EventHubsEmulator:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- sockets ------------------------------------------------------------------------------------------
    def _accept(self) -> None:
        try:
            sock, _ = self._listener.accept()
        except BlockingIOError:
            return
        sock.setblocking(True)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        transport = Transport(Transport.SERVER)
        transport.max_frame_size = MAX_MESSAGE_SIZE
        sasl = transport.sasl()
        sasl.allowed_mechs("ANONYMOUS")
        transport.require_auth(False)
        connection = Connection()
        collector = Collector()
        connection.collect(collector)
        transport.bind(connection)
        client = _Client(sock, transport, connection, collector)
        self._clients.append(client)
        self._selector.register(sock, selectors.EVENT_READ, client)

    def _read(self, client: _Client) -> None:
        try:
            data = client.sock.recv(65536)
        except OSError:
            data = b""
        if not data:
            client.transport.close_tail()
            self._process(client)
            self._drop(client)
            return
        while data:
            capacity = client.transport.capacity()
            if capacity <= 0:
                break
            client.transport.push(data[:capacity])
            data = data[capacity:]
            self._process(client)
        self._process(client)

    def _flush(self, client: _Client) -> None:
        if client.closed:
            return
        while True:
            pending = client.transport.pending()
            if pending <= 0:
                if pending < 0:
                    self._drop(client)
                return
            chunk = _present(client.transport.peek(pending))  # None only at the end of the stream
            client.transport.pop(len(chunk))
            try:
                client.sock.sendall(client.padder.feed(chunk))
            except OSError:
                self._drop(client)
                return

    def _drop(self, client: _Client) -> None:
        if client.closed:
            return
        client.closed = True
        self._consumers = [c for c in self._consumers if c.client is not client]
        try:
            self._selector.unregister(client.sock)
        except (KeyError, ValueError):
            pass
        client.sock.close()
        if client in self._clients:
            self._clients.remove(client)

    # --- proton events ------------------------------------------------------------------------------------
    def _process(self, client: _Client) -> None:
        while True:
            event = client.collector.peek()
            if event is None:
                break
            try:
                self._dispatch(client, event)
            except Exception:
                log.exception("emulator: error handling %s", event.type)
            client.collector.pop()
        self._flush(client)

    def _dispatch(self, client: _Client, event: Event) -> None:
        kind = event.type
        if kind == Event.CONNECTION_REMOTE_OPEN:
            connection = _present(event.connection)
            connection.container = "weirflow-eventhubs-emulator"
            connection.open()
        elif kind == Event.SESSION_REMOTE_OPEN:
            _present(event.session).open()
        elif kind == Event.LINK_REMOTE_OPEN:
            self._open_link(client, _present(event.link))
        elif kind == Event.LINK_FLOW:
            flowed = _present(event.link)
            if flowed.is_sender:
                self._pump_link(flowed)
        elif kind == Event.DELIVERY:
            self._delivery(_present(event.delivery))
        elif kind == Event.LINK_REMOTE_CLOSE:
            closed = _present(event.link)
            self._consumers = [c for c in self._consumers if c.link != closed]
            closed.close()
        elif kind == Event.SESSION_REMOTE_CLOSE:
            _present(event.session).close()
        elif kind == Event.CONNECTION_REMOTE_CLOSE:
            _present(event.connection).close()

    def _open_link(self, client: _Client, link: Any) -> None:
        link.source.copy(link.remote_source)
        link.target.copy(link.remote_target)
        link.max_message_size = MAX_MESSAGE_SIZE
        if link.is_receiver:  # the client sends: to $cbs, $management or a hub
            address = link.remote_target.address or ""
            link.open()
            if address not in ("$cbs", "$management"):
                match = _PATH.match(address)
                if not match or self.store.hub(match["hub"]) is None:
                    self._refuse(link, "amqp:not-found", f"The messaging entity '{address}' could not be found.")
                    return
            link.flow(PUBLISH_CREDIT)
            return
        address = link.remote_source.address or ""
        if address in ("$cbs", "$management"):
            link.open()
            return
        match = _PATH.match(address)
        hub = self.store.hub(match["hub"]) if match else None
        if (
            match is None
            or hub is None
            or match["group"] is None
            or match["p"] is None
            or int(match["p"]) >= len(hub.partitions)
        ):
            link.open()
            self._refuse(link, "amqp:not-found", f"The messaging entity '{address}' could not be found.")
            return
        partition = int(match["p"])
        try:
            index = start_index(hub, partition, _selector(link))
        except FilterError as exc:
            link.open()
            self._refuse(link, "amqp:invalid-field", str(exc))
            return
        epoch = _epoch(link)
        rivals = [
            c for c in self._consumers if (c.hub, c.group, c.partition) == (hub.name, match["group"], partition)
        ]
        if epoch is None and any(c.epoch is not None for c in rivals):
            link.open()
            self._refuse(link, "amqp:link:stolen", "a receiver with an epoch holds this partition")
            return
        if epoch is not None:
            if any(c.epoch is not None and c.epoch > epoch for c in rivals):
                link.open()
                self._refuse(link, "amqp:link:stolen", f"a receiver with a higher epoch than {epoch} exists")
                return
            for rival in rivals:  # as the service does: an equal or higher epoch takes over
                if rival.epoch is None or rival.epoch <= epoch:
                    self._consumers.remove(rival)
                    self._refuse(
                        rival.link,
                        "amqp:link:stolen",
                        f"New receiver with higher epoch of '{epoch}' is created hence current receiver with "
                        f"epoch '{rival.epoch}' is getting disconnected.",
                    )
                    self._flush(rival.client)
        link.open()
        self._consumers.append(Consumer(link, client, hub.name, match["group"], partition, index, epoch))

    @staticmethod
    def _refuse(link: Any, condition: str, description: str) -> None:
        link.condition = Condition(condition, description)
        link.close()

    # --- deliveries ---------------------------------------------------------------------------------------
    def _delivery(self, delivery: Delivery) -> None:
        link = delivery.link
        if link.is_sender:
            if delivery.updated:
                delivery.settle()
            return
        if not delivery.readable or delivery.partial:
            return
        data = link.recv(delivery.pending)
        link.advance()
        assert data is not None, "a readable, complete delivery holds its bytes"
        address = link.remote_target.address or ""
        outcome = Delivery.ACCEPTED
        if address == "$cbs":
            self._cbs(link, data)
        elif address == "$management":
            self._management(link, data)
        else:
            outcome = self._publish(address, data)
        delivery.update(outcome)
        delivery.settle()
        if link.credit < PUBLISH_CREDIT // 2:
            link.flow(PUBLISH_CREDIT - link.credit)

    def _reply_link(self, session: Any, address: str) -> Any:
        link = session.connection.link_head(0)
        while link is not None:
            if link.session == session and link.is_sender and (link.remote_source.address or "") == address:
                return link
            link = link.next(0)
        return None

    def _send_reply(self, request_link: Any, address: str, message: Message) -> None:
        link = self._reply_link(request_link.session, address)
        if link is None:
            log.warning("no %s reply link on the session", address)
            return
        delivery = link.delivery(str(time.monotonic_ns()))
        link.send(message.encode())
        link.advance()
        delivery.settle()

    def _cbs(self, link: Any, data: bytes) -> None:
        request = Message()
        request.decode(data)
        self._send_reply(link, "$cbs", reply(request.id, 202, "Accepted"))

    def _management(self, link: Any, data: bytes) -> None:
        request = Message()
        request.decode(data)
        properties: dict[Any, Any] = request.properties or {}
        props = {str(k): v for k, v in properties.items()}
        self._send_reply(link, "$management", self._management_reply(request.id, props))

    def _management_reply(self, correlation_id: Any, props: dict[str, Any]) -> Message:
        if props.get("operation") != "READ":
            return reply(correlation_id, 400, f"unsupported operation {props.get('operation')!r}")
        hub = self.store.hub(str(props.get("name")))
        if hub is None:
            return reply(correlation_id, 404, f"The messaging entity '{props.get('name')}' could not be found.")
        if props.get("type") == "com.microsoft:eventhub":
            body = {
                "name": hub.name,
                "created_at": timestamp(hub.created_ms),
                "partition_count": len(hub.partitions),
                "partition_ids": [str(p) for p in range(len(hub.partitions))],
            }
            return reply(correlation_id, 200, "OK", body)
        if props.get("type") == "com.microsoft:partition":
            try:
                requested: Any = props.get("partition")  # any AMQP value: int() refuses the wrong ones
                partition = int(requested)
                events = hub.partitions[partition].events
            except (TypeError, ValueError, IndexError):
                return reply(correlation_id, 404, f"partition {props.get('partition')!r} of {hub.name} not found")
            with self.store.lock:
                last = events[-1] if events else None
            body = {
                "name": hub.name,
                "partition": str(partition),
                "begin_sequence_number": 0,
                "last_enqueued_sequence_number": last.sequence_number if last else -1,
                "last_enqueued_offset": str(last.offset) if last else "-1",
                "last_enqueued_time_utc": timestamp(last.enqueued_ms if last else 0),
                "is_partition_empty": last is None,
            }
            return reply(correlation_id, 200, "OK", body)
        return reply(correlation_id, 400, f"unsupported type {props.get('type')!r}")

    def _publish(self, address: str, data: bytes) -> Any:
        match = _PATH.match(address)
        hub = self.store.hub(match["hub"]) if match else None
        if match is None or hub is None:
            return Delivery.REJECTED
        key, events = split_batch(data)
        if match["p"] is not None:
            partition = int(match["p"])
            if partition >= len(hub.partitions):
                return Delivery.REJECTED
        elif key is not None:
            partition = partition_for_key(key, len(hub.partitions))
        else:
            if hub.name not in self._round_robin:  # a hub added while running
                self._round_robin[hub.name] = itertools.cycle(range(len(hub.partitions)))
            partition = next(self._round_robin[hub.name])
        for message in events:
            self.store.append(hub.name, partition, message, key)
        for consumer in self._consumers:
            if consumer.hub == hub.name and consumer.partition == partition:
                self._pump(consumer)
        return Delivery.ACCEPTED

    # --- consumers ----------------------------------------------------------------------------------------
    def _pump_link(self, link: Any) -> None:
        for consumer in self._consumers:
            if consumer.link == link:
                self._pump(consumer)
                return

    def _pump(self, consumer: Consumer) -> None:
        link = consumer.link
        events = self.store.hubs[consumer.hub].partitions[consumer.partition].events
        while link.credit > 0 and consumer.next_index < len(events):
            event = events[consumer.next_index]
            delivery = link.delivery(str(next(consumer.tags)))
            link.send(event.wire)
            link.advance()
            delivery.settle()
            consumer.next_index += 1
        self._sent_to.add(consumer.client)


def _selector(link: Any) -> str | None:
    data = link.remote_source.filter
    if data is None:
        return None
    data.rewind()
    if not data.next():
        return None
    filters = data.get_object()
    if not isinstance(filters, dict):
        return None
    for value in filters.values():
        text = getattr(value, "value", value)
        if isinstance(text, str):
            return text
    return None


def _epoch(link: Any) -> int | None:
    props = link.remote_properties or {}
    for key, value in props.items():
        if str(key) == str(EPOCH):
            return int(value)
    return None
