"""The suite's pytest-xdist scheduler (`tests/support/scheduling.py`): a worker is given a busy file while the
other runs a waiting one and the reverse, waiting files while the class archive is dumped, and its next file
only when one test of its current file is left. Driven as pytest-xdist's controller drives it, with stand-in
workers."""

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
    "tests/contract/test_w1.py": (scheduling.WAITING, 3),
    "tests/contract/test_w2.py": (scheduling.WAITING, 2),
    "tests/unit/test_u1.py": (scheduling.WAITING, 1),
}
COLLECTION = [f"{name}::test_{i}" for name, (_, count) in FILES.items() for i in range(count)]


Controller = Callable[[dict[str, str] | None], tuple[scheduling.PairingScheduling, Worker, Worker]]


@pytest.fixture
def controller() -> Iterator[Controller]:
    """``controller(kinds)``: a scheduler with two workers that collected `COLLECTION`; ``kinds`` is what the
    workers recorded (None: nothing)."""
    config = SimpleNamespace(
        stash=pytest.Stash(), getvalue=lambda name: ["2*popen"], option=SimpleNamespace(loadscopereorder=False)
    )
    scheduling.enable(config)  # type: ignore[arg-type]
    yield lambda kinds: _controller(config, kinds)
    scheduling.disable(config)  # type: ignore[arg-type]


def _controller(
    config: SimpleNamespace, kinds: dict[str, str] | None
) -> tuple[scheduling.PairingScheduling, Worker, Worker]:
    workerinput: dict[str, object] = {}
    scheduling.configure_worker(config, workerinput)  # type: ignore[arg-type]
    if kinds is not None:
        scheduling.record_kinds(SimpleNamespace(workerinput=workerinput), kinds)  # type: ignore[arg-type]
    sched = scheduling.PairingScheduling(config)  # type: ignore[arg-type]
    a, b = Worker("gw0"), Worker("gw1")
    for worker in (a, b):
        sched.add_node(worker)
        sched.add_node_collection(worker, COLLECTION)
    return sched, a, b


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
    # busy files are used up: a takes what is left
    assert _files(a) == ["test_b1.py", "test_b2.py", "test_u1.py"]
    assert not sched.workqueue
    _finish(sched, b, 1)
    assert b.shutting_down


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
