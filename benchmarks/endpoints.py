"""Served-table key lookups through a processor that does not own the key (target: docs/endpoints.md).

Starts the served-table example (`examples/endpoints`: the latest page view per user, 4 tasks) as two
`weirflow run` processors on the embedded default, sends ``--views`` views of ``--users`` users, waits until
the table holds every user's latest view, then sends ``GET /tables/last_view/<user>`` at ``--rps`` requests per
second for ``--seconds`` to the processor that does **not** own the users asked for, so every request is
proxied to the owner. Then, in the same run, the same load straight to the owner (the baseline: what routing
costs is the difference).

The load is open-loop: request *i* is due at ``start + i / rps`` and its latency counts from then, so a slow
server shows as latency rather than as fewer requests (no coordinated omission). The client is a small
asyncio HTTP/1.1 client over ``--connections`` keep-alive connections, so that the client's own cost stays far
below the server's on this 2-core machine. Every answer is checked against the view the user's latest is
known to be: a wrong row, a non-200 status or a failed request is an error.

Prints progress, then one JSON line last::

    {"figure": "served-table lookups through a non-owner", "unit": "ms", "value": <p99>, "p50_ms": ...,
     "p99_ms": ..., "rps": ..., "errors": 0, "requests": ..., "target_rps": 1000, "target_p99_ms": 10,
     "baseline": {"what": "same load straight to the owner", "p50_ms": ..., "p99_ms": ..., "rps": ...}}

Usage: ``python benchmarks/endpoints.py [--rps 1000] [--seconds 20] [--views 20000] [--users 2000]``.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import shutil
import statistics
import sys
import tempfile
import time
import urllib.request
import zlib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "endpoints"
_spec = importlib.util.spec_from_file_location("endpoints_example_views", EXAMPLE / "views.py")
assert _spec is not None and _spec.loader is not None
_views = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_views)
send, view = _views.send, _views.view

from weirflow.base.waiting import wait_until  # noqa: E402
from weirflow.cli import status_document  # noqa: E402
from weirflow.config import load_config  # noqa: E402
from weirflow.local.launcher import start_processor  # noqa: E402

STAGE, TABLE, PARTITIONS = "views_by_user", "last_view", 4


def expected_rows(views: int, users: int) -> dict[str, dict[str, Any]]:
    """Each user's latest view after views 0 .. views-1."""
    return {f"u{u}": view(max(i for i in range(u, views, users)), users) for u in range(min(users, views))}


def owner_task(user: str) -> str:
    return f"{STAGE}-{zlib.crc32(user.encode()) % PARTITIONS}"


def get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


