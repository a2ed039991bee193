"""A third party's backend runs the contract suite through the public hook alone.

This module plays a plugin author outside the project: an in-memory implementation of weirflow's interfaces
(coordination, checkpoints, metadata, a system), written against `weirflow.interfaces` only, and tested with
nothing but `weirflow.testing` and a ``weirflow_backend`` fixture. Its state lives in one process, so it sets
``processes = False`` and the two cross-process contracts are skipped (with the reason) rather than failed.

The last test runs the example of docs/testing-backends.md as written, from an empty directory outside the
repository, as a plugin's own test suite would run.
"""

from __future__ import annotations

import itertools
import re
import subprocess
import sys
import time
import zlib
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from weirflow.base.errors import EtagMismatchError, FencedOffError, StreamExistsError, StreamNotFoundError
from weirflow.interfaces import (
    Checkpoint,
    CheckpointManager,
    CoordinationUtils,
    Document,
    IncomingRecord,
    Latch,
    LatchState,
    LeaderElector,
    Lock,
    MetadataStore,
    OutgoingRecord,
    PartitionMetadata,
    ProcessorInfo,
    ProcessorRegistry,
    StreamSpec,
    SystemAdmin,
    SystemConsumer,
    SystemProducer,
    SystemStreamPartition,
)
from weirflow.testing import (
    Backend,
    CheckpointManagerContract,
    JobCoordinatorContract,
    MetadataStoreContract,
    SystemClients,
    SystemContract,
)


# --- the "plugin": everything of one job in one object ----------------------------------------------------
@dataclass
class JobState:
    leases: dict[str, tuple[str, float]] = field(default_factory=dict)  # name -> (holder, monotonic expiry)
    epochs: dict[str, int] = field(default_factory=dict)  # name -> the last epoch given out
    latches: dict[str, tuple[LatchState, set[str]]] = field(default_factory=dict)
    processors: dict[str, ProcessorInfo] = field(default_factory=dict)
    checkpoints: dict[str, Checkpoint] = field(default_factory=dict)
    documents: dict[str, Document] = field(default_factory=dict)
    etags: itertools.count = field(default_factory=itertools.count)

    def holder(self, name: str) -> str | None:
        owner, expires = self.leases.get(name, (None, 0.0))
        return owner if expires > time.monotonic() else None

    def take(self, name: str, owner: str, lease_ms: int, renew_only: bool = False) -> bool:
        """``owner`` is the holder: the processor id and its instance."""
        holder = self.holder(name)
        if holder != owner and (renew_only or holder is not None):
            return False
        if holder != owner:
            self.epochs[name] = self.epochs.get(name, 0) + 1
        self.leases[name] = (owner, time.monotonic() + lease_ms / 1000)
        return True

    def release(self, name: str, owner: str) -> None:
        if self.holder(name) == owner:
            del self.leases[name]


class MemoryLock(Lock):
    def __init__(
        self, job: JobState, name: str, owner: str, lease_ms: int, lease: str | None = None, instance: str = ""
    ) -> None:
        self.job, self.name, self.owner, self.lease_ms, self.instance = job, name, owner, lease_ms, instance
        self.lease = lease or f"locks/{name}"
        self.holder = f"{owner}#{instance}"
        self.epoch = 0

    def try_acquire(self) -> bool:
        taken = self.job.take(self.lease, self.holder, self.lease_ms)
        if taken:
            self.epoch = self.job.epochs[self.lease]
        return taken

    def renew(self) -> bool:
        return self.job.take(self.lease, self.holder, self.lease_ms, renew_only=True)

    def release(self) -> None:
        self.job.release(self.lease, self.holder)

    def is_held(self) -> bool:
        return self.job.holder(self.lease) == self.holder

    def is_held_in(self, epoch: int) -> bool:
        return self.is_held() and self.job.epochs.get(self.lease) == epoch


class MemoryLeaderElector(LeaderElector):
    def __init__(self, job: JobState, owner: str, lease_ms: int, instance: str = "") -> None:
        self.lease = MemoryLock(job, "leader", owner, lease_ms, lease="leader", instance=instance)
        self._leader = False

    def try_become_leader(self) -> bool:
        self._leader = self.lease.try_acquire()
        return self._leader

    def renew(self) -> bool:
        self._leader = self.lease.renew()
        return self._leader

    def resign(self) -> None:
        self.lease.release()
        self._leader = False

    @property
    def is_leader(self) -> bool:
        return self._leader

    def current_leader(self) -> str | None:
        holder = self.lease.job.holder(self.lease.lease)
        return holder.split("#")[0] if holder else None


