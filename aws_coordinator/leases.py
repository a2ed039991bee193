"""Leader election and task locks as KCL-style counter leases in the coordination table.

One item per lease (``pk = lease``, ``sk = leader`` or ``lock/<name>``) holds the holder (``owner``,
``instance``), the tenure's **epoch** (the fencing token, `Lock.epoch`) and a **counter** that every write
to the item increments: an acquire, each renewal, a release, a break. Every write is conditional on what it
read (the counter, or the holder), so DynamoDB decides every race: at most one holder at a time.

**Expiry without clocks.** A lease has no expiry time in the store. As the Kinesis Client Library does, a
would-be taker remembers when, on *its own* monotonic clock, it first saw the lease's current counter; when
the counter has not moved for ``lease_ms`` since, the holder has stopped renewing and the taker takes the
lease over, conditional on that very counter. No two hosts' clocks are ever compared, so clock skew between
processors cannot make a live holder look dead or a dead one live. The price is that a taker that has just
started must watch a lease for ``lease_ms`` before it may take it; a holder silent past the liveness timeout
has its lease broken at once instead (`break_if_held_by`, `weirflow.coordination.silence`), which is how a
killed processor's tasks move in about the liveness timeout.

A holder learns of a loss on its next renewal (its condition fails) or fence check (`held`, a consistent
read). Observations are shared by every lease of one `Observations`: one per coordination object, so a
processor's repeated tries see the time pass.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from weirflow_aws.clients import COORDINATION, Aws
from weirflow_aws.errors import is_condition_failure

PARTITION = "lease"
LEADER = "leader"
LOCK_PREFIX = "lock/"
_SAME_HOLDER_RACES = 3


class Observations:
    """When this process first saw each lease's current counter, on its monotonic clock."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._seen: dict[str, tuple[int, float]] = {}
        self._clock = clock
        self._lock = threading.Lock()

    def stale_for(self, name: str, counter: int) -> float:
        """Seconds the lease ``name`` has shown ``counter`` to this process (0 when it just moved)."""
        now = self._clock()
        with self._lock:
            seen = self._seen.get(name)
            if seen is None or seen[0] != counter:
                self._seen[name] = (counter, now)
                return 0.0
            return now - seen[1]

    def moved(self, name: str, counter: int) -> None:
        """This process wrote ``counter`` itself: it moved now."""
        with self._lock:
            self._seen[name] = (counter, self._clock())


def _s(value: str) -> dict[str, str]:
    return {"S": value}


def _n(value: int) -> dict[str, str]:
    return {"N": str(value)}


