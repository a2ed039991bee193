"""Rebuild points of a shared aggregation query's tasks (`weirflow.spark.rebuild`): whatever the order of event
times, the batch cuts and the watermarks, every row of a window still open is at or after the point a task
reads again from, while the marks stay few."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from weirflow.spark.rebuild import MAX_MARKS, RebuildState, add_mark, duration_ms, prune, rebuild_point
from weirflow.spark.shared_progress import NOTHING_BEFORE

LENGTH = 60  # the window's length, in the same units as the event times


def _window_end(t: int) -> int:
    return t - t % LENGTH + LENGTH


def _replay(times: list[int], cuts: list[int], closes: list[int]) -> list[tuple[int, int, int]]:
    """Read ``times`` (one per offset) in batches cut at ``cuts``, the watermark moving on by ``closes`` after each
    batch, with marks as a task's checkpoints keep them; per batch, (rebuild point, closed, batch end)."""
    marks: list[list[int | str]] = [["0", NOTHING_BEFORE]]
    closed, at, points = -1, 0, []
    ends = sorted({min(len(times), c) for c in cuts} | {len(times)})
    for end, step in zip(ends, closes + [0] * len(ends), strict=False):
        latest = max(times[at:end], default=NOTHING_BEFORE)  # the batch's own: the marks keep the maximum
        at = end
        closed += step
        marks = prune(add_mark(marks, str(end), latest, LENGTH // 4), closed, LENGTH)
        assert len(marks) <= MAX_MARKS
        point = rebuild_point(marks, closed, LENGTH)
        points.append((int(point) if point is not None else 0, closed, end))
    return points


@settings(max_examples=300, deadline=None)
@given(
    times=st.lists(st.integers(0, 2_000), min_size=1, max_size=300),
    cuts=st.lists(st.integers(1, 300), max_size=80),
    closes=st.lists(st.integers(0, 120), max_size=80),
)
def test_no_row_of_an_open_window_lies_before_the_rebuild_point(
    times: list[int], cuts: list[int], closes: list[int]
) -> None:
    for point, closed, end in _replay(times, cuts, closes):
        assert point <= end  # never past the checkpoint
        before = [t for t in times[:point] if _window_end(t) > closed]
        assert not before, f"rows of open windows before offset {point} (closed {closed}): {before[:5]}"


def test_a_point_that_forgot_the_window_s_length_would_lose_a_row_of_an_open_window() -> None:
    """The negative control: a row at 70 is in the window [60, 120), still open at a watermark of 100; a mark
    whose latest time is merely at or before the watermark (70 <= 100) is not early enough."""
    marks = prune(add_mark([["0", NOTHING_BEFORE]], "1", 70, LENGTH // 4), 100, LENGTH)
    assert rebuild_point(marks, 100, LENGTH) == "0"
    forgetful = [m for m in marks if int(m[1]) <= 100]
    assert str(forgetful[-1][0]) == "1" and _window_end(70) > 100  # it would start after the open row


def test_marks_stay_few_over_a_long_run_and_the_point_follows_the_watermark() -> None:
    marks: list[list[int | str]] = [["0", NOTHING_BEFORE]]
    for batch in range(1, 5_000):
        closed = batch * 10 - 600  # the watermark ten minutes behind the reads' time
        marks = prune(add_mark(marks, str(batch * 100), batch * 10, LENGTH // 16), closed, LENGTH)
        assert len(marks) <= MAX_MARKS
    point = rebuild_point(marks, 4_999 * 10 - 600, LENGTH)
    assert point is not None and int(point) >= (4_999 - 60 - 6 - 2) * 100  # within a window and a step


def test_a_rebuild_holds_the_watermark_at_closed_until_its_reads_pass_the_checkpoint() -> None:
    state = RebuildState(closed=1_000, until={"local.mid.0": 40, "local.mid.1": 7})
    assert state.cap(5_000) == 1_000 and state.cap(900) == 900 and state.cap(None) is None
    assert not state.over({"local.mid.0": "40", "local.mid.1": "6"})
    assert state.over({"local.mid.0": "41", "local.mid.1": "7"})


def test_window_lengths_are_read_from_spark_s_interval_text() -> None:
    assert duration_ms("1 minute") == 60_000
    assert duration_ms("2 minutes 30 seconds") == 150_000
    assert duration_ms("500 milliseconds") == 500
    assert duration_ms("interval 1 hour") == 3_600_000
    assert duration_ms("1 month") is None  # no fixed length: the stage runs one query per task
    assert duration_ms("soon") is None
