"""MetadataStore contract (`weirflow.testing.contracts.metadata_store`) on each backend."""

from weirflow.testing import MetadataStoreContract


class TestMetadataStore(MetadataStoreContract):
    pass
