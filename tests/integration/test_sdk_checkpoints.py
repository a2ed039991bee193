"""Event Hubs checkpoints that the Azure SDKs read and write, both ways, with the real SDK
(``azure-eventhub`` + ``azure-eventhub-checkpointstoreblob``) against the Event Hubs emulator and Azurite.

* **SDK app -> weirflow** (``streams.<id>.start: sdk-checkpoint``): an `EventHubConsumerClient` with a
  `BlobCheckpointStore` checkpoints partition 0 at an event; the job, started on the same container, reads
  partition 0 from the next event and partition 1 (no SDK checkpoint) from the start.
* **weirflow -> SDK** (``task.checkpoint.azure.eventhubs.layout: both``): after the job stops, an SDK consumer on
  the same container resumes every partition exactly at the event after the job's last one: nothing skipped or
  repeated.
"""

from __future__ import annotations

import json
import signal
import textwrap
import threading
from pathlib import Path

import pytest
from azure.eventhub import EventData, EventHubConsumerClient, EventHubProducerClient
from azure.eventhub.extensions.checkpointstoreblob import BlobCheckpointStore
from azure.storage.blob import BlobServiceClient

from tests.conftest import unique_job_name
from weirflow.config import load_config
from weirflow.interfaces.system import StreamSpec, SystemStreamPartition
from weirflow.job.systems import Systems
from weirflow.local.launcher import start_processor
from weirflow.testing import wait_until

pytestmark = pytest.mark.integration

CONTAINER = "sdk-checkpoints"
FIRST, LATER = 30, 12  # events per partition before the job runs, and after it stopped

JOB = """
job: {{name: {name}}}
task: {{inputs: [events], function: "relay_task:relay", commit.ms: 200, checkpoint.factory: azure-table}}
task.checkpoint.azure.eventhubs.container: {container}
azure: {{storage.connection.string: "{storage}"}}
systems:
  eh: {{factory: eventhub, connection.string: "{eh}"}}
streams:
  events: {{system: eh, partitions: 2, start: sdk-checkpoint}}
  relayed: {{partitions: 1}}
"""

RELAY = """
def relay(record):
    return [{"stream": "relayed", "value": {"p": record["partition"], "offset": record["offset"]}}]
"""


def send(connection_string: str, per_partition: int) -> None:
    with EventHubProducerClient.from_connection_string(connection_string, eventhub_name="events") as producer:
        for partition in ("0", "1"):
            batch = producer.create_batch(partition_id=partition)
            for i in range(per_partition):
                batch.add(EventData(f"{partition}-{i}"))
            producer.send_batch(batch)


def sdk_receive(
    eh: str, storage: str, wanted: int, checkpoint_at: dict[str, int] | None = None
) -> list[tuple[str, int]]:
    """What an SDK consumer app with a `BlobCheckpointStore` on ``CONTAINER`` receives, as (partition, sequence
    number), until ``wanted`` events arrived; with ``checkpoint_at`` it checkpoints at those sequence numbers."""
    store = BlobCheckpointStore.from_connection_string(storage, CONTAINER)
    client = EventHubConsumerClient.from_connection_string(
        eh, consumer_group="$Default", eventhub_name="events", checkpoint_store=store
    )
    received: list[tuple[str, int]] = []
    done = threading.Event()

    def on_event(context, event) -> None:
        if event is None:
            return
        received.append((context.partition_id, event.sequence_number))
        if checkpoint_at and checkpoint_at.get(context.partition_id) == event.sequence_number:
            context.update_checkpoint(event)
        if len(received) >= wanted:
            done.set()

    worker = threading.Thread(
        target=client.receive,
        kwargs={"on_event": on_event, "starting_position": "-1", "max_wait_time": 1},
        daemon=True,
    )
    worker.start()
    try:
        done.wait(90)
    finally:
        client.close()
        worker.join(30)
    return received


def test_a_job_starts_where_an_sdk_app_checkpointed_and_an_sdk_app_resumes_where_the_job_stopped(
    eventhubs_emulator, azure_storage: str, tmp_path: Path, measure
) -> None:
    emulator = eventhubs_emulator({"events": 2})
    eh = emulator.connection_string()
    with BlobServiceClient.from_connection_string(azure_storage) as service:
        service.create_container(CONTAINER)  # the SDK app's own container; the SDK does not create it
    send(eh, FIRST)

    # --- an SDK consumer app processes partition 0 up to sequence number 14 and checkpoints there ----------
    seen = sdk_receive(eh, azure_storage, 2 * FIRST, checkpoint_at={"0": 14})
    assert sorted(seen) == sorted([(p, n) for p in ("0", "1") for n in range(FIRST)])

    # --- the job takes over from the SDK app's checkpoints ----------------------------------------------
    (tmp_path / "job.yaml").write_text(
        textwrap.dedent(
            JOB.format(name=unique_job_name("sdkck"), container=CONTAINER, storage=azure_storage, eh=eh)
        )
    )
    (tmp_path / "relay_task.py").write_text(RELAY)
    config = load_config(tmp_path / "job.yaml")
    systems = Systems(config)
    systems.admin("local").create_stream(StreamSpec("relayed", 1))
    relayed_ssp = SystemStreamPartition("local", "relayed", 0)

    def relayed() -> list[dict]:
        return [json.loads(r.value) for r in systems.consumer("local").read(relayed_ssp, "0", 100_000)]

    expected = {0: list(range(15, FIRST)), 1: list(range(FIRST))}
    proc = start_processor(tmp_path / "job.yaml", "p1", log_dir=tmp_path / "logs")
    try:
        wait_until(lambda: len(relayed()) >= sum(map(len, expected.values())), 120, "the job relaying", 0.2)
        proc.popen.send_signal(signal.SIGTERM)
        wait_until(lambda: not proc.alive(), 60, "the processor to stop after SIGTERM", 0.1)
        assert proc.popen.wait() == 0, proc.log_text()[-3000:]
    except Exception:
        print(proc.log_text()[-4000:])
        raise
    finally:
        if proc.alive():
            proc.kill()
        systems.close()
    rows = relayed()
    for partition, offsets in expected.items():
        got = [int(r["offset"]) for r in rows if r["p"] == partition]
        assert got == offsets, f"partition {partition}: the job read {got[:3]}...{got[-3:]}"

    # --- an SDK app resumes from the job's checkpoint blobs: exactly the events after the job's last -----
    send(eh, LATER)
    resumed = sdk_receive(eh, azure_storage, 2 * LATER)
    assert sorted(resumed) == sorted([(p, n) for p in ("0", "1") for n in range(FIRST, FIRST + LATER)]), resumed
    measure(
        f"SDK app checkpointed p0 at 14 -> the job read p0 from 15 and p1 (no checkpoint) from 0; "
        f"after the job stopped an SDK consumer received exactly the {2 * LATER} newer events"
    )
