"""The ``kinesis`` alias: `systems.<name>.factory: kinesis` (extra ``weirflow[kinesis]``, boto3)."""

from __future__ import annotations

from weirflow.interfaces.config import ConfigView
from weirflow.interfaces.system import SystemAdmin, SystemConsumer, SystemFactory, SystemProducer
from weirflow_kinesis.clients import (
    KinesisClients,
    KinesisSystemAdmin,
    KinesisSystemConsumer,
)
from weirflow_kinesis.producer import KinesisSystemProducer
from weirflow_kinesis.settings import KinesisSettings


class KinesisSystemFactory(SystemFactory):
    def _clients(self, system_name: str, config: ConfigView) -> KinesisClients:
        return KinesisClients(KinesisSettings.from_config(system_name, config))

    def get_admin(self, system_name: str, config: ConfigView) -> SystemAdmin:
        return KinesisSystemAdmin(self._clients(system_name, config))

    def get_consumer(self, system_name: str, config: ConfigView) -> SystemConsumer:
        return KinesisSystemConsumer(self._clients(system_name, config))

    def get_producer(self, system_name: str, config: ConfigView) -> SystemProducer:
        return KinesisSystemProducer(self._clients(system_name, config))
