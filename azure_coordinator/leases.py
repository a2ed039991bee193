"""Leader election and task locks on blob leases.

Each lease is a zero-byte block blob in the job's container (``leases/leader``, ``leases/locks/<name>``);
Blob Storage itself guarantees that at most one lease id holds it, and expires a lease that is not renewed
within its duration. Blob leases last 15 to 60 whole seconds, so ``job.coordinator.lease.duration.ms`` must
lie in that range with this coordinator.

The lease id is derived from the holder (a UUID5 of container, blob, owner and instance): any object of the
same holder recognises the lease as its own, so acquiring again is re-entrant; another run of a processor
with the same ``processor.id`` has another instance, hence another lease id, and cannot take or renew the
lease before it expires. The holder and the tenure's **epoch** (the fencing token, `Lock.epoch`) are written
to the blob's metadata under the lease, which is how `current_leader` answers without knowing anyone's lease
id, and how the next holder finds the epoch to exceed.

Loss is detected on every call that presents the lease id: a renew, or the fence ``is_held``, which reads the
blob's properties *under the lease* — Blob Storage answers 412 unless the lease is active and ours.
"""

from __future__ import annotations

import uuid
from typing import Any

from azure.core import MatchConditions
from azure.core.exceptions import HttpResponseError, ResourceExistsError, ResourceNotFoundError
from azure.storage.blob import BlobLeaseClient

from weirflow_azure.coordinator.storage import Storage

LEADER_BLOB = "leases/leader"
LOCK_PREFIX = "leases/locks/"
MIN_LEASE_MS = 15_000
MAX_LEASE_MS = 60_000
_LOST = (409, 412)  # lease present / lease id mismatch / lease not present


def lease_seconds(lease_ms: int) -> int:
    """Blob leases are whole seconds in [15, 60]."""
    if not (MIN_LEASE_MS <= lease_ms <= MAX_LEASE_MS) or lease_ms % 1000:
        raise ValueError(
            f"blob leases last 15 to 60 whole seconds, not {lease_ms} ms: set job.coordinator.lease.duration.ms "
            "between 15000 and 60000"
        )
    return lease_ms // 1000


class BlobLease:
    """One blob, one owner's lease id: the `weirflow.interfaces.leases.Lease` behind the leader election and
    task locks (`LeaseLeaderElector`, `LeaseLock`)."""

    def __init__(self, storage: Storage, blob_name: str, owner: str, lease_ms: int, instance: str = "") -> None:
        self._storage = storage
        self.blob_name = blob_name
        self.owner = owner
        self.instance = instance
        self.duration_s = lease_seconds(lease_ms)
        holder = f"{owner}#{instance}" if instance else owner
        self.lease_id = str(
            uuid.uuid5(uuid.NAMESPACE_URL, f"weirflow:{storage.settings.container}/{blob_name}:{holder}")
        )
        self.epoch = 0
        self._blob_client: Any = None

    @property
    def _blob(self) -> Any:
        if self._blob_client is None:
            self._blob_client = self._storage.container.get_blob_client(self.blob_name)
        return self._blob_client

    def _call(self, operation: str, fn: Any) -> Any:
        return self._storage.call(
            operation, f"{self._storage.settings.container}/{self.blob_name}", self._storage.blob_endpoint, fn
        )

    def acquire(self) -> bool:
        def attempt() -> bool:
            try:
                # leased before our acquire succeeds: by us (our lease id), so the same tenure goes on
                state = self._blob.get_blob_properties().lease.state
                self._blob.acquire_lease(lease_duration=self.duration_s, lease_id=self.lease_id)
            except ResourceNotFoundError:
                try:
                    self._blob.upload_blob(b"", overwrite=False)
                except ResourceExistsError:
                    pass  # created by a competitor a moment ago
                return attempt()
            except HttpResponseError as exc:
                if exc.status_code in _LOST:
                    return False
                raise
            self._take_epoch(reentrant=state == "leased")
            return True

        return bool(self._call("acquire lease on", attempt))

    def _take_epoch(self, reentrant: bool) -> None:
        """Under the lease just acquired: keep the epoch if this holder already had the lease (a re-entrant
        acquire: it was leased, by us, and the blob's metadata names us), else write the next one, also when
        the same holder takes the lease back after a release or an expiry (its old tenure's writers must be
        refused: `Lock.is_held_in`). Only the lease holder can write the metadata."""
        metadata = self._blob.get_blob_properties(lease=self.lease_id).metadata or {}
        stored = int(metadata.get("epoch") or 0)
        ours = metadata.get("owner") == self.owner and metadata.get("instance", "") == self.instance
        if reentrant and ours and stored:
            self.epoch = stored
            return
        self.epoch = stored + 1
        self._blob.set_blob_metadata(
            {"owner": self.owner, "instance": self.instance, "epoch": str(self.epoch)}, lease=self.lease_id
        )

    def renew(self) -> bool:
        def attempt() -> bool:
            try:
                BlobLeaseClient(self._blob, lease_id=self.lease_id).renew()
            except (ResourceNotFoundError, HttpResponseError) as exc:
                if isinstance(exc, ResourceNotFoundError) or exc.status_code in _LOST:
                    return False
                raise
            return True

        return bool(self._call("renew lease on", attempt))

    def release(self) -> None:
        def attempt() -> None:
            try:
                BlobLeaseClient(self._blob, lease_id=self.lease_id).release()
            except (ResourceNotFoundError, HttpResponseError) as exc:
                if isinstance(exc, ResourceNotFoundError) or exc.status_code in _LOST:
                    return  # not ours (any more): nothing to release
                raise

        self._call("release lease on", attempt)

    def held(self, epoch: int | None = None) -> bool:
        def attempt() -> bool:
            try:
                props = self._blob.get_blob_properties(lease=self.lease_id)
            except (ResourceNotFoundError, HttpResponseError) as exc:
                if isinstance(exc, ResourceNotFoundError) or exc.status_code in _LOST:
                    return False
                raise
            return epoch is None or int((props.metadata or {}).get("epoch") or 0) == epoch

        return bool(self._call("check lease on", attempt))

    def break_if_held_by(self, owner: str, instance: str) -> bool:
        """Break the lease at once (break period 0) if the blob's metadata names (``owner``, ``instance``) as the
        holder of the active lease; conditional on the blob's ETag read with that metadata, so a tenure begun
        since (a new holder writes its epoch, which changes the ETag) is never broken."""

        def attempt() -> bool:
            try:
                props = self._blob.get_blob_properties()
            except ResourceNotFoundError:
                return False
            metadata = props.metadata or {}
            if (
                props.lease.state != "leased"
                or metadata.get("owner") != owner
                or metadata.get("instance", "") != instance
            ):
                return False
            try:
                BlobLeaseClient(self._blob).break_lease(
                    lease_break_period=0, etag=props.etag, match_condition=MatchConditions.IfNotModified
                )
            except (ResourceNotFoundError, HttpResponseError) as exc:
                if isinstance(exc, ResourceNotFoundError) or exc.status_code in _LOST:
                    return False
                raise
            return True

        return bool(self._call("break lease on", attempt))

    def holder(self) -> str | None:
        def attempt() -> str | None:
            try:
                props = self._blob.get_blob_properties()
            except ResourceNotFoundError:
                return None
            if props.lease.state != "leased":
                return None
            return props.metadata.get("owner") or None

        return self._call("read lease of", attempt)
