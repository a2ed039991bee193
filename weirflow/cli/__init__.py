"""The `weirflow` command: run a processor, inspect a job, manage streams.

Every command takes the job's CONFIG file first and `--set key=value` overrides. Errors print one line that
names the key, file or endpoint, and exit with status 2 (bad input) or 1 (runtime failure).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from weirflow.base.errors import WeirflowError
from weirflow.base.version import __version__
from weirflow.cli.common import ConfigArg, JsonOpt, SetOpt, console, err_console, load, user_errors
from weirflow.cli.streams import streams_app

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__.splitlines()[0])
app.add_typer(streams_app, name="streams")
deploy_app = typer.Typer(no_args_is_help=True, help="What a deployment of the job must create (docs/deploy.md).")
app.add_typer(deploy_app, name="deploy")


def _print_version(value: bool) -> None:
    if value:
        print(f"weirflow {__version__}")
        raise typer.Exit()


@app.callback()
def _options(
    version: Annotated[
        bool,
        typer.Option(
            "--version", is_eager=True, callback=_print_version, help="Print weirflow's version and exit."
        ),
    ] = False,
) -> None:
    # The options of `weirflow` itself, before any command; no docstring, so the help stays the Typer's own.
    pass


def _setup_logging(level: str, processor_id: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format=f"%(asctime)s %(levelname)s [{processor_id}] %(name)s: %(message)s",
        stream=sys.stderr,
    )
    # Client libraries log every request at INFO; weirflow logs what matters (retries, failures) itself.
    for noisy in ("py4j", "azure", "urllib3"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


@app.command()
def run(
    config: ConfigArg,
    set_: SetOpt = None,  # type: ignore[assignment]
    processor_id: Annotated[
        str | None, typer.Option(help="Identity of this processor (default: host-pid-random).")
    ] = None,
    log_level: Annotated[str, typer.Option(help="Logging level.")] = "INFO",
) -> None:
    """Run one processor of the job; start N of them to share its tasks. Stops cleanly on SIGTERM / Ctrl-C."""
    from weirflow.coordination.identity import default_processor_id
    from weirflow.endpoints.processor_server import serving_processor

    with user_errors():
        cfg = load(config, set_)
        pid = processor_id or cfg.get("processor.id") or default_processor_id()
        _setup_logging(log_level, pid)
        processor = serving_processor(cfg, processor_id=pid)
        _stop_on_signals(processor.stop)
        code = processor.run()
    raise typer.Exit(code)


def _stop_on_signals(stop: Callable[[], None]) -> None:
    """Call ``stop`` on SIGTERM and SIGINT, from a thread of its own. A signal handler runs in the main thread,
    between two of its bytecodes: there it may interrupt the processor's follower loop inside a
    `threading.Event` method, holding that event's lock, and ``stop`` sets those events: called in the handler,
    it would wait for that lock forever (a processor that ignores SIGTERM until it is killed). The handler only
    writes the signal's number to a pipe, which is safe anywhere."""
    read_end, write_end = os.pipe()

    def stopper() -> None:
        while True:
            signum = os.read(read_end, 1)[0]
            logging.getLogger("weirflow.cli").info("received %s; stopping", signal.Signals(signum).name)
            stop()

    threading.Thread(target=stopper, name="signals", daemon=True).start()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda number, _frame: os.write(write_end, bytes([number])))


def status_document(cfg: Any) -> dict[str, Any]:
    """The job's live picture (what `status --json` prints): `weirflow.ops.status.job_status`."""
    from weirflow.ops.status import job_status

    return job_status(cfg)


