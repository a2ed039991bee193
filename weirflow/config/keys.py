"""Core's configuration keys (name, type, default, meaning).

`KEYS` are the keys core reads. A plugin declares its own keys in its own package and registers them under
the ``weirflow.config_keys`` entry-point group (`weirflow.interfaces.config` says how; the embedded default,
`weirflow.local.keys`, registers its keys the same way). `weirflow.config.registry.registered_keys()` is core's
plus every plugin's: the loader validates against it and `docs/configuration.md` is rendered from it
(``weirflow config-reference``; a test keeps the two identical). Keys containing ``<name>`` or ``<id>`` are
patterns: the placeholder matches one dotted segment (``systems.<name>.factory`` matches
``systems.local.factory``). Keys under a `FREE_PREFIXES` prefix (``spark.``) are passed through unchecked.
"""

from __future__ import annotations

from weirflow.config.stream_keys import STREAM_KEYS
from weirflow.interfaces.config import ConfigKey, KeyType

__all__ = ["FREE_PREFIXES", "KEYS", "ConfigKey", "KeyType"]

# Prefixes whose keys are passed through to another component without validation.
FREE_PREFIXES: tuple[str, ...] = ("spark.",)

_J = "Job"
_C = "Coordination"
_T = "Tasks and checkpoints"
_S = "Systems and streams"
_E = "Network endpoints"

