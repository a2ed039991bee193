"""ProcessorRegistry contract (`weirflow.testing.contracts.processor_registry`) on each backend."""

from weirflow.testing import ProcessorRegistryContract


class TestProcessorRegistry(ProcessorRegistryContract):
    pass
