"""Liveness that no clock skew can fool. On Azure (Azurite), a heartbeat's age is measured on the clock of the
Table service that stamped it (`weirflow_azure.coordinator.registry`); on AWS (moto), on the reader's own clock
from when it first saw the heartbeat's current value, as KCL judges leases (`weirflow_aws.registry`). Never the
reader's clock minus the writer's: hosts whose clocks disagree by more than the liveness timeout still agree on
who is alive.

* In process: rows written by a registry whose clock runs 300 s ahead, or 30 s behind, read back as written
  just now (what a reader judges liveness and debounce by).
* Processes under ``faketime`` (Debian's libfaketime, which ``make test`` installs), on each backend: of three
  processors one runs 30 s behind and one 300 s ahead. They settle on one job model and stay there (no
  rebalance storm: each would otherwise see the one behind as long dead), and when the one ahead is SIGKILLed its
  tasks move to the others (otherwise its heartbeats, stamped 300 s in the future, would keep it "alive" for
  five minutes).
"""

from __future__ import annotations

import shutil
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import unique_job_name
from tests.integration.relay_job import PARTITIONS, Job, finish
from tests.support.faketime import libfaketime
from weirflow.base import clock
from weirflow.config.loader import Config
from weirflow.interfaces.coordination import ProcessorInfo
from weirflow.local.launcher import start_processor
from weirflow.testing import wait_until
from weirflow_azure.coordinator.factories import AzureJobCoordinatorFactory

pytestmark = pytest.mark.integration

LIVENESS_MS = 4000
DEBOUNCE_MS = 1000


def _registry(connection_string: str, job_name: str, owner: str):
    config = Config.from_dict(
        {
            "job.name": job_name,
            "job.coordinator.factory": "azure",
            "azure.storage.connection.string": connection_string,
        }
    )
    return AzureJobCoordinatorFactory().get_coordination_utils(config, owner)


@pytest.mark.parametrize("skew_ms", [300_000, -30_000], ids=["ahead-300s", "behind-30s"])
def test_a_skewed_writers_heartbeat_reads_back_as_written_now(
    azure_storage: str, monkeypatch: pytest.MonkeyPatch, skew_ms: int
) -> None:
    name = unique_job_name("skew")
    writer, reader = _registry(azure_storage, name, "p1"), _registry(azure_storage, name, "status")
    try:
        real_now = clock.now_ms
        monkeypatch.setattr(clock, "now_ms", lambda: real_now() + skew_ms)  # the writer's host clock
        registry = writer.processor_registry()
        started = clock.now_ms()
        for beat in (1, 2):  # the first write teaches the registry the store's clock; the second uses it
            registry.heartbeat(
                ProcessorInfo("p1", "h", 1, "RUNNING", heartbeat_ms=clock.now_ms(), started_ms=started, beat=beat)
            )
        monkeypatch.setattr(clock, "now_ms", real_now)  # the reader's host clock is right

        [row] = reader.processor_registry().processors()
        assert row.beat == 2
        assert abs(row.heartbeat_ms - real_now()) <= 1500, f"heartbeat read {row.heartbeat_ms - real_now()} ms off"
        assert abs(row.started_ms - real_now()) <= 1500, f"registration read {row.started_ms - real_now()} ms off"
    finally:
        writer.close()
        reader.close()


# --- processors under faketime --------------------------------------------------------------------------------
@pytest.fixture(params=["azure", "aws"])
def skewed_job(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Job]:
    if libfaketime() is None or shutil.which("faketime") is None:
        pytest.skip("libfaketime is not installed (make test installs Debian's faketime)")
    if request.param == "aws":
        backend = {
            "job.coordinator.factory": "aws",
            "task.checkpoint.factory": "dynamodb",
            **request.getfixturevalue("moto").config(),
        }
    else:
        backend = {
            "job.coordinator.factory": "azure",
            "task.checkpoint.factory": "azure-table",
            "azure.storage.connection.string": request.getfixturevalue("azure_storage"),
        }
    job = Job(
        tmp_path,
        {
            "job.coordinator.heartbeat.interval.ms": 1000,
            "job.coordinator.liveness.timeout.ms": LIVENESS_MS,
            "job.coordinator.poll.interval.ms": 250,
            "job.debounce.time.ms": DEBOUNCE_MS,
        },
        {"job.name": unique_job_name("skew"), **backend},
    )
    job.backend = request.param  # type: ignore[attr-defined]
    yield job
    finish(job)


def _start_skewed(job: Job, processor_id: str, offset: str) -> None:
    # only the wall clock is skewed, as between two hosts: the monotonic clock (and every timed wait) is real
    env = {"LD_PRELOAD": str(libfaketime()), "FAKETIME": offset, "FAKETIME_DONT_FAKE_MONOTONIC": "1"}
    log_dir = job.root / "logs"
    job.processes[processor_id] = start_processor(job.config_path, processor_id, log_dir=log_dir, env=env)


def test_processors_whose_clocks_disagree_by_minutes_neither_storm_nor_keep_a_dead_one(
    skewed_job: Job, measure
) -> None:
    job = skewed_job
    job.start("p1")  # the host with the right clock leads
    wait_until(lambda: job.status()["leader"] == "p1", 60, "p1 leading")
    _start_skewed(job, "p2", "-30s")
    _start_skewed(job, "p3", "+300s")
    ids = {"p1", "p2", "p3"}
    took = wait_until(lambda: job.all_tasks_running_once(ids), 90, "12 tasks on p1, p2 (-30 s) and p3 (+300 s)")
    backend = job.backend  # type: ignore[attr-defined]
    measure(f"[{backend}] processors 30 s behind and 300 s ahead share the tasks {took:.1f} s after start")
    settled = job.status()["job_model_version"]

    # No storm: for several liveness timeouts, every processor stays live and the model stays where it is.
    observed_until = time.monotonic() + 3 * LIVENESS_MS / 1000
    while time.monotonic() < observed_until:
        doc = job.status()
        assert doc["job_model_version"] == settled, f"rebalanced from v{settled} to v{doc['job_model_version']}"
        live = {p["processor_id"] for p in doc["processors"] if p["live"]}
        ages = {p["processor_id"]: p["heartbeat_age_s"] for p in doc["processors"]}
        assert live == ids, f"only {sorted(live)} live; heartbeat ages (s): {ages}"
        time.sleep(0.25)  # not synchronisation: samples of a state that must hold for the whole window

    # The processor 300 s ahead dies: its tasks move (with writer-stamped heartbeats it looked alive for 300 s).
    job.processes["p3"].popen.send_signal(signal.SIGKILL)
    killed_at = time.monotonic()
    took = wait_until(lambda: "p3" not in job.status()["assignment"], 60, "a model without p3")
    measure(
        f"[{backend}] a SIGKILLed processor 300 s ahead left the model {took:.1f} s after the kill "
        f"(liveness {LIVENESS_MS / 1000:.0f} s + debounce {DEBOUNCE_MS / 1000:.0f} s)"
    )
    wait_until(lambda: job.all_tasks_running_once({"p1", "p2"}), 60, "p1 and p2 running every task")
    measure(
        f"[{backend}] its tasks running again {time.monotonic() - killed_at:.1f} s after the kill (15 s leases)"
    )

    job.produce(PARTITIONS * 20)
    wait_until(lambda: len(job.relayed_ids()) >= job.sent, 60, "every event relayed")
    assert job.relayed_ids() == set(range(job.sent)), "an event was lost"
