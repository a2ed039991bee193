"""The ``delta`` alias: `systems.<name>.factory: delta` (extra ``weirflow[delta]``, deltalake)."""

from __future__ import annotations

from weirflow.interfaces.config import ConfigView
from weirflow.interfaces.system import SystemAdmin, SystemConsumer, SystemFactory, SystemProducer
from weirflow.interfaces.table import TableWriter
from weirflow_delta.clients import DeltaSystemAdmin, DeltaSystemConsumer, DeltaSystemProducer
from weirflow_delta.reader import TableReader
from weirflow_delta.settings import DeltaSettings
from weirflow_delta.tables import DeltaTables
from weirflow_delta.writer import DeltaTableWriter


class DeltaSystemFactory(SystemFactory):
    def _tables(self, system_name: str, config: ConfigView) -> DeltaTables:
        return DeltaTables(DeltaSettings.from_config(system_name, config))

    def get_admin(self, system_name: str, config: ConfigView) -> SystemAdmin:
        return DeltaSystemAdmin(TableReader(self._tables(system_name, config)))

    def get_consumer(self, system_name: str, config: ConfigView) -> SystemConsumer:
        return DeltaSystemConsumer(TableReader(self._tables(system_name, config)))

    def get_producer(self, system_name: str, config: ConfigView) -> SystemProducer:
        return DeltaSystemProducer(DeltaTableWriter(self._tables(system_name, config)))

    def get_table_writer(self, system_name: str, config: ConfigView) -> TableWriter | None:
        return DeltaTableWriter(self._tables(system_name, config))
