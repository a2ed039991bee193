"""Run ids per deployment (`weirflow.job.runs`): which run a processor joins when the config sets no `app.run.id`,
the deployment fingerprint, and the record the leader marks when a run ends (SQLite metadata store; the
record is one etag-guarded document, the same on every backend's store)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from weirflow.config.loader import Config, load_config
from weirflow.job.drain_notice import DEFAULT_RUN_ID
from weirflow.job.runs import RUN_KEY, RunBook, current_run_id, deployment_of
from weirflow.local.metadata import SqliteMetadataStore

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def book(tmp_path: Path) -> RunBook:
    store = SqliteMetadataStore(tmp_path / "job.db")
    store.start()
    return RunBook(store)


def test_the_first_deployment_runs_as_default_and_its_processors_join_it(book: RunBook) -> None:
    first = book.resolve("v1")
    assert first.run_id == DEFAULT_RUN_ID and not first.superseded
    assert book.resolve("v1").run_id == DEFAULT_RUN_ID  # a second processor, a restart
    # a changed processor joining a running deployment (a rolling, compatible change) joins its run
    assert book.resolve("v1-tweaked").run_id == DEFAULT_RUN_ID


def test_after_a_drain_a_changed_job_gets_a_new_run_and_the_same_job_finishes(book: RunBook) -> None:
    book.resolve("v1")
    book.mark_ended(DEFAULT_RUN_ID, "drained")
    restarted = book.resolve("v1")
    assert restarted.run_id == DEFAULT_RUN_ID and not restarted.superseded  # the drained run: nothing to do
    upgraded = book.resolve("v2")
    assert upgraded.run_id not in (DEFAULT_RUN_ID, "") and not upgraded.superseded
    assert book.resolve("v2").run_id == upgraded.run_id
    # an old replica that outlived its upgrade is told so, and the record is untouched
    old = book.resolve("v1")
    assert old.superseded and old.run_id == upgraded.run_id
    assert book.current() == upgraded.run_id


def test_a_finished_run_is_left_the_same_way(book: RunBook) -> None:
    book.resolve("v1")
    book.mark_ended(DEFAULT_RUN_ID, "finished")
    assert book.resolve("v2").run_id != DEFAULT_RUN_ID


def test_processors_of_a_new_deployment_starting_together_agree_on_one_run(tmp_path: Path) -> None:
    store = SqliteMetadataStore(tmp_path / "job.db")
    store.start()
    RunBook(store).resolve("v1")
    RunBook(store).mark_ended(DEFAULT_RUN_ID, "drained")
    chosen: list[str] = []
    barrier = threading.Barrier(8)

    def start() -> None:
        barrier.wait()
        chosen.append(RunBook(store).resolve("v2").run_id)

    threads = [threading.Thread(target=start) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(chosen) == 8 and len(set(chosen)) == 1 and chosen[0] != DEFAULT_RUN_ID


def test_an_explicit_run_id_wins_and_is_recorded_only_over_an_ended_run(book: RunBook) -> None:
    assert book.resolve("v1", explicit="blue").run_id == "blue"
    assert book.current() == "blue"
    assert book.resolve("v2", explicit="green").run_id == "green"  # blue still runs: not recorded over it
    assert book.current() == "blue"
    book.mark_ended("blue", "drained")
    assert book.resolve("v2", explicit="green").run_id == "green"
    assert book.current() == "green"
    assert book.resolve("v1").superseded  # blue's deployment, without a run id, after green took over


def test_marking_another_run_ended_changes_nothing(book: RunBook) -> None:
    book.resolve("v1")
    book.mark_ended("some-other-run", "drained")
    assert book.resolve("v2").run_id == DEFAULT_RUN_ID  # default has not ended: v2 joins it


def test_a_malformed_record_is_read_as_none_and_replaced(book: RunBook, tmp_path: Path) -> None:
    store = SqliteMetadataStore(tmp_path / "job.db")
    store.put(RUN_KEY, {"run-id": 7})
    assert RunBook(store).current() == DEFAULT_RUN_ID
    assert RunBook(store).resolve("v1").run_id == DEFAULT_RUN_ID
    assert RunBook(store).read()[0] is not None


def test_commands_address_the_configs_run_id_else_the_recorded_one(book: RunBook, tmp_path: Path) -> None:
    store = SqliteMetadataStore(tmp_path / "job.db")
    config = Config.from_dict({"job.name": "j"})
    assert current_run_id(config, store) == DEFAULT_RUN_ID
    RunBook(store).resolve("v1")
    RunBook(store).mark_ended(DEFAULT_RUN_ID, "drained")
    run = RunBook(store).resolve("v2").run_id
    assert current_run_id(config, store) == run
    assert current_run_id(Config.from_dict({"job.name": "j", "app.run.id": "mine"}), store) == "mine"


def _pageviews(tmp_path: Path, *overrides: str) -> Config:
    return load_config(ROOT / "examples" / "pageviews" / "job.yaml", [f"job.state.dir={tmp_path}", *overrides])


def test_the_fingerprint_sees_config_and_code_but_not_what_differs_between_processors(tmp_path: Path) -> None:
    base = deployment_of(_pageviews(tmp_path))
    assert base == deployment_of(_pageviews(tmp_path))
    # per-process keys: the same deployment
    assert base == deployment_of(_pageviews(tmp_path / "other", "processor.id=p2", "endpoints.port=9000"))
    # a job-wide key: another deployment
    assert base != deployment_of(_pageviews(tmp_path, "job.coordinator.poll.interval.ms=777"))
    # set by hand: that alone
    assert deployment_of(_pageviews(tmp_path, "app.deployment.id=rev-7")) == "rev-7"


def test_the_fingerprint_covers_the_jobs_code(tmp_path: Path) -> None:
    (tmp_path / "myjob.py").write_text("def build(app):\n    pass\n")
    (tmp_path / "job.yaml").write_text("job:\n  name: j\napp:\n  pipeline: myjob:build\n")
    before = deployment_of(load_config(tmp_path / "job.yaml"))
    (tmp_path / "myjob.py").write_text("def build(app):\n    return None  # changed\n")
    assert deployment_of(load_config(tmp_path / "job.yaml")) != before