class CounterLease:
    """One lease item, one holder: the `weirflow.interfaces.leases.Lease` behind the leader election and task
    locks (`LeaseLeaderElector`, `LeaseLock`)."""

    def __init__(
        self, aws: Aws, name: str, owner: str, lease_ms: int, instance: str, observations: Observations
    ) -> None:
        self._aws = aws
        self.name = name
        self.owner = owner
        self.instance = instance
        self.lease_ms = lease_ms
        self.epoch = 0
        self._observations = observations

    @property
    def _key(self) -> dict[str, Any]:
        return {"pk": _s(PARTITION), "sk": _s(self.name)}

    def _call(self, operation: str, fn: Callable[[], Any]) -> Any:
        table = self._aws.table(COORDINATION)
        return self._aws.call(operation, f"{table}/{PARTITION}/{self.name}", self._aws.dynamodb_endpoint, fn)

    def _read(self) -> dict[str, Any] | None:
        table = self._aws.table(COORDINATION)
        item = self._aws.dynamodb.get_item(TableName=table, Key=self._key, ConsistentRead=True).get("Item")
        if item is None:
            return None
        return {
            "owner": item["owner"]["S"] if "owner" in item else None,
            "instance": item.get("instance", {}).get("S", ""),
            "counter": int(item["counter"]["N"]),
            "epoch": int(item["epoch"]["N"]),
        }

    def _ours(self, item: dict[str, Any] | None) -> bool:
        return item is not None and item["owner"] == self.owner and item["instance"] == self.instance

    def _update(self, expression: str, condition: str, values: dict[str, Any], names: dict[str, str]) -> bool:
        """One conditional update of the item; whether its condition held."""
        try:
            self._aws.dynamodb.update_item(
                TableName=self._aws.table(COORDINATION),
                Key=self._key,
                UpdateExpression=expression,
                ConditionExpression=condition,
                ExpressionAttributeValues=values,
                ExpressionAttributeNames=names,
            )
        except Exception as exc:
            if is_condition_failure(exc):
                return False
            raise
        return True

    def _take(self, item: dict[str, Any] | None) -> bool:
        """Become the holder in a new tenure, conditional on the item being as read."""
        epoch = (item["epoch"] if item else 0) + 1
        counter = (item["counter"] if item else 0) + 1
        names = {"#o": "owner", "#i": "instance", "#c": "counter", "#e": "epoch"}
        values = {":o": _s(self.owner), ":i": _s(self.instance), ":e": _n(epoch), ":n": _n(counter)}
        if item is None:
            condition = "attribute_not_exists(pk)"
        else:
            condition = "#c = :c"
            values[":c"] = _n(item["counter"])
        if not self._update("SET #o = :o, #i = :i, #e = :e, #c = :n", condition, values, names):
            return False
        self.epoch = epoch
        self._observations.moved(self.name, counter)
        return True

    def acquire(self) -> bool:
        def attempt() -> bool:
            item = self._read()
            if self._ours(item):
                assert item is not None
                renewed = self._renewed(item)  # the same tenure goes on
                if renewed is not None:
                    self.epoch = renewed["epoch"]
                    return True
                return False
            if item is None or item["owner"] is None:
                return self._take(item)
            if self._observations.stale_for(self.name, item["counter"]) * 1000 >= self.lease_ms:
                return self._take(item)  # its holder stopped renewing: the counter stood still for a lease
            return False

        return bool(self._call("acquire lease", attempt))

    def _renewed(self, item: dict[str, Any] | None) -> dict[str, Any] | None:
        """Increment the counter of ``item``, ours as read, conditional on holder and counter; the item as renewed,
        or None once it is no longer ours. Another write of this same holder (a second thread renewing) may move
        the counter between the read and the write: then it is read again, a few times at most."""
        for _ in range(_SAME_HOLDER_RACES):
            if item is None or not self._ours(item):
                return None
            counter = item["counter"] + 1
            if self._update(
                "SET #c = :n",
                "#o = :o AND #i = :i AND #c = :c",
                {":o": _s(self.owner), ":i": _s(self.instance), ":c": _n(item["counter"]), ":n": _n(counter)},
                {"#o": "owner", "#i": "instance", "#c": "counter"},
            ):
                self._observations.moved(self.name, counter)
                return {**item, "counter": counter}
            item = self._read()
        return None

    def renew(self) -> bool:
        """Increment the counter if we still hold the lease, in our tenure when we know it: one write conditional
        on the holder (and the epoch), no read, so a renewal costs one request."""
        names = {"#o": "owner", "#i": "instance", "#c": "counter"}
        values = {":o": _s(self.owner), ":i": _s(self.instance), ":one": _n(1)}
        condition = "#o = :o AND #i = :i"
        if self.epoch:
            condition += " AND #e = :e"  # ours again in a later tenure would not be this object's tenure
            names["#e"] = "epoch"
            values[":e"] = _n(self.epoch)

        def attempt() -> bool:
            try:
                reply = self._aws.dynamodb.update_item(
                    TableName=self._aws.table(COORDINATION),
                    Key=self._key,
                    UpdateExpression="SET #c = #c + :one",
                    ConditionExpression=condition,
                    ExpressionAttributeNames=names,
                    ExpressionAttributeValues=values,
                    ReturnValues="UPDATED_NEW",
                )
            except Exception as exc:
                if is_condition_failure(exc):
                    return False
                raise
            self._observations.moved(self.name, int(reply["Attributes"]["counter"]["N"]))
            return True

        return bool(self._call("renew lease", attempt))

    def _end(self, owner: str, instance: str) -> bool:
        return self._update(
            "REMOVE #o, #i SET #c = #c + :one",
            "#o = :o AND #i = :i",
            {":o": _s(owner), ":i": _s(instance), ":one": _n(1)},
            {"#o": "owner", "#i": "instance", "#c": "counter"},
        )

    def release(self) -> None:
        self._call("release lease", lambda: self._end(self.owner, self.instance))

    def held(self, epoch: int | None = None) -> bool:
        def attempt() -> bool:
            item = self._read()
            return self._ours(item) and (epoch is None or (item is not None and item["epoch"] == epoch))

        return bool(self._call("check lease", attempt))

    def break_if_held_by(self, owner: str, instance: str) -> bool:
        """End the tenure of (``owner``, ``instance``) at once, conditional on it holding the lease; a tenure
        begun since names another holder (or the same holder again after the break: then the epoch of that
        tenure is greater, and the fence refuses the broken tenure's writes all the same)."""
        return bool(self._call("break lease", lambda: self._end(owner, instance)))

    def holder(self) -> str | None:
        def attempt() -> str | None:
            item = self._read()
            if item is None or item["owner"] is None:
                return None
            if self._observations.stale_for(self.name, item["counter"]) * 1000 >= self.lease_ms:
                return None  # not renewed for a lease, as this process saw it
            return str(item["owner"])

        return self._call("read lease", attempt)
