"""How long a drain takes: seconds from `weirflow drain --wait` to every processor exited (docs/drain.md).

The two-stage example (examples/pageviews: partition by page, one-minute window counts) runs on the embedded
default with two processors over an unbounded input fed at ``--rate`` events per second. Once it keeps up:

1. **baseline, in the same run**: both processors are stopped with SIGTERM (queries stopped, final checkpoints,
   locks released, processes exit, no flush) and the time to exit is measured: the query stop time;
2. they are started again (same run id, resuming), and once the job keeps up again `weirflow drain --wait`
   runs; the figure is the time from starting that command to both processors exited.

The target is ``value <= 5 * trigger interval + stop time``. The output is checked too: the windows
written equal pandas over the input up to the cut, each written once.

    .venv/bin/python benchmarks/drain.py [--rate 2000] [--partitions 4] [--set KEY=VALUE ...]

The last line is JSON: ``value`` (s), ``unit``, ``trigger_interval_s``, ``intervals`` (value / trigger
interval), ``stop_s`` (baseline), ``extra_s`` (value - stop_s), ``target_s``, ``met``, and the phases seen in the
processors' logs (``noticed_s``, ``first_stage_drained_s``, ``last_task_drained_s``, from the command's start).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.integration import drain_job  # noqa: E402 - the drain tests' feeder and checks
from tests.integration.example_job import EXAMPLE, results  # noqa: E402
from weirflow.base.waiting import wait_until  # noqa: E402
from weirflow.config import load_config  # noqa: E402
from weirflow.local.launcher import start_processor  # noqa: E402

_STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")


def _progress(message: str) -> None:
    print(f"[drain] {message}", file=sys.stderr, flush=True)


def _stamps(logs: list[Path], *needles: str) -> list[float]:
    """Epoch seconds of the log lines containing every one of ``needles`` (processor logs are local time)."""
    found = []
    for path in logs:
        for line in path.read_text(errors="replace").splitlines():
            match = _STAMP.match(line)
            if match and all(n in line for n in needles):
                found.append(dt.datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp())
    return sorted(found)


def _keeps_up(config: Any, feeder: drain_job.Feeder, rate: int) -> bool:
    """Less than a second of input behind, with at least five seconds of it consumed: right after a start
    nothing is consumed and less than a second is sent, which is not keeping up."""
    consumed = results.consumed(config)
    return consumed >= 5 * rate and consumed >= feeder.sent - rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=int, default=2000, help="input events per second")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--trigger-ms", type=int, default=500, help="task.trigger.interval.ms")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a config override (to try a lever); repeatable",
    )
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="weirflow-drain-"))
    overrides = [
        f"job.state.dir={work / 'state'}",
        "app.run.id=bench",
        "streams.page-views.bounded=false",
        f"streams.page-views.partitions={args.partitions}",
        f"streams.page-counts.partitions={args.partitions}",
        f"task.trigger.interval.ms={args.trigger_ms}",
        *args.set,
    ]
    config_path = EXAMPLE / "job.yaml"
    config = load_config(config_path, overrides)
    feeder = drain_job.Feeder(config, args.rate).start()
    procs: list[Any] = []
    try:
        _progress(f"feeding {args.rate} events/s; starting 2 processors (work dir {work})")
        procs = [start_processor(config_path, f"p{i}", overrides, log_dir=work / "logs-1") for i in range(2)]
        wait_until(lambda: all("started task" in p.log_text() for p in procs), 300, "the start", 0.5)
        wait_until(lambda: _keeps_up(config, feeder, args.rate), 300, "the job to keep up", 0.5)
        time.sleep(3)  # steady state: windows closing, both stages busy (a measured phase, not a sync)
        _progress("keeping up; baseline: SIGTERM both processors")
        began = time.monotonic()
        for p in procs:
            p.popen.send_signal(signal.SIGTERM)
        for p in procs:
            assert p.popen.wait(120) == 0, p.log_text()[-3000:]
        stop_s = time.monotonic() - began
        _progress(f"stopped in {stop_s:.2f} s; restarting")

        logs = work / "logs-2"
        procs = [start_processor(config_path, f"p{i}", overrides, log_dir=logs) for i in range(2)]
        wait_until(lambda: all("started task" in p.log_text() for p in procs), 300, "the restart", 0.5)
        wait_until(lambda: _keeps_up(config, feeder, args.rate), 300, "the job to keep up again", 0.5)
        time.sleep(3)
        _progress("keeping up; draining")
        began_wall = time.time()
        began = time.monotonic()
        done = drain_job.drain_command(config_path, overrides, "--wait", "--timeout", "300")
        for p in procs:
            assert p.popen.wait(120) == 0, p.log_text()[-3000:]
        value = time.monotonic() - began
        assert done.returncode == 0, done.stdout + done.stderr
    finally:
        feeder.stop()
        for p in procs:
            if p.alive():
                p.kill()

    log_paths = sorted(logs.glob("*.log"))
    noticed = _stamps(log_paths, "drain requested")
    drained = _stamps(log_paths, " drained: inputs cut or drained")
    first_stage = _stamps(log_paths, "task page_views-", " drained: inputs cut or drained")
    _progress("checking the output against pandas")
    before, after = drain_job.split_at_cut(config, drain_job.input_cut(config))
    got, twice = drain_job.window_counts_once(config)
    equal = got == results.expected_counts(before) and not twice
    trigger_s = args.trigger_ms / 1000
    target = 5 * trigger_s + stop_s
    line = {
        "benchmark": "drain",
        "value": round(value, 2),
        "unit": "s",
        "trigger_interval_s": trigger_s,
        "intervals": round(value / trigger_s, 1),
        "stop_s": round(stop_s, 2),
        "extra_s": round(value - stop_s, 2),
        "target_s": round(target, 2),
        "met": value <= target,
        "rate": args.rate,
        "partitions": args.partitions,
        "overrides": args.set,
        "noticed_s": round(min(noticed) - began_wall, 2) if noticed else None,
        "first_stage_drained_s": round(max(first_stage) - began_wall, 2) if first_stage else None,
        "last_task_drained_s": round(max(drained) - began_wall, 2) if drained else None,
        "events_before_cut": len(before),
        "events_after_cut": len(after),
        "windows_equal_pandas_once_each": equal,
    }
    print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
