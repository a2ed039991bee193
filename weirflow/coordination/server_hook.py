"""What a `StreamProcessor` runs beside itself to serve its state over the network, seen from coordination.

Coordination knows no HTTP (docs/architecture.md): the processor takes a `ServerFactory`, calls it once its
runner exists and stops what it returned when the processor has stopped. `weirflow run` passes the endpoints'
(`weirflow.endpoints.processor_server`), which read the processor's plain state (`state`, `leading`,
`working_version`, `lease_renewals`, `owner_of`, `runner`, `ctx`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from weirflow.coordination.processor import StreamProcessor


class ProcessorServer(Protocol):
    """A running server: ``url`` goes into the processor's registry row (its ``endpoint``)."""

    url: str

    def stop(self) -> None: ...


#: Starts the processor's server (None: it runs none, e.g. with ``endpoints.enabled`` off).
ServerFactory = Callable[["StreamProcessor"], ProcessorServer | None]
