"""`weirflow upgrade` end to end on Azure services (Azurite, and the Event Hubs emulator through the real SDK),
with no run id set anywhere: a processor of the example runs over an unbounded input, the command drains
it, records the next run and becomes a processor of the new version, which has another aggregation and an
intermediate schema the old rows do not fit (docs/drain.md, "Upgrading"). Every window is written once and
equals pandas on both sides of the cut, and an old processor started again after the upgrade runs nothing."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration import drain_job
from tests.integration.example_job import EXAMPLE, results
from tests.integration.test_drain import PIPELINE_V2, _expected_v2
from tests.integration.test_pageviews_on_azure import AzurePageViews
from weirflow.config import load_config
from weirflow.drain_notice import DEFAULT_RUN_ID
from weirflow.local.launcher import wait_until

pytestmark = pytest.mark.integration

FINISH_S = 300
V2_KEYS = [
    "app.pipeline=pipeline_v2:pipeline",
    "streams.page-views.bounded=true",
    "streams.page-counts-v2.partitions=2",
]


def _input_offsets(checkpoint) -> dict[int, str]:
    """A checkpoint's offsets of the job's input, per partition (the first stage's cut)."""
    return {ssp.partition: offset for ssp, offset in checkpoint.offsets.items() if ssp.stream == "page-views"}


def _log(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


def test_upgrade_drains_records_a_new_run_and_runs_the_new_version_exactly_without_a_run_id(
    tmp_path: Path, eventhubs_emulator, azure_storage: str, monkeypatch, measure
) -> None:
    job = AzurePageViews(
        tmp_path,
        eventhubs_emulator,
        azure_storage,
        monkeypatch,
        ("streams.page-views.bounded=false",),
        hubs={"page-counts-v2": 2},
    )
    v2_dir = tmp_path / "v2"
    v2_dir.mkdir()
    shutil.copy(EXAMPLE / "azure.yaml", v2_dir / "azure.yaml")
    (v2_dir / "pipeline_v2.py").write_text(PIPELINE_V2)
    feeder = drain_job.Feeder(job.config, rate=150).create_stream()
    log = tmp_path / "upgrade.log"
    command = [sys.executable, "-m", "weirflow", "upgrade", str(job.config_path), str(v2_dir / "azure.yaml")]
    for item in job.overrides:
        command += ["--set", item]
    for item in V2_KEYS:
        command += ["--new-set", item]
    upgrade = None
    try:
        # one processor of v1 (two drain on Azure in test_pageviews_on_azure.py): one Spark session less here
        procs = [job.start("p0")]
        running = lambda: all("started task" in p.log_text() for p in procs)  # noqa: E731
        wait_until(lambda: running() or not all(p.alive() for p in procs), FINISH_S, "v1 to run tasks", 0.2)
        assert all(p.alive() for p in procs), "\n".join(p.log_text()[-2000:] for p in procs)
        assert all(f"run {DEFAULT_RUN_ID} (" in p.log_text() for p in procs), "the job's first run"
        feeder.start()
        wait_until(lambda: results.consumed(job.config) >= 600, FINISH_S, "the job to process input", 0.5)

        with log.open("w") as out:
            upgrade = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
        # the feed goes on until the processors noticed the drain, and a second longer: input after the cut
        noticed = lambda: all("drain requested" in p.log_text() for p in procs)  # noqa: E731
        wait_until(noticed, FINISH_S, "the processors to notice the drain", 0.2)
        sent = feeder.sent
        wait_until(lambda: feeder.sent >= sent + 150, 60, "a second more of input", 0.1)
        feeder.stop()
        for p in procs:
            assert p.popen.wait(FINISH_S) == 0, p.log_text()[-4000:]
        wait_until(lambda: "the new version runs as run" in _log(log), FINISH_S, "the next run recorded", 0.2)
        text = " ".join(_log(log).split())
        next_run = text.split("the new version runs as run ", 1)[1].split(" ", 1)[0]
        assert next_run != DEFAULT_RUN_ID and f"(after run {DEFAULT_RUN_ID})" in text, text
        # v1's cut, read while the new version's processor is still starting Spark (before its first checkpoint)
        states = drain_job.checkpoints(job.config)
        drained = [c.control.get("drained") for c in states.values()]
        assert drained == [DEFAULT_RUN_ID] * 4, f"not v1's drained checkpoints: {states}"
        cut = {p: int(o) for c in states.values() for p, o in _input_offsets(c).items()}

        # the old version, started again (as a container platform restarts an exited replica), runs nothing
        old = job.start("p0-again")
        assert old.popen.wait(120) == 0, old.log_text()[-3000:]
        assert "drained and was upgraded" in old.log_text() and "started task" not in old.log_text()

        assert upgrade.wait(FINISH_S) == 0, _log(log)[-5000:]
    finally:
        if upgrade is not None and upgrade.poll() is None:
            upgrade.kill()
        feeder.stop()
        job.stop_all()

    new_log = _log(log)
    assert f"run {next_run} (joined the running deployment)" in new_log, new_log[-3000:]
    # v1: every window up to the cut, once, equal to pandas
    before, after = drain_job.split_at_cut(job.config, cut)
    expected = results.expected_counts(before)
    got, twice = drain_job.window_counts_once(job.config)
    assert not twice, f"{len(twice)} v1 windows written more than once"
    assert got == expected, f"{len(set(expected) ^ set(got))} v1 windows differ from pandas up to the cut"
    # v2: every window of the input after the cut, once, equal to pandas; no v1 row read
    config_v2 = load_config(v2_dir / "azure.yaml", [*job.overrides, *V2_KEYS])
    rows = drain_job.output_rows(config_v2, "page-counts-v2")
    got_v2 = {(r["page"], r["window_start"][:16]): (int(r["views"]), int(r["user_len"])) for r in rows}
    assert len(rows) == len(got_v2), "a window of the new version was written twice"
    assert got_v2 == _expected_v2(after), "the new version's output is not exactly the input after the cut"
    assert drain_job.intermediate_dead_letters(config_v2) == []
    ended = drain_job.checkpoints(config_v2)
    assert all(c.control.get("finished") for c in ended.values()), ended
    measure(
        f"[event hubs + azure] upgrade without a run id: v1 drained as run {DEFAULT_RUN_ID}, {len(before)} events "
        f"in {len(got)} windows once each; v2 as run {next_run} counted the {len(after)} events after the cut "
        f"in {len(got_v2)} windows, equal pandas"
    )
