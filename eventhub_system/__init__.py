"""Event Hubs as a weirflow system (`systems.<name>.factory: eventhub`) and its emulator.

See docs/eventhubs.md.
"""
