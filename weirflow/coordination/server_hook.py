"""What a `StreamProcessor` runs beside itself to serve its state over the network, seen from coordination.

Coordination knows no HTTP (docs/architecture.md): the processor takes a server factory
(`weirflow.coordination.processor.ServerFactory`), calls it once its runner exists and stops what it returned
when the processor has stopped. `weirflow run` passes the endpoints'
(`weirflow.endpoints.processor_server`), which read the processor's plain state (`state`, `leading`,
`working_version`, `lease_renewals`, `owner_of`, `runner`, `ctx`).
"""

from __future__ import annotations

from typing import Protocol


class ProcessorServer(Protocol):
    """A running server: ``url`` goes into the processor's registry row (its ``endpoint``)."""

    url: str

    def stop(self) -> None: ...
