"""Send page views to the example's `page-views` stream: ``python views.py N [--users U]``.

View *i* is by user ``u<i mod U>`` of page ``/page/<i mod 97>``, so after N views the latest view of user u is
the largest *i* below N with i mod U = u: easy to check against ``GET /tables/last_view/u<u>``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
from pathlib import Path
from typing import Any

START = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def view(i: int, users: int) -> dict[str, Any]:
    when = START + dt.timedelta(milliseconds=i)
    return {
        "user": f"u{i % users}",
        "page": f"/page/{i % 97}",
        "event_time": when.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
    }


def send(config: Any, first: int, count: int, users: int) -> None:
    """Append views ``first`` .. ``first + count - 1``, keyed by user."""
    from weirflow.interfaces.system import OutgoingRecord, StreamSpec
    from weirflow.job.systems import Systems

    systems = Systems(config)
    try:
        ref = systems.resolve("page-views")
        partitions = int(config.get("streams.page-views.partitions"))
        systems.admin(ref.system).create_stream(StreamSpec(ref.physical, partitions))
        records = [
            OutgoingRecord(ref.physical, json.dumps(v).encode(), key=v["user"].encode())
            for v in (view(i, users) for i in range(first, first + count))
        ]
        producer = systems.producer(ref.system)
        for at in range(0, len(records), 5000):
            producer.send(records[at : at + 5000])
    finally:
        systems.close()


def main() -> None:
    from weirflow.config import load_config

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("count", type=int)
    parser.add_argument("--first", type=int, default=0)
    parser.add_argument("--users", type=int, default=1000)
    parser.add_argument("--config", default=str(Path(__file__).with_name("job.yaml")))
    args = parser.parse_args()
    send(load_config(args.config), args.first, args.count, args.users)
    print(f"sent views {args.first}..{args.first + args.count - 1} of {args.users} users")


if __name__ == "__main__":
    main()
