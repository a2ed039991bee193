"""Seconds until a killed consumer's partitions are processed again: weirflow vs the Event Hubs SDK's own
load-balanced processor, on the same Azurite and Event Hubs emulator, default settings on each side.

Both sides consume one 4-partition event hub with two processes while a producer keeps sending one event per
partition every 100 ms. Each consumed event is recorded with the time it was processed. One process is
SIGKILLed; the figure is the time from the kill until an event of *every* partition the victim owned has been
processed by the survivor.

* **weirflow**: two `weirflow run` processes of a record-task relay job with `job.coordinator.factory: azure`,
  `task.checkpoint.factory: azure-table`, the input on the `eventhub` system (shipped defaults: 15 s leases).
* **SDK**: two processes running `EventHubConsumerClient.receive` with a `BlobCheckpointStore` (package
  `azure-eventhub-checkpointstoreblob`) on the same Azurite, checkpointing every event (SDK defaults: 30 s
  load-balancing interval, 2 min ownership expiry).

Prints one JSON line: ``{"figure": ..., "unit": "s", "value": <weirflow median>, "baseline": <sdk median>,
...}`` with every run's figures. Usage: ``python benchmarks/failover_vs_eventprocessor.py [--runs 3]``
(each run takes about 8 minutes, most of it the SDK side: 30 s balancing cycles, its 2-minute ownership
expiry, and events handed over in bursts with its default prefetch).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tests.support.azurite: the Azurite launcher of the test tree
PARTITIONS = 4

SDK_CONSUMER = r"""
import json, sys, time
from azure.eventhub import EventHubConsumerClient
from azure.eventhub.extensions.checkpointstoreblob import BlobCheckpointStore
eh, storage, out = sys.argv[1], sys.argv[2], sys.argv[3]
store = BlobCheckpointStore.from_connection_string(storage, "sdk-checkpoints")
client = EventHubConsumerClient.from_connection_string(eh, consumer_group="$Default", checkpoint_store=store)
log = open(out, "a", buffering=1)
def on_event(ctx, event):
    log.write(json.dumps({"p": ctx.partition_id, "t": time.time()}) + "\n")
    ctx.update_checkpoint(event)
client.receive(on_event=on_event, starting_position="-1")
"""

RELAY = """
import json, time
def relay(record):
    with open(__file__ + ".out", "a", buffering=1) as out:
        out.write(json.dumps({"p": str(record["partition"]), "t": time.time()}) + "\\n")
    return []
"""

JOB = """
job:
  name: failover-bench
  coordinator.factory: azure
task:
  inputs: [events]
  function: relay_bench:relay
  checkpoint.factory: azure-table
azure.storage.connection.string: "{storage}"
systems:
  eh:
    factory: eventhub
    connection.string: "{eh}"
streams:
  events: {{system: eh, physical.name: events, partitions: {partitions}}}
