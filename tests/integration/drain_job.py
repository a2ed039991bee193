"""What the drain tests share (docs/drain.md): a steady feed of page views into the unbounded input, and the
checks that a drain stopped the two-stage example at a cut with nothing in flight.

The cut is read back from the drained checkpoints of the first stage's tasks (their input offsets), and the
input itself from the stream, so "the input up to the cut" is exactly the records at offsets below it.
"""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from tests.integration.example_job import generate, results
from weirflow.interfaces.system import OutgoingRecord, StreamSpec, SystemStreamPartition
from weirflow.job.context import JobContext
from weirflow.job.drain_notice import DrainUtils
from weirflow.job.systems import Systems, dead_letter_stream


class Feeder:
    """Writes the example's page views to `page-views` at ``rate`` events per second from a thread, in 20
    sends a second, until stopped: the unbounded input of a running job."""

    def __init__(self, config: Any, rate: int, seed: int = 11) -> None:
        self.config = config
        self.rate = rate
        self.seed = seed
        self.sent = 0
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="feeder", daemon=True)

    def create_stream(self) -> Feeder:
        """Create `page-views` if it does not exist yet (`start` does it too): a test can create the input before
        its processors start and begin the feed only once they run."""
        systems = Systems(self.config)
        try:
            ref = systems.resolve("page-views")
            partitions = int(self.config.get("streams.page-views.partitions") or 4)
            systems.admin(ref.system).create_stream(StreamSpec(ref.physical, partitions))
        finally:
            systems.close()
        return self

    def start(self) -> Feeder:
        self.create_stream()
        self._thread.start()
        return self

    def _run(self) -> None:
        systems = Systems(self.config)
        try:
            ref = systems.resolve("page-views")
            producer = systems.producer(ref.system)
            events = generate.events(10**9, self.seed)
            step = max(1, self.rate // 20)
            began = time.monotonic()
            while not self._stop.is_set():
                batch = [next(events) for _ in range(step)]
                producer.send(
                    [OutgoingRecord(ref.physical, json.dumps(e).encode(), key=e["user"].encode()) for e in batch]
                )
                self.sent += len(batch)
                ahead = self.sent / self.rate - (time.monotonic() - began)
                if ahead > 0:
                    self._stop.wait(ahead)
        except BaseException as exc:  # reported by stop()
            self.error = exc
        finally:
            systems.close()

    def stop(self) -> int:
        self._stop.set()
        self._thread.join(30)
        assert self.error is None, f"the feeder failed: {self.error!r}"
        return self.sent


def records(
    config: Any, stream_id: str, *, dead_letters: bool = False, to_upcoming: bool = True
) -> dict[int, list[bytes]]:
    """Every record value of ``stream_id`` (or of its dead-letter stream), per partition, in offset order
    (offsets are dense from 0 on the embedded log; on Event Hubs the adapter's offsets are dense sequence
    numbers too). Each partition is read up to its ``upcoming`` position as the read began; with
    ``to_upcoming=False``, until a read finds nothing more, for a job that has stopped writing on a system whose
    ``upcoming`` costs a probe per partition (Kinesis: a time mark)."""
    systems = Systems(config)
    try:
        ref = systems.resolve(stream_id)
        physical = dead_letter_stream(ref.physical) if dead_letters else ref.physical
        consumer = systems.consumer(ref.system)
        meta = systems.admin(ref.system).partition_metadata(physical)
        found: dict[int, list[bytes]] = {}
        for partition in sorted(meta):
            ssp = SystemStreamPartition(ref.system, physical, partition)
            values: list[bytes] = []
            offset = meta[partition].oldest
            end = meta[partition].upcoming if to_upcoming else None
            while batch := consumer.read(ssp, offset, 10_000, end):
                values += [r.value for r in batch]
                offset = batch[-1].next_offset
            found[partition] = values
        return found
    finally:
        systems.close()


def dead_letters(config: Any, stream_id: str = "page-views", *, to_upcoming: bool = True) -> list[dict[str, Any]]:
    """The dead letters of input ``stream_id`` (its ``.dlq`` stream), every partition, decoded."""
    letters = records(config, stream_id, dead_letters=True, to_upcoming=to_upcoming)
    return [json.loads(v) for values in letters.values() for v in values]


def drain_notices(config: Any) -> list[Any]:
    """The drain notifications in the job's metadata store."""
    ctx = JobContext.open(config, owner="test")
    try:
        return DrainUtils(ctx.metadata).all()
    finally:
        ctx.close()


def checkpoints(config: Any) -> dict[str, Any]:
    from weirflow.interfaces.plugins import checkpoint_factory

    manager = checkpoint_factory(config).get_checkpoint_manager(config)
    manager.start()
    try:
        return dict(manager.read_all())
    finally:
        manager.stop()


def input_cut(config: Any, states: dict[str, Any] | None = None) -> dict[int, int]:
    """Per input partition, the offset the first stage's tasks stopped at (their checkpointed next offset), in
    ``states`` (`checkpoints` read earlier) or in the checkpoints read now."""
    physical = config.get("streams.page-views.physical.name") or "page-views"
    return {
        ssp.partition: int(offset)
        for checkpoint in (checkpoints(config) if states is None else states).values()
        for ssp, offset in checkpoint.offsets.items()
        if ssp.stream == physical
    }


def split_at_cut(config: Any, cut: dict[int, int]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The input's events before the cut and from it on (undecodable records, which went to the dead-letter
    stream, left out)."""
    before: list[dict[str, Any]] = []
    after: list[dict[str, Any]] = []
    for partition, values in records(config, "page-views").items():
        events = [_event(v) for v in values]
        before += [e for e in events[: cut.get(partition, 0)] if e is not None]
        after += [e for e in events[cut.get(partition, 0) :] if e is not None]
    return before, after


def _event(value: bytes) -> dict[str, Any] | None:
    try:
        event = json.loads(value)
    except ValueError:
        return None
    if not isinstance(event, dict) or "page" not in event:
        return None
    try:  # a record whose event time does not parse went to the dead-letter stream too
        dt.datetime.fromisoformat(str(event.get("event_time")).replace("Z", "+00:00"))
    except ValueError:
        return None
    return event


def output_rows(config: Any, stream_id: str, *, to_upcoming: bool = True) -> list[dict[str, Any]]:
    found = records(config, stream_id, to_upcoming=to_upcoming)
    return [json.loads(v) for values in found.values() for v in values]


def window_counts_once(
    config: Any, stream_id: str = "page-counts", *, to_upcoming: bool = True
) -> tuple[dict[results.Window, int], list[Any]]:
    """(window -> views) from ``stream_id``, and the windows written more than once."""
    rows = output_rows(config, stream_id, to_upcoming=to_upcoming)
    keys = Counter((r["page"], r["window_start"][:16]) for r in rows)
    counts = {(r["page"], r["window_start"][:16]): int(r["views"]) for r in rows}
    return counts, [k for k, n in keys.items() if n > 1]


def unread_intermediate(config: Any, name: str = "views-by-page") -> dict[str, int]:
    """Per partition of the intermediate stream ``name`` (physically ``<job>-<job id>-<name>``), the records
    after the offset its consumer task checkpointed; {} when everything written was read."""
    physical = f"{config.get('job.name')}-{config.get('job.id')}-{name}"
    done = {
        ssp: int(offset)
        for checkpoint in checkpoints(config).values()
        for ssp, offset in checkpoint.offsets.items()
        if ssp.stream == physical
    }
    assert done, f"no task checkpointed a position in {physical}"
    systems = Systems(config)
    try:
        system = next(iter(done)).system
        meta = systems.admin(system).partition_metadata(physical)
        unread = {
            f"{physical}.{p}": int(m.upcoming) - done.get(SystemStreamPartition(system, physical, p), 0)
            for p, m in meta.items()
        }
        return {k: n for k, n in unread.items() if n}
    finally:
        systems.close()


def drain_command(config_path: Path, overrides: list[str], *extra: str, timeout_s: float = 300) -> Any:
    """Run `weirflow drain CONFIG [--set ...] EXTRA...` with this interpreter; returns the completed process."""
    args = [sys.executable, "-m", "weirflow", "drain", str(config_path)]
    for item in overrides:
        args += ["--set", item]
    return subprocess.run([*args, *extra], capture_output=True, text=True, timeout=timeout_s)


def intermediate_dead_letters(config: Any, name: str = "views-by-page") -> list[dict[str, Any]]:
    """The dead letters of the intermediate stream ``name`` (rows its consumer could not read), decoded."""
    physical = dead_letter_stream(f"{config.get('job.name')}-{config.get('job.id')}-{name}")
    systems = Systems(config)
    try:
        admin, consumer = systems.admin("local"), systems.consumer("local")
        if physical not in admin.list_streams():
            return []
        letters = []
        for partition, meta in admin.partition_metadata(physical).items():
            ssp, offset = SystemStreamPartition("local", physical, partition), meta.oldest
            while batch := consumer.read(ssp, offset, 10_000, meta.upcoming):
                letters += [json.loads(r.value) for r in batch]
                offset = batch[-1].next_offset
        return letters
    finally:
        systems.close()


def drain_messages(config: Any, name: str = "views-by-page") -> Counter[tuple[str, int]]:
    """How many DRAIN messages each producer task wrote to each partition of the intermediate stream ``name``."""
    from weirflow.runtime.control import ControlMessage, MessageType, decode, is_control

    physical = f"{config.get('job.name')}-{config.get('job.id')}-{name}"
    systems = Systems(config)
    try:
        admin, consumer = systems.admin("local"), systems.consumer("local")
        found: Counter[tuple[str, int]] = Counter()
        for partition, meta in admin.partition_metadata(physical).items():
            ssp, offset = SystemStreamPartition("local", physical, partition), meta.oldest
            while batch := consumer.read(ssp, offset, 10_000, meta.upcoming):
                for record in batch:
                    if is_control(record.value):
                        kind, message = decode(record.value)
                        if kind is MessageType.DRAIN and isinstance(message, ControlMessage):
                            found[(message.task_name, partition)] += 1
                offset = batch[-1].next_offset
        return found
    finally:
        systems.close()
