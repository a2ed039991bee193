"""A record-task processor commits while it reads a backlog, and a stop does not wait for the backlog's end.

Each partition's backlog (`PER_PARTITION` records) fits in one read (`task.poll.max.records`, 500) and takes
the slow record function 5 s; `task.commit.ms` is 200 ms, so a task must send and checkpoint about 25 times
inside that one read (docs/architecture.md, "Record tasks: commits and stops"). A runner that committed only
once per read wrote its first checkpoint, and its first output of a partition, only once that partition was
relayed to its end, and a SIGTERM waited for the rest of the read: both tests catch that by the state they
find, not by time.

Embedded SQLite backend and log: the cause lived in the record runner's loop, whatever the system.
"""

from __future__ import annotations

import json
import textwrap
from collections import Counter
from pathlib import Path

import pytest

from tests.integration.relay_job import SHORT_TIMINGS
from weirflow.config import load_config
from weirflow.interfaces.plugins import checkpoint_factory
from weirflow.interfaces.system import OutgoingRecord, StreamSpec, SystemStreamPartition
from weirflow.job.systems import Systems
from weirflow.local.launcher import ProcessorProcess, start_processor
from weirflow.testing import wait_until

pytestmark = pytest.mark.integration

PARTITIONS = 2
PER_PARTITION = 500
BACKLOG = PARTITIONS * PER_PARTITION

JOB = """
job: {name: commits}
task: {inputs: [events], function: "slow_relay:relay", commit.ms: 200}
streams:
  events: {partitions: 2}
  relayed: {partitions: 1}
"""

SLOW_RELAY = """
import time

def relay(record):
    time.sleep(0.01)  # not synchronisation: a slow function, so the backlog takes several commit intervals
    return [{"stream": "relayed", "value": {"p": record["partition"], "offset": int(record["offset"])}}]
"""


class Backlog:
    """A record-task job whose input holds `BACKLOG` records before any processor starts."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.config_path = root / "job.yaml"
        timings = "".join(f"{key}: {json.dumps(value)}\n" for key, value in SHORT_TIMINGS.items())
        self.config_path.write_text(textwrap.dedent(JOB) + timings)
        (root / "slow_relay.py").write_text(SLOW_RELAY)
        self.config = load_config(self.config_path)
        self.systems = Systems(self.config)
        admin = self.systems.admin("local")
        admin.create_stream(StreamSpec("events", PARTITIONS))
        admin.create_stream(StreamSpec("relayed", 1))
        self.systems.producer("local").send(
            [OutgoingRecord("events", b"x", partition=p) for p in range(PARTITIONS) for _ in range(PER_PARTITION)]
        )
        self.checkpoints = checkpoint_factory(self.config).get_checkpoint_manager(self.config)
        self.checkpoints.start()
        self.processes: list[ProcessorProcess] = []

    def start(self) -> ProcessorProcess:
        proc = start_processor(self.config_path, "p1", log_dir=self.root / "logs")
        self.processes.append(proc)
        return proc

    def relayed(self) -> list[tuple[int, int]]:
        """(partition, offset) of every input record relayed so far, in the order relayed."""
        ssp = SystemStreamPartition("local", "relayed", 0)
        found = self.systems.consumer("local").read(ssp, "0", BACKLOG * 10)
        return [(value["p"], value["offset"]) for value in (json.loads(r.value) for r in found)]

    def checkpointed(self) -> dict[int, int]:
        """Each partition's checkpointed offset (0 before its task checkpointed any)."""
        found = {}
        for p in range(PARTITIONS):
            checkpoint = self.checkpoints.read_last_checkpoint(f"main-{p}")
            offset = checkpoint.offsets.get(SystemStreamPartition("local", "events", p)) if checkpoint else None
            found[p] = int(offset) if offset is not None else 0
        return found

    def close(self) -> None:
        for proc in self.processes:
            if proc.alive():
                proc.kill()
            print(f"--- log of {proc.processor_id} (last 30 lines)")
            print("\n".join(proc.log_text().splitlines()[-30:]))
        self.checkpoints.stop()
        self.systems.close()


def per_partition(rows: list[tuple[int, int]]) -> dict[int, list[int]]:
    return {p: [offset for q, offset in rows if q == p] for p in range(PARTITIONS)}


def test_a_processor_killed_inside_a_backlog_had_checkpointed_what_it_relayed_and_a_restart_relays_the_rest(
    tmp_path: Path, measure
) -> None:
    job = Backlog(tmp_path)
    try:
        proc = job.start()
        wait_until(lambda: any(job.checkpointed().values()), 60, "a task to checkpoint", 0.05)
        proc.kill()
        at_kill, relayed = job.checkpointed(), per_partition(job.relayed())
        measure(f"killed at checkpoints {at_kill}, {sum(map(len, relayed.values()))} of {BACKLOG} relayed")
        for p in range(PARTITIONS):
            # every record before the checkpoint was relayed before the checkpoint was written
            assert relayed[p][: at_kill[p]] == list(range(at_kill[p])), f"partition {p}: checkpoint {at_kill[p]}"
            # the first checkpoint came while the backlog was being read, not once it was read to its end
            assert len(relayed[p]) < PER_PARTITION, f"partition {p} was relayed to its end before any checkpoint"

        job.start()  # the same processor id, restarted: it waits for the killed run's leases to expire
        everything = {(p, offset) for p in range(PARTITIONS) for offset in range(PER_PARTITION)}
        wait_until(lambda: set(job.relayed()) >= everything, 60, "every input record relayed", 0.2)
        counts = Counter(job.relayed())
        assert set(counts) == everything
        # at least once (record tasks): a record relayed twice is one sent after the checkpoint the kill left
        again = {(p, offset) for (p, offset), n in counts.items() if n > 1}
        assert all(offset >= at_kill[p] for p, offset in again), sorted(again)[:10]
        measure(f"after the restart: {len(again)} records relayed twice (all after the kill's checkpoints)")
    finally:
        job.close()


def test_a_sigterm_inside_a_backlog_stops_the_processor_without_reading_the_backlog_to_its_end(
    tmp_path: Path, measure
) -> None:
    job = Backlog(tmp_path)
    try:
        proc = job.start()
        wait_until(lambda: len(job.relayed()) > 0, 60, "an output", 0.05)
        assert proc.terminate(timeout_s=60) == 0, proc.log_text()[-3000:]
        relayed, checkpointed = per_partition(job.relayed()), job.checkpointed()
        measure(f"SIGTERMed inside a backlog of {BACKLOG}: stopped at checkpoints {checkpointed}")
        for p in range(PARTITIONS):
            assert len(relayed[p]) < PER_PARTITION, f"partition {p}: the stop waited for the rest of its read"
            # the final checkpoint is exactly what was relayed: sent before it, nothing sent after it
            assert relayed[p] == list(range(checkpointed[p])), f"partition {p}: checkpoint {checkpointed[p]}"
    finally:
        job.close()
