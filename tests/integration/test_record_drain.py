"""Drain and upgrade of a record-task job (examples/coordination: each page view relayed to `page-visits`,
tagged with the input record it came from), on the embedded default with no run id set (docs/drain.md).

Two processors run it over an unbounded input; `weirflow upgrade` drains them (every task stops at the record
in hand, sends what it processed, checkpoints ``drained``; the processors exit 0), records the next run and
becomes a processor of the new version, which relays to another stream. Every input record before the cut is
relayed once by the old version, every record after it once by the new version, and nothing else."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration import drain_job
from weirflow.config import load_config
from weirflow.interfaces.system import StreamSpec
from weirflow.job.drain_notice import DEFAULT_RUN_ID
from weirflow.job.systems import Systems
from weirflow.local.launcher import start_processor
from weirflow.testing import wait_until

pytestmark = pytest.mark.integration

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "coordination"
FINISH_S = 180
RELAY_V2 = """
import json


def route(record):
    view = json.loads(record["value"])
    view["source"] = f"{record['stream']}/{record['partition']}@{record['offset']}"
    view["version"] = 2
    return [{"stream": "page-visits-v2", "key": view["page"], "value": view}]
"""


def _sources(config, stream: str) -> list[str]:
    """The ``source`` tag of every record relayed to ``stream``: which input record it came from."""
    return [json.loads(v)["source"] for values in drain_job.records(config, stream).values() for v in values]


def _inputs(config, cut: dict[int, int]) -> tuple[set[str], set[str]]:
    """The input records' tags before and after the cut (per partition: the offset the tasks stopped at)."""
    before, after = set(), set()
    for partition, values in drain_job.records(config, "page-views").items():
        for offset in range(len(values)):
            tag = f"page-views/{partition}@{offset}"
            (before if offset < cut[partition] else after).add(tag)
    return before, after


def _log(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


def test_a_record_job_drains_at_a_cut_and_its_upgrade_relays_exactly_what_followed(
    tmp_path: Path, measure
) -> None:
    job_dir = tmp_path / "job"
    shutil.copytree(EXAMPLE, job_dir, ignore=shutil.ignore_patterns("__pycache__"))
    (job_dir / "relay_v2.py").write_text(RELAY_V2)
    config_path = job_dir / "job.yaml"
    overrides = [
        f"job.state.dir={tmp_path / 'state'}",
        "streams.page-views.partitions=4",
        "streams.page-visits-v2.partitions=2",
        "job.coordinator.poll.interval.ms=250",
        "job.debounce.time.ms=500",
    ]
    config = load_config(config_path, overrides)
    feeder = drain_job.Feeder(config, rate=400).create_stream()
    systems = Systems(config)
    try:  # the outputs exist before the job writes them, as `weirflow streams create` makes them
        for stream, partitions in (("page-visits", 4), ("page-visits-v2", 2)):
            systems.admin("local").create_stream(StreamSpec(stream, partitions))
    finally:
        systems.close()
    procs = [start_processor(config_path, f"p{i}", overrides, log_dir=tmp_path / "logs") for i in range(2)]
    log = tmp_path / "upgrade.log"
    upgrade = None
    try:
        wait_until(lambda: all("started at" in p.log_text() for p in procs), FINISH_S, "both to run tasks", 0.2)
        feeder.start()
        wait_until(lambda: len(_sources(config, "page-visits")) >= 800, FINISH_S, "the job to relay input", 0.2)

        command = [sys.executable, "-m", "weirflow", "upgrade", str(config_path), str(config_path)]
        command += [arg for item in overrides for arg in ("--set", item)]
        command += ["--new-set", "task.function=relay_v2:route"]
        with log.open("w") as out:
            upgrade = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
        wait_until(lambda: all("draining:" in p.log_text() for p in procs), FINISH_S, "the drain noticed", 0.2)
        sent = feeder.sent
        wait_until(lambda: feeder.sent >= sent + 400, 60, "a second more of input", 0.1)
        total = feeder.stop()
        for p in procs:
            assert p.popen.wait(FINISH_S) == 0, p.log_text()[-4000:]
        assert all("drained in run default at its cut" in p.log_text() for p in procs)

        states = drain_job.checkpoints(config)
        assert len(states) == 4 and all(c.control.get("drained") == DEFAULT_RUN_ID for c in states.values()), (
            states
        )
        cut = {ssp.partition: int(o) for c in states.values() for ssp, o in c.offsets.items()}
        before, after = _inputs(config, cut)
        assert len(before) + len(after) == total and after, f"cut {cut}: no input after it"

        wait_until(
            lambda: len(_sources(config, "page-visits-v2")) >= len(after) or upgrade.poll() is not None,
            FINISH_S,
            "the new version to relay the input after the cut",
            0.2,
        )
        assert upgrade.poll() is None, _log(log)[-4000:]
        upgrade.send_signal(signal.SIGTERM)
        assert upgrade.wait(FINISH_S) == 0, _log(log)[-4000:]
    finally:
        if upgrade is not None and upgrade.poll() is None:
            upgrade.kill()
        feeder.stop()
        for p in procs:
            if p.alive():
                p.kill()

    old, new = _sources(config, "page-visits"), _sources(config, "page-visits-v2")
    assert len(old) == len(set(old)) and set(old) == before, (
        "the old version relayed other than the input up to the cut"
    )
    assert len(new) == len(set(new)) and set(new) == after, "the new version relayed other than the input after it"
    text = " ".join(_log(log).split())
    assert "a new deployment" not in text and "(joined the running deployment)" in text, text[-3000:]
    measure(
        f"record job drained at a cut of {len(before)} records, each relayed once; the new version (run "
        f"{text.split('the new version runs as run ', 1)[1].split(' ', 1)[0]}) relayed the {len(after)} after it"
    )
