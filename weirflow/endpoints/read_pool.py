"""The threads that taps and conversations read streams on.

A tap or a conversation waits on a system's consumer, a blocking call (SQLite, an SDK's HTTP or AMQP client).
asyncio's default executor is shared by everything on the server's loop and sized for the machine (6 threads on
2 cores): a few taps of quiet streams held all of them, and served-table lookups, which route through the same
loop, queued behind them. Readers therefore get a pool of their own (``endpoints.read.threads``), so however
many clients read, the rest of the server keeps its threads.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from weirflow.base.errors import InvalidArgumentError

T = TypeVar("T")


class ReadPool:
    """A bounded thread pool for blocking stream reads; `run` awaits one call on it."""

    def __init__(self, threads: int) -> None:
        if threads <= 0:
            raise InvalidArgumentError(f"a read pool needs at least one thread, not {threads}")
        self.threads = threads
        self._executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="endpoint-read")

    async def run(self, function: Callable[..., T], *args: object) -> T:
        """``function(*args)`` on one of the pool's threads, awaited from the event loop."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(function, *args))

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