@app.command()
def status(config: ConfigArg, set_: SetOpt = None, as_json: JsonOpt = False) -> None:  # type: ignore[assignment]
    """Show the leader, the job model version and each processor's state, tasks and heartbeat age."""
    with user_errors():
        doc = status_document(load(config, set_))
    if as_json:
        print(json.dumps(doc, indent=2))
        return
    console.print(
        f"job [bold]{doc['job']}[/]  run [bold]{doc['run_id']}[/]  leader [bold]{doc['leader'] or '(none)'}[/]  "
        f"job model v{doc['job_model_version']}  {doc['task_count']} tasks"
    )
    if doc["drain"] is not None:
        states = doc["tasks"]
        done = sum(1 for s in states.values() if s in ("drained", "finished"))
        console.print(
            f"[bold yellow]draining[/] (notification {doc['drain']['uuid']}): {done} of {len(states)} "
            "tasks drained"
        )
    if any(s != "running" for s in doc["tasks"].values()):
        console.print("tasks: " + ", ".join(f"{name} {state}" for name, state in doc["tasks"].items()))
    table = Table(show_lines=False)
    for column in ("processor", "state", "live", "model", "tasks running", "heartbeat age", "error"):
        table.add_column(column)
    for p in doc["processors"]:
        name = p["processor_id"] + (" (leader)" if p["leader"] else "")
        table.add_row(
            name,
            p["state"],
            "yes" if p["live"] else "[red]no[/]",
            f"v{p['job_model_version']}",
            ", ".join(p["tasks"]) or "-",
            f"{p['heartbeat_age_s']:.1f} s",
            p["error"] or "",
        )
    console.print(table)
    for entry in doc.get("malformed", []):  # documents no reader can use (docs/architecture.md)
        from rich.markup import escape

        console.print(
            f"[yellow]malformed document[/] {escape(entry['document'])}: {escape(entry['reason'])} "
            "(skipped; fix or delete it)"
        )


@app.command()
def drain(
    config: ConfigArg,
    set_: SetOpt = None,  # type: ignore[assignment]
    run_id: Annotated[
        str | None,
        typer.Option(
            "--run-id", help="The deployment to drain (default: app.run.id, else the job's current run)."
        ),
    ] = None,
    wait: Annotated[bool, typer.Option("--wait", help="Show progress; exit 0 once the job has drained.")] = False,
    timeout: Annotated[float, typer.Option(help="With --wait: give up after this many seconds.")] = 600.0,
) -> None:
    """Drain the running deployment: sources stop at a cut, every window is flushed, intermediate streams are
    read to the end, every task checkpoints `drained` and the processors exit 0 (docs/drain.md)."""
    from weirflow.coordination.timings import CoordinationTimings
    from weirflow.job.context import JobContext
    from weirflow.job.runs import current_run_id

    with user_errors():
        cfg = load(config, set_)
        timings = CoordinationTimings.from_config(cfg)
        ctx = JobContext.open(cfg, owner=f"drain-{os.getpid()}")
        try:
            run = run_id or current_run_id(cfg, ctx.metadata)
            _ask_drain(ctx, run, timings.liveness_timeout_ms)
            if wait:
                _wait_drained(ctx, run, timings.liveness_timeout_ms, timeout)
        finally:
            ctx.close()


