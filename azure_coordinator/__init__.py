"""The Azure job coordinator (``job.coordinator.factory: azure``): leader election and task locks on blob leases
(`leases`), latches and the processor registry in Table Storage (`latch`, `registry`), the metadata store
on block blobs with ETag conditions (`metadata`). `storage` holds what they share: auth, resource names and
the retry policy. Wiring: `factories`."""
