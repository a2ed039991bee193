"""A running processor's HTTP server (docs/endpoints.md): the endpoints composed with a `StreamProcessor`.

Coordination serves nothing itself (docs/architecture.md): `StreamProcessor` takes a server factory
(`weirflow.coordination.server_hook`) and `start_processor_server` is the one `weirflow run` passes, through
`serving_processor`. It reads the processor's plain state (its state, leadership, job model version, lease
renewals, the owner of each task), its runner (task and query stats, served tables and their routes,
intermediate streams), the process's telemetry (`weirflow.base.telemetry`, read by the metrics collector), the
job's
picture (`weirflow.ops.status`) and the history of its tasks' throughput and lag, sampled here and summed over
the live processors for the status page (`weirflow.endpoints.history`).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

from weirflow.config.loader import Config
from weirflow.coordination.processor import StreamProcessor
from weirflow.coordination.state import ProcessorState
from weirflow.endpoints.conversations import Conversations
from weirflow.endpoints.history import PEER_TIMEOUT_S, ThroughputHistory, job_series
from weirflow.endpoints.metrics import ProcessorCollector, ProcessorSnapshot, metrics_exposition
from weirflow.endpoints.otel_export import start_export
from weirflow.endpoints.peers import get_json_from_peers
from weirflow.endpoints.read_pool import ReadPool
from weirflow.endpoints.server import EndpointServer, create_app
from weirflow.endpoints.settings import EndpointSettings
from weirflow.endpoints.tables import TableService
from weirflow.endpoints.taps import TapService
from weirflow.endpoints.task_report import TaskReport, gather
from weirflow.job.systems import is_http_stream
from weirflow.ops.status import job_status


def serving_processor(config: Config, **kwargs: Any) -> StreamProcessor:
    """A `StreamProcessor` (same arguments) that serves its endpoints while it runs: what `weirflow run` runs."""
    return StreamProcessor(config, server_factory=start_processor_server, **kwargs)


def start_processor_server(processor: StreamProcessor) -> EndpointServer | None:
    """Start the processor's HTTP server; None when ``endpoints.enabled`` is off. Called once its runner
    exists; its URL goes into the processor's registry row."""
    settings = EndpointSettings.from_config(processor.config)
    if not settings.enabled:
        return None
    ctx, runner = processor.ctx, processor.runner
    assert ctx is not None and runner is not None
    tasks = TaskReport(ctx.systems, runner.task_stats)

    def snapshot() -> ProcessorSnapshot:
        current = processor.runner
        running = current.running() if current is not None else set()
        return ProcessorSnapshot(
            processor.processor_id,
            processor.state.value,
            processor.working_version,
            len(running),
            processor.leading,
            tasks(),
            processor.lease_renewals,
            processor.rebalances,
            current.query_stats() if current is not None else {},
            f"{processor.config.get('job.name')}-{processor.config.get('job.id')}",
            processor.job_view,
        )

    collector = ProcessorCollector(snapshot)
    exporter = start_export(processor.config, collector.collect, processor.processor_id)  # metrics.export

    def health() -> tuple[bool, str]:
        state = processor.state
        return state not in (ProcessorState.FAILED, ProcessorState.STOPPED), state.value

    history = ThroughputHistory(tasks, settings.history_interval_ms, settings.history_window_ms)

    def throughput(urls: dict[str, str]) -> dict[str, Any]:
        """The job's throughput and lag over time: every live processor's history summed (this one's directly)."""
        peers = {p: u for p, u in urls.items() if u and p != processor.processor_id}
        answers = get_json_from_peers(peers, "/status/history", settings.token, PEER_TIMEOUT_S)
        answers[processor.processor_id] = history.to_json()
        ok = {p: a for p, a in answers.items() if isinstance(a, dict) and isinstance(a.get("samples"), list)}
        return {
            "window_ms": settings.history_window_ms,
            "interval_ms": settings.history_interval_ms,
            "processors": sorted(ok),
            "missing": {
                p: str(a.get("error", a)) if isinstance(a, dict) else str(a)
                for p, a in answers.items()
                if p not in ok
            },
            "series": job_series(ok),
        }

    def status() -> dict[str, Any]:
        """The job's picture, with every live processor's tasks (GET /tasks of each, this one's directly) and
        their throughput and lag over time (GET /status/history of each), asked at the same time."""
        doc = job_status(processor.config, ctx)
        urls = {p["processor_id"]: p.get("endpoint") or "" for p in doc["processors"] if p["live"]}
        with ThreadPoolExecutor(max_workers=1) as pool:
            over_time = pool.submit(throughput, urls)
            doc["task_reports"] = gather(urls, processor.processor_id, tasks, settings.token)
            doc["throughput"] = over_time.result()
        return doc

    pool = ReadPool(settings.read_threads)  # taps' and conversations' blocking reads, apart from the rest
    app = create_app(
        settings,
        status,
        health,
        metrics_exposition(collector),
        _table_service(processor, settings),
        TapService(
            processor.config,
            ctx.systems,
            runner.intermediate_streams,
            settings.tap_queue_size,
            read_pool=pool,
            max_taps=settings.tap_max,
        ),
        _conversations(processor, settings, pool),
        tasks,
        history.to_json,
    )
    server = EndpointServer(settings, app, on_stop=(history.stop, *([exporter.stop] if exporter else [])))
    server.start()
    history.start()
    return server


def _table_service(processor: StreamProcessor, settings: EndpointSettings) -> TableService | None:
    """The served tables' routing: a pipeline's (``Stream.serve``) or a record job's (``task.tables``);
    None when the job serves none."""
    ctx, runner = processor.ctx, processor.runner
    assert ctx is not None and runner is not None
    routes = runner.table_routes
    if routes is None or not routes.tables:
        return None

    def endpoints() -> dict[str, str]:
        rows = ctx.coordination.processor_registry().processors()
        return {row.processor_id: row.endpoint for row in rows}

    return TableService(
        routes,
        processor.processor_id,
        processor.owner_of,
        runner.table,
        endpoints,
        settings.token,
        settings.route_wait_ms / 1000,
    )


def _conversations(processor: StreamProcessor, settings: EndpointSettings, pool: ReadPool) -> Conversations | None:
    """Clients' requests to the job's ``http`` streams, and its responses (None: the job has none)."""
    config, ctx = processor.config, processor.ctx
    assert ctx is not None
    streams = {s: ctx.systems.resolve(s).system for s in config.names("streams") if is_http_stream(config, s)}
    if not streams:
        return None
    return Conversations(
        ctx.systems,
        streams,
        processor.processor_id,
        settings.rpc_timeout_ms / 1000,
        read_pool=pool,
        max_pending=settings.conversations_max,
        timeout_max_s=settings.rpc_timeout_max_ms / 1000,
    )
