"""Count primes below a limit, split across the tasks of one stage: Samza's distributed RPC (docs/endpoints.md).

Every record of the ``http`` stream `work` is a client's message (`weirflow.endpoints.http_system`): ``connect``,
``request`` or ``disconnect``, with the request's JSON ``body`` and, for a fan-out, which ``partition`` of how
many ``tasks`` this copy is for. The stage answers each request with the number of primes n < limit for which
``n % tasks == partition`` — its share — and sends the answer to the same stream, keyed by the connection, which
takes it back to the waiting client. ``{"bye": true}`` ends a WebSocket conversation (``close``).
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

import weirflow

BODY = "limit long, bye boolean"


@F.udf(T.LongType())
def primes_in_share(limit: int | None, partition: int | None, tasks: int | None) -> int:
    """Primes n < limit with n % tasks == partition (trial division by a sieve of small primes)."""
    limit, partition, tasks = limit or 0, partition or 0, max(tasks or 1, 1)
    if limit <= 2:
        return 0
    root = int(limit**0.5) + 1
    sieve = bytearray([1]) * (root + 1)
    sieve[0:2] = b"\x00\x00"
    for i in range(2, int(root**0.5) + 1):
        if sieve[i]:
            sieve[i * i :: i] = bytearray(len(sieve[i * i :: i]))
    small = [i for i in range(2, root + 1) if sieve[i]]
    count = 0
    start = partition if partition >= 2 else partition + tasks * ((2 - partition + tasks - 1) // tasks)
    for n in range(start, limit, tasks):
        if all(n % p for p in small if p * p <= n):
            count += 1
    return count


def answer(messages: DataFrame) -> DataFrame:
    requests = messages.filter(F.col("kind") == "request").withColumn("ask", F.from_json("body", BODY))
    primes = primes_in_share(F.col("ask.limit"), F.col("partition"), F.col("tasks"))
    return requests.select(
        "connection",
        "request",
        F.struct(
            F.col("partition"), F.col("tasks"), F.col("ask.limit").alias("limit"), primes.alias("primes")
        ).alias("body"),
        F.coalesce(F.col("ask.bye"), F.lit(False)).alias("close"),
    )


def pipeline(app: weirflow.App) -> None:
    app.input("work").transform(answer).send_to("work", key="connection")