KEYS: tuple[ConfigKey, ...] = (
    ConfigKey(
        "endpoints.enabled",
        "bool",
        True,
        "Run the processor's HTTP server (`/healthz`, `/status`, `/metrics`; docs/endpoints.md).",
        _E,
    ),
    ConfigKey(
        "endpoints.host",
        "str",
        "127.0.0.1",
        "Address the HTTP server binds to. Loopback by default; any other address requires "
        "`endpoints.auth.token`.",
        _E,
    ),
    ConfigKey(
        "endpoints.port",
        "int",
        0,
        "Port of the HTTP server; 0 picks a free one (registered with the processor's row, so others find it).",
        _E,
    ),
    ConfigKey(
        "endpoints.advertised.url",
        "str",
        None,
        "The URL other processors and clients use to reach this one (behind a container's port mapping or a "
        "load balancer); default `http://<host>:<port>`.",
        _E,
    ),
    ConfigKey(
        "endpoints.auth.token",
        "str",
        None,
        "Bearer token every request must carry (`Authorization: Bearer ...`); set it from the environment "
        "(`${WEIRFLOW_ENDPOINTS_TOKEN}`). Never logged.",
        _E,
        secret=True,
    ),
    ConfigKey(
        "endpoints.route.wait.ms",
        "int",
        2000,
        "How long a request for a key (served tables) waits while its task has no serving processor (a "
        "rebalance, a failover), re-routing as the job model changes, before it gets 503 with `Retry-After`.",
        _E,
    ),
    ConfigKey(
        "endpoints.tap.queue.size",
        "int",
        10_000,
        "Messages a tap (`WS /tap/<stream>`) may hold for a client that reads slower than the stream is "
        "written; past it the client is disconnected (close code 1008, reason 'client too slow').",
        _E,
    ),
    ConfigKey(
        "endpoints.rpc.timeout.ms",
        "duration_ms",
        10_000,
        "How long `POST /rpc/<stream>` gathers replies (then answers with `partial: true`) and `POST "
        "/http/<stream>` waits for its response (then 504); a request may set `?timeout_ms=`.",
        _E,
    ),
    ConfigKey(
        "endpoints.rpc.timeout.max.ms",
        "duration_ms",
        300_000,
        "The largest `?timeout_ms=` a request to `POST /rpc/<stream>` or `/http/<stream>` may ask for; a larger "
        "or non-positive one is refused with 400.",
        _E,
    ),
    ConfigKey(
        "endpoints.request.max.bytes",
        "int",
        1_048_576,
        "Largest request body the HTTP server accepts (`POST /rpc`, `POST /http`, WebSocket messages); a larger "
        "one is refused with 413 before it is read, so nothing of it is kept or written.",
        _E,
    ),
    ConfigKey(
        "endpoints.tap.max",
        "int",
        16,
        "Taps (`WS /tap/<stream>`) one processor serves at a time; one more is refused with 429.",
        _E,
    ),
    ConfigKey(
        "endpoints.conversations.max",
        "int",
        1_000,
        "Requests to `/rpc/<stream>` and `/http/<stream>` one processor waits on at a time (HTTP and WebSocket "
        "together); one more is refused with 429 and `Retry-After`.",
        _E,
    ),
    ConfigKey(
        "endpoints.allowed.origins",
        "list",
        [],
        "Browser origins (`https://ops.example.com`) allowed to open WebSockets and send `POST` requests, besides "
        "the server's own (its bound and advertised addresses). A request whose `Origin` is neither is refused "
        "with 403, so a web page open on the machine cannot tap streams or call the job.",
        _E,
    ),
    ConfigKey(
        "endpoints.allowed.hosts",
        "list",
        [],
        "Host names clients reach the server by besides its addresses (`Host` header, no port): a load "
        "balancer's or a platform ingress's name, such as the container app's FQDN (infra/). Any other name is "
        "refused with 421 (DNS rebinding guard).",
        _E,
    ),
    ConfigKey(
        "endpoints.history.interval.ms",
        "int",
        5_000,
        "How often each processor samples its tasks' throughput and lag for `GET /status/history` and the status "
        "page's charts (kept in memory only).",
        _E,
    ),
    ConfigKey(
        "endpoints.history.window.ms",
        "int",
        600_000,
        "How far back those samples go: the status page charts this window, and older samples are dropped.",
        _E,
    ),
    ConfigKey(
        "endpoints.read.threads",
        "int",
        4,
        "Threads of the pool that taps and conversations read streams on; lookups and the processor's own work "
        "use other threads, so readers can never starve them.",
        _E,
    ),
    ConfigKey(
        "metrics.export",
        "str",
        "none",
        "Where every processor also pushes its `/metrics` samples: `none`, or `azure-monitor` (OpenTelemetry to "
        "Application Insights; the `monitor` extra, connection string in $APPLICATIONINSIGHTS_CONNECTION_STRING; "
        'docs/deploy.md, "Telemetry").',
        _E,
    ),
    ConfigKey(
        "metrics.export.interval.ms",
        "duration_ms",
        60_000,
        "How often `metrics.export` pushes the samples (Azure Monitor keeps one point per minute).",
        _E,
    ),
    # --- Job -------------------------------------------------------------------------------------------
    ConfigKey(
        "job.name", "str", None, "Name of the job; with `job.id` it names every store resource.", _J, required=True
    ),
    ConfigKey("job.id", "str", "1", "Instance of the job, to run several copies of one job side by side.", _J),
    ConfigKey(
        "job.state.dir",
        "str",
        ".weirflow",
        "Directory for local state (embedded databases, Spark checkpoints). Relative paths are resolved "
        "against the directory of the config file.",
        _J,
    ),
    ConfigKey("job.default.system", "str", "local", "System of streams that name no `streams.<id>.system`.", _J),
    ConfigKey(
        "processor.id",
        "str",
        None,
        "Identity of this processor; default `<host>-<pid>-<random>`. Must be unique among live "
        "processors of the job.",
        _J,
    ),
    ConfigKey(
        "job.coordinator.factory",
        "str",
        "local",
        "Job coordinator: alias (`local`, `azure`, `aws`) or `module:Class` implementing `JobCoordinatorFactory`.",
        _C,
    ),
    ConfigKey(
        "metadata.store.factory",
        "str",
        None,
        "Metadata store (job model, drain notices): alias (`local`, `azure`) or `module:Class` implementing "
        "`MetadataStoreFactory`; default: the alias of `job.coordinator.factory`.",
        _C,
    ),
    # --- Coordination timings -----------------------------------------------------------------------------
    ConfigKey(
        "job.coordinator.lease.duration.ms",
        "duration_ms",
        15000,
        "Lease of the leader and of each task lock. A killed processor's leases are broken once it is "
        "silent past `job.coordinator.liveness.timeout.ms`; this is how long they last when nobody breaks "
        "them (a backend that cannot). The `azure` coordinator's blob leases take 15000 to 60000, in whole "
        "seconds.",
        _C,
    ),
    ConfigKey(
        "job.coordinator.lease.renew.interval.ms",
        "duration_ms",
        5000,
        "How often held leases (leader, task locks) are renewed. Must be well under the lease duration.",
        _C,
    ),
    ConfigKey(
        "job.coordinator.heartbeat.interval.ms",
        "duration_ms",
        2000,
        "How often a processor writes its heartbeat row. Must be shorter than the liveness timeout minus "
        "its self-fence margin (a fifth of it); a third of the liveness timeout is a good value.",
        _C,
    ),
    ConfigKey(
        "job.coordinator.liveness.timeout.ms",
        "duration_ms",
        8000,
        "A processor silent for longer (by the store's clock, or on the `aws` backend by the reader's own) is "
        "considered dead: its tasks are reassigned at once and the processors that gain them break its leases "
        "rather than wait for them to expire. A failover takes about this long plus a second (under 10 s, as "
        "the Kinesis Client Library's). A processor whose heartbeat was not confirmed for this minus a fifth of "
        "it gives up its tasks and leadership first, so that breaking is safe.",
        _C,
    ),
    ConfigKey(
        "job.debounce.time.ms",
        "duration_ms",
        2000,
        "The leader waits until membership has been stable this long before publishing a new job "
        "model, so a burst of joins causes one rebalance.",
        _C,
    ),
    ConfigKey(
        "job.coordinator.latch.timeout.ms",
        "duration_ms",
        15000,
        "How long the leader waits for every processor to join a job model's latch before it gives "
        "up on that version and publishes a new one.",
        _C,
    ),
    ConfigKey(
        "job.coordinator.poll.interval.ms",
        "duration_ms",
        500,
        "How often a processor checks leadership, membership, the job model and latches.",
        _C,
    ),
    ConfigKey(
        "job.coordinator.lock.timeout.ms",
        "duration_ms",
        60000,
        "How long a processor keeps trying to take a gained task's lock (the previous owner must release "
        "it, go silent past the liveness timeout so that the lock is broken, or let it expire) before it "
        "reports the task as failed to start.",
        _C,
    ),
    ConfigKey(
        "job.coordinator.lease.renew.margin.ms",
        "duration_ms",
        None,
        "Self-fencing margin. A processor keeps a local monotonic deadline per held lease (the moment the "
        "last confirmed renewal was *sent* + the lease duration); when `deadline - margin` passes without a "
        "confirmed renewal it stops the task at once, writing nothing more (a leader stops leading), before "
        "another processor can take the lease. Default: a third of `job.coordinator.lease.duration.ms`. "
        "Must be positive and shorter than lease duration minus renew interval, and longer than one storage "
        'call may take: at least 4 s, one attempt of a fenced send (docs/guarantees.md, "The workers\' fence").',
        _C,
    ),
    ConfigKey(
        "job.coordinator.finished.check.interval.ms",
        "duration_ms",
        1000,
        "How often the leader checks whether every task of a bounded job has finished (one checkpoint read "
        "per unfinished task, at most); it then writes the `job-finished` metadata document, which every "
        "processor reads with one small get per poll before it stops.",
        _C,
    ),
    ConfigKey(
        "job.drain.poll.interval.ms",
        "duration_ms",
        500,
        "How often every processor of a pipeline job looks for a drain notification of its run id (one "
        "listing of the metadata store's small `drain/` prefix); see docs/drain.md.",
        _C,
    ),
    # --- Tasks and checkpoints ----------------------------------------------------------------------------
    ConfigKey(
        "app.pipeline",
        "str",
        None,
        "`module:function` building the job's pipeline (`fn(app: weirflow.App)`); the config file's directory "
        "is importable. Selects the Spark data plane; without it the job runs `task.function` per record.",
        _T,
    ),
    ConfigKey(
        "app.run.id",
        "str",
        None,
        "Identifies one deployment; carried by drain notices and control messages. Unset: each deployment "
        "gets one, recorded in the job's metadata store (`default` first; a new one when a changed job starts "
        'after its run drained or finished; docs/drain.md, "Run ids").',
        _T,
    ),
    ConfigKey(
        "app.deployment.id",
        "str",
        None,
        "What tells one deployment from the next when `app.run.id` is unset (for example "
        "`${CONTAINER_APP_REVISION}`). Unset: a digest of weirflow's version, the job-wide config and the job's "
        "code.",
        _T,
    ),
    ConfigKey(
        "task.inputs",
        "list",
        [],
        "Input streams (stream ids) of a record-task job, grouped by partition into tasks "
        "`<stage>-<n>` (stage `main`). Pipelines declare their inputs in code instead.",
        _T,
    ),
    ConfigKey(
        "task.tables",
        "list",
        [],
        'Served tables of a record-task job: names the record function may write with `{"table": name, '
        '"key": ..., "value": ...}`, queryable at `GET /tables/<name>/<key>` (docs/endpoints.md).',
        _T,
    ),
    ConfigKey(
        "task.function",
        "str",
        None,
        "`module:function` processing one record of a record-task job: "
        "`fn(record: dict) -> list[dict]`; each returned dict has `stream`, `value`, optional `key`. "
        "`task.class` is its deprecated former name: still read, with a warning.",
        _T,
        aliases=("task.class",),
    ),
    ConfigKey(
        "task.checkpoint.factory",
        "str",
        "local",
        "Checkpoint manager: alias (`local`, `azure-table`, `dynamodb`) or `module:Class` implementing "
        "`CheckpointManagerFactory`.",
        _T,
    ),
    ConfigKey(
        "task.trigger.interval.ms",
        "duration_ms",
        500,
        "Spark data plane: how often each task's streaming query starts a micro-batch when data is waiting.",
        _T,
    ),
    ConfigKey(
        "task.max.records.per.trigger",
        "int",
        50000,
        "Spark data plane: most records one micro-batch reads per input stream of a task.",
        _T,
    ),
    ConfigKey(
        "task.output.mode",
        "str",
        "append",
        "Spark output mode of every task query (`append` emits a window once the watermark passes it; `update`).",
        _T,
    ),
    ConfigKey(
        "task.spark.checkpoint.dir",
        "str",
        None,
        "Root of the tasks' Spark checkpoint dirs (operator state), one subdir per task; default "
        "`<job.state.dir>/spark/<job.name>-<job.id>`. It is local disk: `task.spark.checkpoint.store` keeps a "
        "copy where other machines can restore it; input positions always come from the checkpoint store.",
        _T,
    ),
    ConfigKey(
        "task.spark.class.archive",
        "str",
        "auto",
        "Class-data-sharing archive of Spark's classes for the processor's JVM, which then starts Spark in about "
        "half the time: `auto` uses the one `weirflow spark-archive` dumped for this Java and PySpark when there "
        "is one (`make run`, `make test` and the Docker image dump it), `off` none, or the path of an archive.",
        _T,
    ),
    ConfigKey(
        "task.spark.planner.fork",
        "bool",
        True,
        "Start each query's Python planner process (which plans its micro-batches) and PySpark's worker daemons "
        "by forking a warm server process that has PySpark, pyarrow, pandas and weirflow imported, instead of a "
        "new interpreter each: 1.5 to 3 s less CPU per query start, and 5 to 9 s less per processor start. "
        "Only when Spark runs weirflow's Python launcher (`PYSPARK_PYTHON` not set by you).",
        _T,
    ),
    ConfigKey(
        "task.spark.checkpoint.store",
        "str",
        None,
        "Where a copy of each stateful task's Spark checkpoint dir is kept, so the task keeps its operator "
        "state when it moves to another machine: `azure` (Blob Storage, mirrored after every committed "
        "micro-batch, restored before the task starts elsewhere), `aws` (S3, the same way), `local` (no copy: the "
        "local disk is shared "
        "by the embedded job's processors), or a `package.module:Class` path. Default: the coordinator's alias "
        "(`job.coordinator.factory`).",
        _T,
    ),
    ConfigKey(
        "task.stateless.merge",
        "bool",
        True,
        "Spark data plane: run the tasks a processor holds of a stateless stage (no aggregation, join or "
        "deduplication) as one query, restarted when its tasks change; off: one query per task.",
        _T,
    ),
    ConfigKey(
        "task.aggregate.merge",
        "bool",
        True,
        "Spark data plane: run the tasks a processor holds of a stage whose work is one `Stream.aggregate` of a "
        "partition_by's stream as one query, restarted when its tasks change; each task rebuilds its open windows "
        'by reading its partition again from where the oldest begins (docs/pipelines.md, "How a task runs"). '
        "Off: one query per task, whose state moves with the task (`task.spark.checkpoint.store`).",
        _T,
    ),
    ConfigKey("task.commit.ms", "duration_ms", 1000, "How often a running task checkpoints its offsets.", _T),
    ConfigKey("task.poll.max.records", "int", 500, "Most records a record task reads per SSP per poll.", _T),
    ConfigKey(
        "task.stop.timeout.ms",
        "duration_ms",
        30000,
        "How long a processor waits for a task to stop and write its final checkpoint (a rebalance, a "
        "shutdown). A task still stopping after this is abandoned (stopped without writing anything more; "
        "it resumes from its last checkpoint elsewhere) and the processor reports it as its `error`.",
        _T,
    ),
    # --- Systems and streams ------------------------------------------------------------------------------
    ConfigKey(
        "systems.<name>.factory",
        "str",
        None,
        "System plugin: alias (`local`, `eventhub`) or `module:Class` implementing `SystemFactory`. The system "
        "named `local` defaults to the embedded log. The `systems.<name>.*` keys a system plugin declares "
        "apply only to systems whose factory is that plugin; on another system they are an error.",
        _S,
    ),
    ConfigKey(
        "systems.<name>.retention.loss.allowed",
        "bool",
        False,
        "Accept that this system may drop records of the streams a job reads back whole (a record task's table "
        "changelogs, a pipeline's intermediate streams) before a task reads them: Kinesis and Event Hubs delete "
        "records after their retention, read or not. Unset, a processor with such a stream on this system "
        "refuses to start; set, it logs a warning naming each one. What is dropped is lost without any error: "
        'table rows, or rows between stages (docs/guarantees.md, "Streams read back whole").',
        _S,
    ),
    ConfigKey(
        "job.intermediate.system",
        "str",
        None,
        "System of the pipeline's intermediate streams (`partition_by`); default `job.default.system`.",
        _S,
    ),
    ConfigKey(
        "job.trim.interval.ms",
        "duration_ms",
        30000,
        "How often the leader deletes what the job no longer needs on a system that deletes on request (the "
        'embedded log; docs/operations.md, "Running for months"): the records of its intermediate streams no '
        "task will read again (below every consuming task's checkpoint, marks and rebuild marks, and every "
        "producing task's tails), the records past their stream's `streams.<id>.retention`, the records of "
        "table changelogs a later one of their key supersedes, and the output ids no replay sends again. 0: "
        "never.",
        _S,
    ),
    ConfigKey(
        "job.intermediate.partitions",
        "int",
        None,
        "Partitions of intermediate streams weirflow creates; default the most partitions of any input.",
        _S,
    ),
) + STREAM_KEYS
