"""The suite's pytest-xdist scheduler (`tests/support/scheduling.py`): with two workers a worker is given a busy
file while the other runs a waiting one and the reverse; with three, at most two busy files run at once; waiting
files while the class archive is dumped; a worker's next file only when one test of its current file is left.
Driven as pytest-xdist's controller drives it, with stand-in workers. And the file order of `tests/conftest.py`:
the longest files first within their kind."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.support import scheduling, spark_jvm


class Worker:
    """What the scheduler uses of a pytest-xdist worker: it is sent test indexes and may be shut down."""

    def __init__(self, name: str) -> None:
        self.gateway = SimpleNamespace(id=name)
        self.shutting_down = False
        self.sent: list[int] = []

    def send_runtest_some(self, indexes: list[int]) -> None:
        self.sent += indexes

    def shutdown(self) -> None:
        self.shutting_down = True


FILES = {
    "tests/integration/test_b1.py": (scheduling.BUSY, 3),
    "tests/integration/test_b2.py": (scheduling.BUSY, 2),
    "tests/integration/test_b3.py": (scheduling.BUSY, 1),
    "tests/contract/test_w1.py": (scheduling.WAITING, 3),
    "tests/contract/test_w2.py": (scheduling.WAITING, 2),
    "tests/unit/test_u1.py": (scheduling.WAITING, 1),
}
COLLECTION = [f"{name}::test_{i}" for name, (_, count) in FILES.items() for i in range(count)]


Controller = Callable[..., tuple[scheduling.PairingScheduling, ...]]


@pytest.fixture
def controller() -> Iterator[Controller]:
    """``controller(kinds, workers=2)``: a scheduler and its workers, which collected `COLLECTION`; ``kinds`` is
    what the workers recorded (None: nothing)."""
    config = SimpleNamespace(stash=pytest.Stash(), option=SimpleNamespace(loadscopereorder=False))
    scheduling.enable(config)  # type: ignore[arg-type]
    yield lambda kinds, workers=2: _controller(config, kinds, workers)
    scheduling.disable(config)  # type: ignore[arg-type]


def _controller(
    config: SimpleNamespace, kinds: dict[str, str] | None, workers: int
) -> tuple[scheduling.PairingScheduling, ...]:
    workerinput: dict[str, object] = {}
    scheduling.configure_worker(config, workerinput)  # type: ignore[arg-type]
    if kinds is not None:
        scheduling.record_kinds(SimpleNamespace(workerinput=workerinput), kinds)  # type: ignore[arg-type]
    config.getvalue = lambda name: [f"{workers}*popen"]  # pytest-xdist counts the workers it waits for from -n
    sched = scheduling.PairingScheduling(config)  # type: ignore[arg-type]
    nodes = [Worker(f"gw{i}") for i in range(workers)]
    for worker in nodes:
        sched.add_node(worker)
        sched.add_node_collection(worker, COLLECTION)
    return (sched, *nodes)


def _files(worker: Worker) -> list[str]:
    """The files the worker was sent, in order."""
    return list(dict.fromkeys(COLLECTION[i].split("::")[0].split("/")[-1] for i in worker.sent))


def _finish(sched: scheduling.PairingScheduling, worker: Worker, count: int) -> None:
    """The worker reports its next ``count`` tests done, in the order it was sent them."""
    done = sum(all_done for unit in sched.assigned_work[worker].values() for all_done in unit.values())
    for index in worker.sent[done : done + count]:
        sched.mark_test_complete(worker, index)  # type: ignore[arg-type]


@pytest.fixture(autouse=True)
def _no_dump(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(spark_jvm.DUMP_STATUS_ENV, raising=False)


def test_a_busy_file_is_paired_with_a_waiting_one_and_the_next_file_is_chosen_when_one_test_is_left(
    controller: Controller,
) -> None:
    sched, a, b = controller({name: kind for name, (kind, _) in FILES.items()})
    sched.schedule()
    # load-file scheduling in this order would give both workers a busy file
    assert (_files(a), _files(b)) == (["test_b1.py"], ["test_w1.py"])

    _finish(sched, a, 1)
    assert _files(a) == ["test_b1.py"], "two tests of b1 are left: no next file yet"
    _finish(sched, a, 1)
    # b is still on w1 (waiting): a's next file is the next busy one
    assert _files(a) == ["test_b1.py", "test_b2.py"]

    _finish(sched, b, 2)
    # a runs b1's last test, then b2 (busy): b's next file is the next waiting one, not the unit file after it
    assert _files(b) == ["test_w1.py", "test_w2.py"]

    _finish(sched, a, 3)
    # b is on w2 (waiting): a takes b3; then busy files are used up and a takes what is left
    assert _files(a) == ["test_b1.py", "test_b2.py", "test_b3.py", "test_u1.py"]
    assert not sched.workqueue
    _finish(sched, b, 1)
    assert b.shutting_down


def test_with_three_workers_at_most_two_run_busy_files_at_once(controller: Controller) -> None:
    sched, a, b, c = controller({name: kind for name, (kind, _) in FILES.items()}, workers=3)
    sched.schedule()
    # b3 is next in line, but two workers run busy files already
    assert (_files(a), _files(b), _files(c)) == (["test_b1.py"], ["test_b2.py"], ["test_w1.py"])

    _finish(sched, a, 2)
    # one other worker (b) runs a busy file: a's next file is busy too
    assert _files(a) == ["test_b1.py", "test_b3.py"]
    _finish(sched, c, 2)
    # a and b run busy files: c's next file is waiting
    assert _files(c) == ["test_w1.py", "test_w2.py"]


def test_while_the_class_archive_is_dumped_both_workers_take_waiting_files(
    controller: Controller, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(spark_jvm.DUMP_STATUS_ENV, str(tmp_path / "status.json"))
    sched, a, b = controller({name: kind for name, (kind, _) in FILES.items()})
    sched.schedule()
    assert (_files(a), _files(b)) == (["test_w1.py"], ["test_w2.py"])

    (tmp_path / "status.json").write_text('{"archive": "x.jsa"}')  # the dump is done
    _finish(sched, b, 1)
    # a runs w1 (waiting): b's next file is busy
    assert _files(b) == ["test_w2.py", "test_b1.py"]


def test_without_the_workers_kinds_files_go_out_in_order(controller: Controller) -> None:
    sched, a, b = controller(None)
    sched.schedule()
    assert (_files(a), _files(b)) == (["test_b1.py"], ["test_b2.py"])


def test_the_longest_files_go_first_within_their_kind() -> None:
    from tests import conftest

    root = Path(__file__).resolve().parents[2]
    assert [name for name in conftest.LONGEST_FIRST if not (root / name).is_file()] == []
    spark = SimpleNamespace(name="spark")

    def item(nodeid: str, busy: bool) -> SimpleNamespace:
        return SimpleNamespace(
            nodeid=nodeid, get_closest_marker=lambda name: spark if busy and name == "spark" else None
        )

    longest_busy = next(
        name for name in conftest.LONGEST_FIRST if name.startswith("tests/integration/test_kinesis")
    )
    longest_waiting = next(name for name in conftest.LONGEST_FIRST if name.startswith("tests/contract/"))
    items = [
        item("tests/unit/test_u.py::test_a", False),
        item("tests/integration/test_b.py::test_a", True),
        item("tests/contract/test_w.py::test_a", False),
        item(f"{longest_waiting}::test_a", False),
        item(f"{longest_busy}::test_a", True),
        item(f"{longest_busy}::test_b", True),
    ]
    conftest.pytest_collection_modifyitems(SimpleNamespace(), items)  # type: ignore[arg-type]
    assert [i.nodeid for i in items] == [
        f"{longest_busy}::test_a",
        f"{longest_busy}::test_b",
        "tests/integration/test_b.py::test_a",
        f"{longest_waiting}::test_a",
        "tests/contract/test_w.py::test_a",
        "tests/unit/test_u.py::test_a",
    ]
