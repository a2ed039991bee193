"""``weirflow emulator eventhubs``: run the local Event Hubs emulator (a development tool)."""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from typing import Annotated

import typer

emulator_app = typer.Typer(no_args_is_help=True, help="Local emulators of the services jobs use (development).")


def parse_hub(text: str) -> tuple[str, int]:
    name, _, count = text.partition(":")
    if not name or not count.isdigit() or int(count) < 1:
        raise typer.BadParameter(f"'{text}' is not NAME:PARTITIONS, e.g. page-views:4")
    return name, int(count)


@emulator_app.command("eventhubs")
def eventhubs(
    hub: Annotated[list[str], typer.Option("--hub", help="An event hub to serve, NAME:PARTITIONS (repeatable).")],
    port: Annotated[int, typer.Option(help="TCP port (0 = any free port).")] = 5672,
    host: Annotated[str, typer.Option(help="Interface to listen on.")] = "127.0.0.1",
    data_dir: Annotated[
        Path | None, typer.Option("--data-dir", help="Keep events in this directory across restarts.")
    ] = None,
) -> None:
    """Serve event hubs over AMQP to the unmodified azure-eventhub SDK; print the connection string.

    Not a production broker: no auth, no retention limit, no throttling. In memory unless --data-dir."""
    from weirflow_azure.eventhubs.emulator import INSTALL_HINT

    try:
        from weirflow_azure.eventhubs.emulator.server import EventHubsEmulator
    except ImportError as exc:
        typer.echo(f"error: the Event Hubs emulator is not installed ({exc}); {INSTALL_HINT}", err=True)
        raise typer.Exit(2) from exc

    hubs = dict(parse_hub(h) for h in hub)
    emulator = EventHubsEmulator(hubs, host=host, port=port, data_dir=data_dir)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    emulator.start()
    hubs_text = ", ".join(f"{n} ({c} partitions)" for n, c in hubs.items())
    where = f"events in {data_dir}" if data_dir else "events in memory"
    print(f"Event Hubs emulator on {emulator.host}:{emulator.port}: {hubs_text}; {where}", flush=True)
    print(emulator.connection_string(), flush=True)
    stop.wait()
    emulator.stop()