@app.command()
def upgrade(
    config: ConfigArg,
    new_config: Annotated[Path, typer.Argument(help="The new version's job config.")],
    set_: Annotated[
        list[str], typer.Option("--set", help="Override a key of both versions' configs: key=value (repeatable).")
    ] = None,  # type: ignore[assignment]
    new_set: Annotated[
        list[str], typer.Option("--new-set", help="Override a key of the new version's config only (repeatable).")
    ] = None,  # type: ignore[assignment]
    run_id: Annotated[
        str | None,
        typer.Option("--run-id", help="The new version's run id (default: app.run.id, else a new one)."),
    ] = None,
    run: Annotated[
        bool,
        typer.Option(
            "--run/--no-run",
            help="Then run one processor of the new version in this process (start more with `weirflow run`); "
            "--no-run stops once the next run is recorded (on Azure, deploy the new revision then).",
        ),
    ] = True,
    timeout: Annotated[float, typer.Option(help="Give up waiting for the drain after this many seconds.")] = 600.0,
) -> None:
    """Upgrade a running job: drain the running version, record a new run for the new version and start it
    (docs/drain.md, "Upgrading"). Every window is emitted once: the old version's up to the drain's cut, the
    new version's from there."""
    from weirflow.coordination.timings import CoordinationTimings
    from weirflow.job.context import JobContext
    from weirflow.job.runs import RunBook, current_run_id, deployment_of
    from weirflow.ops.upgrade import check_next_run, check_same_job

    with user_errors():
        current = load(config, set_)
        new = load(new_config, [*(set_ or []), *(new_set or [])])
        check_same_job(current, new)
        timings = CoordinationTimings.from_config(current)
        ctx = JobContext.open(current, owner=f"upgrade-{os.getpid()}")
        try:
            book = RunBook(ctx.metadata)
            drained = current_run_id(current, ctx.metadata)
            fixed = check_next_run(new, drained, run_id)
            record, _ = book.read()
            if record is not None and record.run_id == drained and record.ended == "drained":
                console.print(f"run [bold]{drained}[/] has drained already")
            else:
                _ask_drain(ctx, drained, timings.liveness_timeout_ms)
                _wait_drained(ctx, drained, timings.liveness_timeout_ms, timeout)
            nxt = book.start_next(drained, deployment_of(current), fixed, deployment_of(new))
        finally:
            ctx.close()
        console.print(f"the new version runs as run [bold]{nxt.run_id}[/] (after run {drained})")
    if not run:
        console.print(
            "start its processors: weirflow run " + " ".join([str(new_config), *_set_args(set_, new_set)])
        )
        return
    args = [sys.executable, "-m", "weirflow", "run", str(new_config), *_set_args(set_, new_set)]
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, args)  # this process becomes a processor of the new version


def _ask_drain(ctx: Any, run: str, liveness_timeout_ms: int) -> None:
    """Write a drain notification for ``run`` and say so; warn at once when no processor runs to act on it."""
    from weirflow.job.drain_notice import DrainUtils
    from weirflow.ops.drain_progress import read_progress

    notice = DrainUtils(ctx.metadata).write(run)
    console.print(f"drain requested for run [bold]{run}[/] (notification {notice.uuid})")
    if not read_progress(ctx, run, liveness_timeout_ms).running_processors:
        err_console.print(
            "[yellow]warning:[/] no processor of this job is running; it drains when one starts with run id "
            + run,
            highlight=False,
        )


def _set_args(*groups: list[str] | None) -> list[str]:
    return [arg for group in groups for item in group or [] for arg in ("--set", item)]


def _wait_drained(ctx: Any, run: str, liveness_timeout_ms: int, timeout_s: float) -> None:
    """Poll the drain's progress with a progress bar; exit 0 once complete, 1 on a time-out (saying why)."""
    from rich.markup import escape
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from weirflow.ops.drain_progress import read_progress

    deadline = time.monotonic() + timeout_s
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=err_console, transient=False) as bar:
        tasks_bar = bar.add_task("tasks drained", total=None)
        procs_bar = bar.add_task("processors exited", total=None)
        shown: dict[str, str] = {}
        while True:
            progress = read_progress(ctx, run, liveness_timeout_ms)
            for processor, error in sorted(progress.errors.items()):
                if shown.get(processor) != error:  # each new error once, as it appears
                    shown[processor] = error
                    bar.console.print(
                        f"[red]error[/] on processor {processor}: {escape(error)} (a failed task is retried; "
                        "the drain completes only once every task has drained)",
                        highlight=False,
                        markup=True,
                    )
            bar.update(tasks_bar, total=len(progress.tasks) or None, completed=progress.done_tasks)
            live = len(progress.running_processors)
            bar.update(procs_bar, description=f"processors running: {live}", total=None)
            if progress.complete:
                break
            if time.monotonic() >= deadline:
                raise WeirflowError(
                    f"the drain of run {run} did not complete in {timeout_s:.0f} s: {progress.summary()}"
                )
            time.sleep(0.25)
    console.print(f"run [bold]{run}[/] drained: {progress.summary()}")


