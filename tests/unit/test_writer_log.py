"""The processors' `wrote task=` lines (weirflow/spark/writer_log.py): the logged format reads back, and two
writers of one task count as overlapping exactly while both tenures are open."""

from __future__ import annotations

from weirflow.spark.writer_log import WROTE, WROTE_FORMAT, overlap_ms


def _line(task: str, batch: int, epoch: int, processor: str, start: int, end: int) -> str:
    return "2026-11-27 INFO [p] weirflow.spark: " + WROTE_FORMAT % (task, batch, epoch, processor, start, end)


def test_the_logged_line_reads_back() -> None:
    match = WROTE.search(_line("views_by_page-1", 12, 3, "p0", 1000, 1800))
    assert match is not None
    assert match.groupdict() == {
        "task": "views_by_page-1",
        "batch": "12",
        "epoch": "3",
        "processor": "p0",
        "start": "1000",
        "end": "1800",
    }


def test_a_handover_after_the_last_batch_is_no_overlap_and_a_write_during_it_is() -> None:
    first = "\n".join([_line("t-0", 0, 1, "p0", 1000, 1500), _line("t-0", 1, 1, "p0", 1500, 2000)])
    after = _line("t-0", 2, 2, "p1", 2000, 2600)
    assert overlap_ms([first, after]) == (0, 3)
    during = _line("t-0", 2, 2, "p1", 1900, 2600)
    assert overlap_ms([first, during]) == (100, 3)
    # another task's writers never overlap this one's; the same writer's batches are one tenure
    assert overlap_ms([first, _line("t-1", 0, 1, "p1", 1200, 1400)]) == (0, 3)


def test_no_line_measures_nothing() -> None:
    assert overlap_ms(["a log without batches"]) == (None, 0)