class MemoryLatch(Latch):
    def __init__(self, job: JobState, name: str) -> None:
        self.job, self.name = job, name
        job.latches.setdefault(name, (LatchState.OPEN, set()))

    def _finish(self, state: LatchState) -> None:
        current, participants = self.job.latches[self.name]
        if current is LatchState.OPEN:
            self.job.latches[self.name] = (state, participants)

    def join(self, participant: str) -> None:
        self.job.latches[self.name][1].add(participant)

    def participants(self) -> set[str]:
        return set(self.job.latches[self.name][1])

    def complete(self) -> None:
        self._finish(LatchState.COMPLETE)

    def time_out(self) -> None:
        self._finish(LatchState.TIMED_OUT)

    def state(self) -> LatchState:
        return self.job.latches[self.name][0]


class MemoryProcessorRegistry(ProcessorRegistry):
    def __init__(self, job: JobState) -> None:
        self.job = job

    def heartbeat(self, info: ProcessorInfo) -> None:
        self.job.processors[info.processor_id] = ProcessorInfo.from_json(info.to_json())

    def processors(self) -> list[ProcessorInfo]:
        return [self.job.processors[pid] for pid in sorted(self.job.processors)]

    def unregister(self, processor_id: str) -> None:
        self.job.processors.pop(processor_id, None)


class MemoryCoordinationUtils(CoordinationUtils):
    def __init__(self, job: JobState, owner: str, lease_ms: int, instance: str = "") -> None:
        self.job, self.owner, self.lease_ms, self.instance = job, owner, lease_ms, instance

    def leader_elector(self) -> LeaderElector:
        return MemoryLeaderElector(self.job, self.owner, self.lease_ms, self.instance)

    def lock(self, name: str) -> Lock:
        return MemoryLock(self.job, name, self.owner, self.lease_ms, instance=self.instance)

    def latch(self, name: str) -> Latch:
        return MemoryLatch(self.job, name)

    def processor_registry(self) -> ProcessorRegistry:
        return MemoryProcessorRegistry(self.job)


class MemoryCheckpointManager(CheckpointManager):
    def __init__(self, job: JobState) -> None:
        self.job = job

    def write_checkpoint(self, task_name: str, checkpoint: Checkpoint) -> None:
        stored = self.job.checkpoints.get(task_name, Checkpoint({}))
        if checkpoint.epoch < stored.epoch:  # the fence, atomic here because nothing else runs in between
            raise FencedOffError(task_name, checkpoint.epoch, stored.epoch)
        self.job.checkpoints[task_name] = Checkpoint(
            {**stored.offsets, **checkpoint.offsets},
            dict(checkpoint.control or stored.control),
            epoch=max(checkpoint.epoch, stored.epoch),
        )

    def read_last_checkpoint(self, task_name: str) -> Checkpoint | None:
        return self.job.checkpoints.get(task_name)

    def read_all(self) -> dict[str, Checkpoint]:
        return dict(self.job.checkpoints)


class MemoryMetadataStore(MetadataStore):
    def __init__(self, job: JobState) -> None:
        self.job = job

    def _check(self, key: str, if_match: str | None, if_none_match: bool) -> None:
        stored = self.job.documents.get(key)
        if (if_none_match and stored is not None) or (
            if_match is not None and (stored is None or stored.etag != if_match)
        ):
            raise EtagMismatchError(key, if_match)

    def get(self, key: str) -> Document | None:
        return self.job.documents.get(key)

    def put(
        self, key: str, value: dict[str, Any], *, if_match: str | None = None, if_none_match: bool = False
    ) -> str:
        self._check(key, if_match, if_none_match)
        etag = str(next(self.job.etags))
        self.job.documents[key] = Document(key, dict(value), etag)
        return etag

    def delete(self, key: str, *, if_match: str | None = None) -> None:
        self._check(key, if_match, False)
        self.job.documents.pop(key, None)

    def list(self, prefix: str = "") -> list[Document]:
        return [doc for key, doc in sorted(self.job.documents.items()) if key.startswith(prefix)]


# A stream: per partition, its records as (key, value, timestamp_ms); a record's offset is its index.
Streams = dict[str, list[list[tuple[bytes | None, bytes, int]]]]


def _partitions(streams: Streams, stream: str) -> list[list[tuple[bytes | None, bytes, int]]]:
    if stream not in streams:
        raise StreamNotFoundError(f"stream '{stream}' does not exist")
    return streams[stream]