class Connection:
    """One keep-alive HTTP/1.1 connection: GET and read the answer (Content-Length bodies only)."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def get(self, path: str) -> tuple[int, bytes]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        assert self.reader is not None
        self.writer.write(f"GET {path} HTTP/1.1\r\nHost: {self.host}\r\n\r\n".encode())
        head = await self.reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        length = next(int(v) for k, _, v in (x.partition(":") for x in lines[1:]) if k.lower() == "content-length")
        return status, await self.reader.readexactly(length)


async def drive(
    base: str, users: list[str], expected: dict[str, bytes], rps: float, seconds: float, connections: int
) -> dict[str, Any]:
    """Open-loop load: request i due at start + i/rps, latency from its due time."""
    host, port = base.removeprefix("http://").split(":")
    total = int(rps * seconds)
    latencies: list[float] = []
    errors = 0
    queue: asyncio.Queue[int] = asyncio.Queue()
    start = time.perf_counter() + 0.05

    async def schedule() -> None:
        for i in range(total):
            delay = start + i / rps - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            queue.put_nowait(i)
        for _ in range(connections):
            queue.put_nowait(-1)

    async def worker() -> None:
        nonlocal errors
        conn = Connection(host, int(port))
        while (i := await queue.get()) >= 0:
            user = users[i % len(users)]
            try:
                status, body = await conn.get(f"/tables/{TABLE}/{user}")
                ok = status == 200 and json.loads(body) == json.loads(expected[user])
            except Exception:
                ok, conn = False, Connection(host, int(port))
            latencies.append((time.perf_counter() - (start + i / rps)) * 1000)
            errors += not ok

    await asyncio.gather(schedule(), *(worker() for _ in range(connections)))
    elapsed = time.perf_counter() - start
    cuts = statistics.quantiles(latencies, n=100, method="inclusive")
    return {
        "p50_ms": round(cuts[49], 2),
        "p99_ms": round(cuts[98], 2),
        "max_ms": round(max(latencies), 2),
        "rps": round(total / elapsed, 1),
        "requests": total,
        "errors": errors,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rps", type=float, default=1000)
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--views", type=int, default=20000)
    parser.add_argument("--users", type=int, default=2000)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--profile", help="py-spy the entry processor during the routed run, raw output here")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="weirflow-endpoints-"))
    for name in ("job.yaml", "pipeline.py", "views.py"):
        shutil.copy(EXAMPLE / name, work / name)
    config_path = work / "job.yaml"
    config = load_config(config_path)
    send(config, 0, args.views, args.users)
    print(f"sent {args.views} views of {args.users} users", file=sys.stderr)
    processors = [start_processor(config_path, f"p{i}") for i in range(2)]
    try:

        def table_ready() -> bool:
            doc = status_document(config)
            urls = {p["processor_id"]: p.get("endpoint") for p in doc["processors"] if p["live"]}
            if len(urls) < 2 or not all(urls.values()) or len(doc["assignment"]) < 2:
                return False
            last = f"u{args.users - 1}"
            status, body = get(f"{next(iter(urls.values()))}/tables/{TABLE}/{last}")
            return status == 200 and json.loads(body) == expected[last]

        expected = expected_rows(args.views, args.users)
        took = wait_until(table_ready, 300, "the served table to hold every user's latest view", interval_s=1)
        print(f"table ready after {took:.1f} s", file=sys.stderr)
        doc = status_document(config)
        urls = {p["processor_id"]: p["endpoint"] for p in doc["processors"] if p["live"]}
        owner_of = {t: p for p, tasks in doc["assignment"].items() for t in tasks}
        # the processor owning the fewest table tasks is the entry; the users asked for are owned by the other
        counts = {p: sum(owner_of.get(f"{STAGE}-{n}") == p for n in range(PARTITIONS)) for p in urls}
        entry = min(counts, key=lambda p: counts[p])
        owner = next(p for p in urls if p != entry)
        users = [u for u in expected if owner_of[owner_task(u)] == owner]
        bodies = {u: json.dumps(expected[u]).encode() for u in users}
        print(f"entry {entry} ({urls[entry]}), owner {owner} of {len(users)} users", file=sys.stderr)
        asyncio.run(drive(urls[entry], users, bodies, args.rps, 2, args.connections))  # warm-up
        if args.profile:
            import subprocess

            pid = next(p.pid for p in processors if p.processor_id == entry)
            subprocess.Popen(["py-spy", "record", "-p", str(pid), "-d", "8", "-f", "raw", "-o", args.profile])
        routed = asyncio.run(drive(urls[entry], users, bodies, args.rps, args.seconds, args.connections))
        print(f"through the non-owner: {routed}", file=sys.stderr)
        direct = asyncio.run(drive(urls[owner], users, bodies, args.rps, args.seconds, args.connections))
        print(f"straight to the owner: {direct}", file=sys.stderr)
    finally:
        for p in processors:
            p.terminate()
        shutil.rmtree(work, ignore_errors=True)
    print(
        json.dumps(
            {
                "figure": "served-table lookups through a non-owner",
                "unit": "ms",
                "value": routed["p99_ms"],
                "p50_ms": routed["p50_ms"],
                "p99_ms": routed["p99_ms"],
                "max_ms": routed["max_ms"],
                "rps": routed["rps"],
                "errors": routed["errors"],
                "requests": routed["requests"],
                "target_rps": args.rps,
                "target_p99_ms": 10,
                "baseline": {"what": "same load straight to the owner", **direct},
            }
        )
    )


if __name__ == "__main__":
    main()
