"""`make run`: the page-view counts job on the embedded default, from generated events to printed results.

Steps: write 200,000 page views (bounded input) into a fresh state directory, run one `weirflow run`
processor until the job finishes (every task reached end-of-stream), then print the busiest pages, the
number of one-minute windows and the events per second.
"""

from __future__ import annotations

import collections
import sys
import tempfile
import time
from pathlib import Path

from rich.progress import MofNCompleteColumn, Progress

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import generate  # noqa: E402
import results  # noqa: E402

from weirflow.config import load_config  # noqa: E402
from weirflow.local.launcher import start_processor  # noqa: E402

CONFIG = HERE / "job.yaml"
EVENTS = 200_000


def main() -> int:
    state = Path(tempfile.mkdtemp(prefix="weirflow-pageviews-"))
    overrides = [f"job.state.dir={state}"]
    config = load_config(CONFIG, overrides)
    print(f"state directory: {state}")
    with Progress(*Progress.get_default_columns(), MofNCompleteColumn(), transient=True) as progress:
        bar = progress.add_task("writing page views", total=EVENTS)
        events = generate.write(config, EVENTS, progress=lambda n: progress.advance(bar, n))
    partitions = config.get("streams.page-views.partitions")
    print(f"wrote {EVENTS:,} page views to local.page-views ({partitions} partitions)")

    started = time.monotonic()
    processor = start_processor(CONFIG, "pageviews-0", overrides, log_dir=state / "logs")
    print(f"started processor {processor.processor_id} (pid {processor.pid}); log: {processor.log_path}")
    with Progress(*Progress.get_default_columns(), MofNCompleteColumn(), transient=True) as progress:
        bar = progress.add_task("counting page views", total=EVENTS)
        while processor.alive():
            progress.update(bar, completed=results.consumed(config))
            time.sleep(0.5)
    elapsed = time.monotonic() - started
    code = processor.terminate()
    if code != 0:
        print(f"the processor failed (exit {code}); last lines of its log:\n{processor.log_text()[-3000:]}")
        return 1

    counts = results.read_counts(config)
    per_page: collections.Counter[str] = collections.Counter()
    for (page, _), views in counts.items():
        per_page[page] += views
    print(f"job finished in {elapsed:.1f} s (Spark start included): {EVENTS / elapsed:,.0f} events/s")
    print(f"{len(counts):,} one-minute windows in page-counts, {sum(counts.values()):,} views counted")
    print("busiest pages:")
    for page, views in per_page.most_common(5):
        print(f"  {page:<10} {views:>7,} views")
    exact = counts == results.expected_counts(events)
    print("window counts equal a pandas computation over the same events:", "yes" if exact else "NO")
    return 0 if exact else 1


if __name__ == "__main__":
    sys.exit(main())