class MemorySystemAdmin(SystemAdmin):
    def __init__(self, streams: Streams) -> None:
        self.streams = streams

    def partition_count(self, stream: str) -> int:
        return len(_partitions(self.streams, stream))

    def partition_metadata(self, stream: str) -> dict[int, PartitionMetadata]:
        return {
            p: PartitionMetadata("0", str(len(records) - 1) if records else None, str(len(records)))
            for p, records in enumerate(_partitions(self.streams, stream))
        }

    def create_stream(self, spec: StreamSpec) -> bool:
        if spec.stream in self.streams:
            if len(self.streams[spec.stream]) != spec.partitions:
                raise StreamExistsError(f"stream '{spec.stream}' has {len(self.streams[spec.stream])} partitions")
            return False
        self.streams[spec.stream] = [[] for _ in range(spec.partitions)]
        return True

    def list_streams(self) -> dict[str, int]:
        return {name: len(partitions) for name, partitions in self.streams.items()}

    def offset_for_time(self, stream: str, partition: int, timestamp_ms: int) -> str:
        records = _partitions(self.streams, stream)[partition]
        return str(next((i for i, (_, _, ts) in enumerate(records) if ts >= timestamp_ms), len(records)))


class MemorySystemConsumer(SystemConsumer):
    def __init__(self, streams: Streams) -> None:
        self.streams = streams

    def read(
        self, ssp: SystemStreamPartition, start: str, max_records: int, end: str | None = None
    ) -> list[IncomingRecord]:
        records = _partitions(self.streams, ssp.stream)[ssp.partition]
        stop = min(len(records), int(start) + max_records, len(records) if end is None else int(end))
        return [IncomingRecord(ssp, str(i), str(i + 1), *records[i]) for i in range(int(start), stop)]


class MemorySystemProducer(SystemProducer):
    def __init__(self, streams: Streams) -> None:
        self.streams = streams
        self.round_robin = itertools.count()

    def send(self, records: Sequence[OutgoingRecord]) -> None:
        for record in records:
            _partitions(self.streams, record.stream)  # nothing is written unless every stream exists
        for record in records:
            partitions = self.streams[record.stream]
            if record.partition is not None:
                partition = record.partition
            elif record.key is not None:
                partition = zlib.crc32(record.key) % len(partitions)
            else:
                partition = next(self.round_robin) % len(partitions)
            partitions[partition].append((record.key, record.value, time.time_ns() // 1_000_000))


# --- the hook: all a third party writes to run the suite --------------------------------------------------
class MemoryBackend(Backend):
    processes = False  # its state lives in this process: the cross-process contracts are skipped

    def __init__(self) -> None:
        self.jobs: defaultdict[str, JobState] = defaultdict(JobState)
        self.streams: Streams = {}

    def coordination(self, job: str, owner: str, lease_ms: int, instance: str = "") -> CoordinationUtils:
        return MemoryCoordinationUtils(self.jobs[job], owner, lease_ms, instance)

    def checkpoint_manager(self, job: str) -> CheckpointManager:
        return MemoryCheckpointManager(self.jobs[job])

    def metadata_store(self, job: str) -> MetadataStore:
        return MemoryMetadataStore(self.jobs[job])

    def system(self) -> SystemClients:
        streams = self.streams
        return SystemClients(
            "memory", MemorySystemAdmin(streams), MemorySystemConsumer(streams), MemorySystemProducer(streams)
        )


@pytest.fixture
def weirflow_backend() -> Backend:
    return MemoryBackend()


class TestMemoryCoordinator(JobCoordinatorContract):
    pass


class TestMemoryCheckpoints(CheckpointManagerContract):
    pass


class TestMemoryMetadata(MetadataStoreContract):
    pass


class TestMemorySystem(SystemContract):
    pass


def test_a_backend_without_a_hook_fails_naming_it() -> None:
    with pytest.raises(NotImplementedError, match=r"Backend\.metadata_store"):
        Backend().metadata_store("job")


DOC = Path(__file__).resolve().parents[2] / "docs" / "testing-backends.md"


def test_the_documented_example_runs_from_a_directory_outside_the_repository(tmp_path: Path) -> None:
    text = DOC.read_text()
    files = dict(re.findall(r"```python\n# (\w+\.py)\n(.*?)```", text, re.DOTALL))
    assert set(files) == {"conftest.py", "test_contracts.py"}, "the page's example changed shape"
    for name, source in files.items():
        (tmp_path / name).write_text(source)
    (claimed,) = re.findall(r"^(\d+) passed", text, re.MULTILINE)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert re.search(rf"^{claimed} passed", done.stdout.splitlines()[-1]), done.stdout.splitlines()[-1]