"""


def produce_forever(connection_string: str, stop: threading.Event) -> None:
    from azure.eventhub import EventData, EventHubProducerClient

    producer = EventHubProducerClient.from_connection_string(connection_string, eventhub_name="events")
    while not stop.is_set():
        for p in range(PARTITIONS):
            producer.send_event(EventData(b"x"), partition_id=str(p))
        stop.wait(0.1)
    producer.close()


def records(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def recovery_time(
    outputs: dict[str, Path], victim: str, owned: set[str], killed_at: float, timeout_s: float
) -> float:
    """Seconds from the kill until the survivor processed an event of every partition the victim owned."""
    survivor = next(name for name in outputs if name != victim)
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        after = {r["p"]: r["t"] for r in records(outputs[survivor]) if r["t"] > killed_at and r["p"] in owned}
        if set(after) == owned:
            return max(after.values()) - killed_at
        time.sleep(0.2)
    raise TimeoutError(f"the survivor did not take over {sorted(owned)} within {timeout_s} s")


def wait_balanced(
    outputs: dict[str, Path], timeout_s: float = 600, window_s: float = 45, stable_s: float = 10
) -> dict[str, set[str]]:
    """Wait until each consumer alone processed half the partitions over the last ``window_s``, unchanged for
    ``stable_s``; return who owns what. The SDK claims one partition per 30 s balancing cycle, and with its
    default prefetch of 300 hands a partition's events over in bursts about 30 s apart at this rate (see
    docs/eventhubs.md), hence the long window."""
    deadline = time.time() + timeout_s
    last: dict[str, set[str]] | None = None
    since = 0.0
    while time.time() < deadline:
        now = time.time()
        recent = {
            name: {r["p"] for r in records(path) if r["t"] > now - window_s} for name, path in outputs.items()
        }
        a, b = recent.values()
        balanced = len(a) == len(b) == PARTITIONS // 2 and not a & b
        if balanced and recent == last:
            if now - since >= stable_s:
                return recent
        else:
            since = now
        last = recent if balanced else None
        time.sleep(0.5)
    raise TimeoutError("the two consumers never settled on half the partitions each")


def run_sdk(eh: str, storage: str, work: Path) -> float:
    from azure.storage.blob import BlobServiceClient

    with BlobServiceClient.from_connection_string(storage) as blobs:
        blobs.create_container("sdk-checkpoints")  # BlobCheckpointStore expects it to exist
    script = work / "sdk_consumer.py"
    script.write_text(SDK_CONSUMER)
    outputs = {name: work / f"sdk-{name}.jsonl" for name in ("a", "b")}
    procs = {
        name: subprocess.Popen(
            [sys.executable, str(script), eh + ";EntityPath=events", storage, str(path)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for name, path in outputs.items()
    }
    try:
        owned = wait_balanced(outputs)
        procs["b"].send_signal(signal.SIGKILL)
        killed_at = time.time()
        return recovery_time(outputs, "b", owned["b"], killed_at, 600)
    finally:
        for proc in procs.values():
            proc.kill()
            proc.wait()


def run_weirflow(eh: str, storage: str, work: Path) -> float:
    from weirflow.local.launcher import start_processor

    job = work / "job.yaml"
    job.write_text(JOB.format(storage=storage, eh=eh, partitions=PARTITIONS))
    relay = work / "relay_bench.py"
    relay.write_text(RELAY)
    out = Path(str(relay) + ".out")
    procs = {
        name: start_processor(job, name, [f"job.state.dir={work / 'state'}"], log_dir=work / "logs")
        for name in ("a", "b")
    }
    # One output file shared by both processes: tell them apart by the partitions each was assigned.
    try:
        from weirflow.cli import status_document
        from weirflow.config import load_config

        config = load_config(job, [f"job.state.dir={work / 'state'}"])
        deadline = time.time() + 300
        owned: set[str] = set()
        while time.time() < deadline:
            assignment = status_document(config).get("assignment") or {}
            owned = {t.rsplit("-", 1)[1] for t in assignment.get("b", [])}
            recent = {r["p"] for r in records(out) if r["t"] > time.time() - 2}
            if len(owned) == PARTITIONS // 2 and len(recent) == PARTITIONS:
                break
            time.sleep(0.5)
        else:
            raise TimeoutError("the two weirflow processors never shared the partitions")
        procs["b"].kill()
        killed_at = time.time()
        deadline = time.time() + 300
        while time.time() < deadline:
            after = {r["p"]: r["t"] for r in records(out) if r["t"] > killed_at + 0.5 and r["p"] in owned}
            if set(after) == owned:
                return max(after.values()) - killed_at
            time.sleep(0.2)
        raise TimeoutError("weirflow's survivor did not take over")
    finally:
        for proc in procs.values():
            if proc.alive():
                proc.terminate()


def one_run(index: int) -> tuple[float, float]:
    """(weirflow s, SDK s) on a fresh Azurite and emulator."""
    from tests.support.azurite import Azurite
    from weirflow_azure.eventhubs.emulator.server import EventHubsEmulator

    with tempfile.TemporaryDirectory(prefix="weirflow-eh-failover-") as tmp:
        work = Path(tmp)
        with Azurite(work / "azurite") as azurite, EventHubsEmulator({"events": PARTITIONS}) as emulator:
            stop = threading.Event()
            producer = threading.Thread(
                target=produce_forever, args=(emulator.connection_string(), stop), daemon=True
            )
            producer.start()
            try:
                (work / "w").mkdir()
                (work / "s").mkdir()
                weirflow_s = run_weirflow(emulator.connection_string(), azurite.connection_string, work / "w")
                print(f"# run {index}: weirflow {weirflow_s:.1f} s", file=sys.stderr, flush=True)
                sdk_s = run_sdk(emulator.connection_string(), azurite.connection_string, work / "s")
                print(f"# run {index}: sdk {sdk_s:.1f} s", file=sys.stderr, flush=True)
            finally:
                stop.set()
    return weirflow_s, sdk_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="runs of both sides; the medians are reported")
    runs = [one_run(i + 1) for i in range(parser.parse_args().runs)]
    weirflow_s = statistics.median(w for w, _ in runs)
    sdk_s = statistics.median(s for _, s in runs)
    print(
        json.dumps(
            {
                "figure": "killed consumer's partitions processed again (Event Hubs emulator + Azurite, defaults)",
                "unit": "s",
                "value": round(weirflow_s, 1),
                "runs": [round(w, 1) for w, _ in runs],
                "baseline": round(sdk_s, 1),
                "baseline_runs": [round(s, 1) for _, s in runs],
                "baseline_name": "EventHubConsumerClient + BlobCheckpointStore",
                "ratio": round(weirflow_s / sdk_s, 3),
            }
        )
    )


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
