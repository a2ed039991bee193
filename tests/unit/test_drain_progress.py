"""How `weirflow drain --wait` words a processor's error (`weirflow.ops.drain_progress.brief_error`) and the
progress summary that names what holds a drain up."""

from __future__ import annotations

from weirflow.ops.drain_progress import DRAINED, DRAINING, DrainProgress, brief_error

SPARK_FAILURE = (
    "task page_views-1: query stopped: [STREAM_FAILED] Query [id = 1, runId = 2] terminated with exception: "
    "[PYTHON_EXCEPTION] An exception was thrown from the Python worker. Please see the stack trace below.\n"
    "Traceback (most recent call last):\n"
    '  File "/x/worker.py", line 10, in main\n'
    "    process()\n"
    '  File "one_stage.py", line 16, in checked\n'
    "ValueError: a poison page view: this transform cannot count it\n"
    "\n"
    "\tat org.apache.spark.api.python.PythonRunner.handle(PythonRunner.scala:1)\n"
    "\tat org.apache.spark.SparkException: Job aborted.\n"
)


def test_a_spark_query_s_error_is_told_by_its_task_and_the_python_exception() -> None:
    assert brief_error(SPARK_FAILURE) == (
        "task page_views-1: ValueError: a poison page view: this transform cannot count it"
    )


def test_other_errors_are_their_first_line_within_the_limit() -> None:
    assert brief_error("leader: OSError: disk full\nmore detail") == "leader: OSError: disk full"
    long = brief_error("x" * 1000, limit=50)
    assert len(long) == 50 and long.endswith("...")


def test_the_summary_names_the_tasks_still_draining_and_the_errors() -> None:
    progress = DrainProgress(
        tasks={"a-0": DRAINED, "a-1": DRAINING},
        running_processors=["p0"],
        errors={"p0": "task a-1: ValueError: boom"},
    )
    assert progress.summary() == (
        "1 of 2 tasks drained; still draining: a-1; processors still running: p0; errors: p0: task a-1: "
        "ValueError: boom"
    )