@app.command("config")
def show_config(config: ConfigArg, set_: SetOpt = None, as_json: JsonOpt = False) -> None:  # type: ignore[assignment]
    """Print the effective configuration (file + overrides + defaults), secrets masked."""
    with user_errors():
        cfg = load(config, set_)
        values = cfg.masked()
    if as_json:
        print(json.dumps(values, indent=2, default=str))
        return
    table = Table()
    table.add_column("key")
    table.add_column("value")
    table.add_column("from")
    for key, value in values.items():
        table.add_row(key, str(value), cfg.source_of(key))
    console.print(table)


@app.command("config-reference")
def config_reference() -> None:
    """Print the configuration reference (Markdown) generated from the key registry."""
    from weirflow.config.reference import render_markdown

    print(render_markdown(), end="")


@app.command("spark-archive")
def spark_archive(
    force: Annotated[bool, typer.Option("--force", help="Dump it again even if one exists.")] = False,
) -> None:
    """Dump a class-data-sharing archive of Spark's classes for this Java and PySpark (once, about half a minute):
    processors then start Spark in about half the time (docs/pipelines.md, "Start-up")."""
    from weirflow.spark import class_archive
    from weirflow.spark.session import SPARK_DEFAULTS

    with user_errors():
        existing = class_archive.find_archive()
        if existing is not None and not force:
            console.print(f"Spark class archive already there: {existing}", highlight=False)
            return
        console.print("dumping the Spark class archive (runs a small Spark job, about half a minute)...")
        began = time.monotonic()
        path = class_archive.dump(SPARK_DEFAULTS["spark.driver.defaultJavaOptions"])
        console.print(f"wrote {path} ({path.stat().st_size / 1e6:.0f} MB) in {time.monotonic() - began:.0f} s")


# --- deploy -------------------------------------------------------------------------------------------
@deploy_app.command("hubs")
def deploy_hubs(
    config: ConfigArg,
    system: Annotated[str, typer.Option(help="The Event Hubs system (`systems.<name>`).")] = "eh",
    set_: SetOpt = None,  # type: ignore[assignment]
    as_json: JsonOpt = False,
) -> None:
    """Print every hub the job needs on SYSTEM (inputs, their dead-letter hubs, intermediate streams, outputs)
    with its partition count, as the `hubs` parameter of infra/main.bicep."""
    from weirflow.job.mode import JobMode
    from weirflow.ops.deploy import hubs_to_create

    with user_errors():
        cfg = load(config, set_)
        if system not in cfg.names("systems"):
            raise cfg.error(f"systems.{system}.factory", f"no system '{system}' is configured; pass --system")
        spark = None
        if JobMode.of(cfg) is JobMode.PIPELINE:
            from weirflow.spark.session import build_spark_session

            err_console.print("loading the pipeline (it needs a SparkSession: starting one)...")
            spark = build_spark_session(cfg)
        try:
            hubs = hubs_to_create(cfg, system)
        finally:
            if spark is not None:
                spark.stop()
    if as_json:
        print(json.dumps([{"name": h.name, "partitions": h.partitions} for h in hubs], indent=2))
        return
    print("param hubs = [")
    for hub in hubs:
        print(f"  {{ name: '{hub.name}', partitions: {hub.partitions} }}")
    print("]")


def _add_plugin_commands() -> None:
    """Command groups plugins register under the entry-point group ``weirflow.commands`` (a `typer.Typer`
    each, named by the entry point), e.g. ``weirflow emulator eventhubs`` from `weirflow_azure.eventhubs`. A plugin
    whose dependencies are missing just does not add its commands."""
    from weirflow.interfaces.plugins import registered

    for ep in registered("weirflow.commands"):
        try:
            group = ep.load()
        except ImportError:
            continue
        app.add_typer(group, name=ep.name)


def main() -> None:
    _add_plugin_commands()
    app()


if __name__ == "__main__":
    main()
