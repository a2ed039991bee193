"""Read a weirflow job's output event hub with the Azure SDK, each result once.

A job's outputs on Event Hubs are at least once: a processor killed after a micro-batch's records were sent
and before its checkpoint leaves the batch to the next holder of the task, which sends the records again with
the same ``weirflow-id`` property (docs/guarantees.md, "Reading results once"). `ReplayFilter` recognises them
by that id, keeping one mark per lane of each partition:

    python examples/reading_results/eventhubs.py --connection-string "$EVENTHUBS_CONNECTION_STRING" \\
        --hub page-counts            # prints every result once, then how many replays it left out

Reads every partition from its oldest event up to the end it had when the script started (``--follow``: keeps
reading). Needs ``pip install weirflow azure-eventhub`` and nothing else of the job: no config, no Spark.

A reader that checkpoints where it stopped (the SDK's checkpoint store) saves ``replays.state()`` with its
checkpoint and starts again from ``ReplayFilter.from_state(saved)``: the filter must know what was read before
the checkpoint to recognise a replay of it that lies after it.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
from collections.abc import Callable
from typing import Any

from azure.eventhub import EventData, EventHubConsumerClient

from weirflow.results import ReplayFilter

Handler = Callable[[str, EventData], None]


def read_results(
    client: EventHubConsumerClient, handle: Handler, *, follow: bool = False, replays: ReplayFilter | None = None
) -> ReplayFilter:
    """Call ``handle(partition_id, event)`` once per result of the hub ``client`` reads, from each partition's
    oldest event; return the filter (its ``replays``: how many events it left out). Without ``follow``, return
    once every partition was read up to the end it had at the start."""
    replays = replays if replays is not None else ReplayFilter()  # Event Hubs keeps send order: one mark a lane
    ends = {
        p: client.get_partition_properties(p)["last_enqueued_sequence_number"] for p in client.get_partition_ids()
    }
    left = {p for p, last in ends.items() if last >= 0}  # partitions with something to read
    done = threading.Event()
    if not follow and not left:
        client.close()
        return replays

    def on_event_batch(context: Any, events: list[EventData]) -> None:
        partition = context.partition_id
        for event in events:
            if replays.is_new_event(partition, event):  # its weirflow-id property
                handle(partition, event)
            if not follow and event.sequence_number >= ends[partition]:
                left.discard(partition)
        if not follow and not left:
            done.set()

    receiving = threading.Thread(
        target=client.receive_batch,
        kwargs={"on_event_batch": on_event_batch, "starting_position": "-1", "max_wait_time": 1},
        daemon=True,
    )
    receiving.start()
    try:
        while receiving.is_alive() and not done.wait(0.5):
            pass
    finally:
        client.close()
        receiving.join(10)
    return replays


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--connection-string", required=True, help="the namespace's (or the hub's) connection string"
    )
    parser.add_argument("--hub", required=True, help="the output event hub")
    parser.add_argument("--consumer-group", default="$Default")
    parser.add_argument("--follow", action="store_true", help="keep reading new events")
    args = parser.parse_args()
    client = EventHubConsumerClient.from_connection_string(
        args.connection_string, args.consumer_group, eventhub_name=args.hub
    )

    def show(partition: str, event: EventData) -> None:
        print(json.dumps({"partition": partition, "value": event.body_as_str()}), flush=True)

    try:
        replays = read_results(client, show, follow=args.follow)
    except KeyboardInterrupt:
        return
    if replays.replays:
        print(f"left out {replays.replays} replayed events", file=sys.stderr)


if __name__ == "__main__":
    main()
