"""The local Event Hubs emulator: an AMQP 1.0 server that the unmodified ``azure-eventhub`` SDK talks to, for
tests, benchmarks and laptops (``weirflow emulator eventhubs``). Not a production broker.

It needs the Qpid Proton engine, which only the ``emulator`` extra installs (``pip install
'weirflow[emulator]'``); a production install (``weirflow[azure]``) carries no AMQP server. Import
`weirflow_azure.eventhubs.emulator.server` for `EventHubsEmulator`.
"""

INSTALL_HINT = "pip install 'weirflow[emulator]' (or, in a checkout of weirflow, `make install`)"
