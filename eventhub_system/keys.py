"""The keys of ``eventhub`` systems (``systems.<name>.*`` with ``systems.<name>.factory: eventhub``), and the
one definition of their defaults that other modules need (`DEFAULT_CONSUMER_GROUP`).

Registered under ``weirflow.config_keys`` as ``eventhub`` (pyproject.toml). Each key names ``system=SYSTEM``:
it applies only to systems whose factory is this plugin, so ``systems.local.prefetch`` is a config error.
This module imports nothing of the Azure SDK: config loading and the reference read it without the extra.
"""

from __future__ import annotations

from weirflow.interfaces.config import ConfigKey

# The plugin's alias in the `weirflow.job.systems` entry-point group.
SYSTEM = "eventhub"
# The consumer group every Event Hub has; the default of `systems.<name>.consumer.group`.
DEFAULT_CONSUMER_GROUP = "$Default"

SECTION = "Event Hubs systems (`eventhub`)"

KEYS: tuple[ConfigKey, ...] = (
    ConfigKey(
        "systems.<name>.connection.string",
        "str",
        None,
        "Namespace connection string (`Endpoint=sb://...;SharedAccessKeyName=...`).",
        SECTION,
        system=SYSTEM,
        secret=True,
    ),
    ConfigKey(
        "systems.<name>.fully.qualified.namespace",
        "str",
        None,
        "`<namespace>.servicebus.windows.net`, to sign in with `DefaultAzureCredential`.",
        SECTION,
        system=SYSTEM,
    ),
    ConfigKey(
        "systems.<name>.partition.method",
        "str",
        "hash",
        "How a keyed record picks its partition: `hash` (the key is the Event Hubs "
        "partition key, routed by the service), `round_robin` (keys ignored), `key_as_partition` (the key is "
        "the partition number).",
        SECTION,
        system=SYSTEM,
    ),
    ConfigKey(
        "systems.<name>.receive.batch.size",
        "int",
        300,
        "Most events one receive call of a partition reader asks the SDK for.",
        SECTION,
        system=SYSTEM,
    ),
    ConfigKey(
        "systems.<name>.send.attempts",
        "int",
        5,
        "Tries of one batch send on transient errors (connection lost, timeout, busy) "
        "before the micro-batch fails.",
        SECTION,
        system=SYSTEM,
    ),
    ConfigKey(
        "systems.<name>.prefetch",
        "int",
        20,
        "Events a partition reader lets the service send ahead (AMQP link credit). The "
        "SDK hands events over only after this many arrive or the stream pauses, so it bounds read latency "
        "on a busy partition (about prefetch / events per second); larger values save round trips.",
        SECTION,
        system=SYSTEM,
    ),
    ConfigKey(
        "systems.<name>.catch-up.prefetch",
        "int",
        300,
        "Link credit of a reader opened to read a backlog of at least this many events "
        "(catching up: round trips matter, latency does not); once it reads near the partition's end it is "
        "reopened with `systems.<name>.prefetch`. 0 turns it off.",
        SECTION,
        system=SYSTEM,
    ),
    ConfigKey(
        "systems.<name>.consumer.group",
        "str",
        DEFAULT_CONSUMER_GROUP,
        "Consumer group the job reads with.",
        SECTION,
        system=SYSTEM,
    ),
)
