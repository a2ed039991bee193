"""Record tasks on a busy Event Hubs partition stop promptly and checkpoint exactly what they relayed.

The SDK's receive loop hands events over only after `prefetch` frames or a pause in the stream; on a
partition that never pauses (here 20 events/s each, faster than the SDK's 0.2 s socket timeout) a large
prefetch held reads for prefetch / rate seconds, so a SIGTERMed processor outlived its task leases, its final
checkpoints were refused by the fence, and a restart replayed events. Counting proves the fix: after SIGTERM
the checkpoint of each partition is exactly the number of events relayed from it.
"""

from __future__ import annotations

import json
import signal
import textwrap
import threading
from pathlib import Path

import pytest
from azure.eventhub import EventData, EventHubProducerClient

from weirflow.config import load_config
from weirflow.interfaces.plugins import checkpoint_factory
from weirflow.interfaces.system import StreamSpec, SystemStreamPartition
from weirflow.job.systems import Systems
from weirflow.local.launcher import start_processor
from weirflow.testing import wait_until

pytestmark = pytest.mark.integration

JOB = """
job: {{name: ehrelay}}
task: {{inputs: [events], function: "relay_task:relay", commit.ms: 200}}
systems:
  eh: {{factory: eventhub, connection.string: "{cs}"}}
streams:
  events: {{system: eh, partitions: 2}}
  relayed: {{partitions: 1}}
"""

RELAY = """
def relay(record):
    return [{"stream": "relayed", "value": {"p": record["partition"], "offset": record["offset"]}}]
"""


def trickle(connection_string: str, stop: threading.Event) -> None:
    producer = EventHubProducerClient.from_connection_string(connection_string, eventhub_name="events")
    try:
        while not stop.wait(0.05):
            for partition in ("0", "1"):
                producer.send_event(EventData(b"x"), partition_id=partition)
    finally:
        producer.close()


def test_sigterm_on_a_busy_partition_checkpoints_exactly_what_was_relayed(
    eventhubs_emulator, tmp_path: Path, measure
) -> None:
    emulator = eventhubs_emulator({"events": 2})
    (tmp_path / "job.yaml").write_text(textwrap.dedent(JOB.format(cs=emulator.connection_string())))
    (tmp_path / "relay_task.py").write_text(RELAY)
    config = load_config(tmp_path / "job.yaml")
    systems = Systems(config)
    systems.admin("local").create_stream(StreamSpec("relayed", 1))
    stop = threading.Event()
    producer = threading.Thread(target=trickle, args=(emulator.connection_string(), stop), daemon=True)
    producer.start()
    proc = start_processor(tmp_path / "job.yaml", "p1", log_dir=tmp_path / "logs")
    relayed_ssp = SystemStreamPartition("local", "relayed", 0)

    def relayed() -> list[dict]:
        return [json.loads(r.value) for r in systems.consumer("local").read(relayed_ssp, "0", 100_000)]

    try:
        wait_until(lambda: len(relayed()) >= 100, 120, "100 events relayed", 0.2)
        proc.popen.send_signal(signal.SIGTERM)
        took = wait_until(lambda: not proc.alive(), 60, "the processor to stop after SIGTERM", 0.1)
        assert proc.popen.wait() == 0, proc.log_text()[-3000:]
        measure(f"processor stopped {took:.1f} s after SIGTERM while 40 events/s arrived")
    except Exception:
        print(proc.log_text()[-4000:])
        raise
    finally:
        stop.set()
        producer.join(10)
        if proc.alive():
            proc.kill()
    assert "no longer held" not in proc.log_text(), proc.log_text()[-3000:]

    rows = relayed()
    manager = checkpoint_factory(config).get_checkpoint_manager(config)
    manager.start()
    try:
        for partition in (0, 1):
            offsets = [int(r["offset"]) for r in rows if r["p"] == partition]
            assert offsets == list(range(len(offsets))), "relayed in order, once each"
            task = f"main-{partition}"
            checkpoint = manager.read_last_checkpoint(task)
            assert checkpoint is not None, task
            (offset,) = checkpoint.offsets.values()
            assert int(offset) == len(offsets), f"{task}: checkpoint {offset}, {len(offsets)} relayed"
    finally:
        manager.stop()
        systems.close()
