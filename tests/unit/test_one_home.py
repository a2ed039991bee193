"""Rules with one home (docs/architecture.md, "Rules with one home"): each is defined once, and every place
that needs it gives the same answer. These tests fail when a copy appears again or an answer diverges."""

from __future__ import annotations

import ast
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace

import pytest

import weirflow
from tests.unit.test_packaging import PACKAGE_FOLDERS
from weirflow.base import clock
from weirflow.base.errors import RecordTooLargeError
from weirflow.cli import status_document
from weirflow.config.loader import Config
from weirflow.coordination.job_model_store import read_job_model
from weirflow.coordination.leader import LeaderDuties
from weirflow.coordination.state import DEPARTED, ProcessorState, has_departed, is_live
from weirflow.coordination.timings import CoordinationTimings
from weirflow.interfaces.coordination import ProcessorInfo
from weirflow.interfaces.system import (
    OutgoingRecord,
    StreamSpec,
    SystemFactory,
    SystemProducer,
    SystemStreamPartition,
)
from weirflow.job.context import JobContext
from weirflow.job.grouper import group_by_partition
from weirflow.job.model import TaskModel
from weirflow.job.systems import Systems, dead_letter_stream, declared_streams, stream_id_of, stream_ref
from weirflow.pipeline.api import App
from weirflow.pipeline.plan import PipelinePlan

REPOSITORY = Path(weirflow.__file__).resolve().parent.parent

# The contract suite shipped for backend authors writes registry rows and streams as a backend's caller would
# (states spelled out included); it states expectations, it does not apply the rules.
NOT_SCANNED = ("weirflow/testing/",)


def _sources() -> list[tuple[Path, ast.Module]]:
    files = sorted(
        p
        for d in PACKAGE_FOLDERS
        for p in (REPOSITORY / d).rglob("*.py")
        if not p.relative_to(REPOSITORY).as_posix().startswith(NOT_SCANNED)
    )
    assert len(files) > 40, "the package folders were not found"
    return [(p, ast.parse(p.read_text(), str(p))) for p in files]


def _docstrings(tree: ast.Module) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                found.add(id(body[0].value))
    return found


def _literal_text(node: ast.AST) -> str | None:
    """The text of a string literal or of an f-string's literal parts (docstrings excluded by the caller)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "\x00".join(v.value for v in node.values if isinstance(v, ast.Constant))
    return None


def _offenders(predicate, allowed: set[str]) -> list[str]:
    """``file:line`` of every non-docstring string literal ``predicate`` flags, outside the ``allowed``
    files (paths relative to the repository)."""
    found = []
    for path, tree in _sources():
        relative = path.relative_to(REPOSITORY).as_posix()
        if relative in allowed:
            continue
        docstrings = _docstrings(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.JoinedStr):
                for part in node.values:  # the parts are visited below as part of the f-string
                    docstrings.add(id(part))
            text = _literal_text(node)
            if text is not None and id(node) not in docstrings and predicate(node, text):
                found.append(f"{relative}:{node.lineno}")
    return found


# --- who counts as alive -------------------------------------------------------------------------------
TIMINGS = CoordinationTimings(
    lease_ms=15000,
    renew_interval_ms=5000,
    heartbeat_interval_ms=3000,
    liveness_timeout_ms=10000,
    debounce_ms=2000,
    latch_timeout_ms=15000,
    poll_interval_ms=500,
    lock_timeout_ms=60000,
)


def test_live_means_heard_from_within_the_timeout_and_not_departed() -> None:
    assert DEPARTED == {ProcessorState.STOPPING, ProcessorState.STOPPED, ProcessorState.FAILED}
    for state in ProcessorState:
        fresh = ProcessorInfo("p", "h", 1, state.value, heartbeat_ms=90_000)
        assert is_live(fresh, 100_000, 10_000) is (state not in DEPARTED), state
        assert has_departed(state) is has_departed(state.value) is (state in DEPARTED)
        assert not is_live(ProcessorInfo("p", "h", 1, state.value, heartbeat_ms=89_999), 100_000, 10_000)


def test_a_stopping_processor_stays_a_member_until_it_handed_its_tasks_back() -> None:
    handing_over = ProcessorInfo("p", "h", 1, "STOPPING", tasks=["main-0"], heartbeat_ms=95_000)
    assert is_live(handing_over, 100_000, 10_000), "its tasks would move while it still holds their locks"
    assert not is_live(ProcessorInfo("p", "h", 1, "STOPPING", heartbeat_ms=95_000), 100_000, 10_000)
    silent = ProcessorInfo("p", "h", 1, "STOPPING", tasks=["main-0"], heartbeat_ms=80_000)
    assert not is_live(silent, 100_000, 10_000), "a processor that died while stopping is gone"


def _config(tmp_path: Path) -> Config:
    return Config.from_dict(
        {"job.name": "homes", "job.state.dir": str(tmp_path), "job.coordinator.liveness.timeout.ms": 10000},
        base_dir=tmp_path,
    )


def test_the_leader_status_and_the_registry_agree_on_who_is_alive(tmp_path: Path) -> None:
    """One row per state (STOPPING included: the leader drops it, so status must not show it live) and a
    silent RUNNING one; the leader's published membership, `weirflow status` and `is_live` over the registry's rows
    must name the same processors."""
    config = _config(tmp_path)
    now = clock.now_ms()
    ctx = JobContext.open(config, owner="writer")
    try:
        registry = ctx.coordination.processor_registry()
        for state in ProcessorState:
            pid = state.value.lower()
            registry.heartbeat(ProcessorInfo(pid, "h", 1, state.value, heartbeat_ms=now, started_ms=1))
        registry.heartbeat(ProcessorInfo("silent", "h", 1, "RUNNING", heartbeat_ms=now - 30_000, started_ms=1))
        tasks = group_by_partition("main", [SystemStreamPartition("local", "in", p) for p in range(4)])
        duties = LeaderDuties("writer", ctx.coordination, ctx.metadata, lambda: tasks, TIMINGS, clock=lambda: now)
        assert duties.tick() is not None
        by_leader = set(read_job_model(ctx.metadata)[0].processors)
        timeout = TIMINGS.liveness_timeout_ms
        by_registry = {p.processor_id for p in registry.processors() if is_live(p, now, timeout)}
    finally:
        ctx.close()
    by_status = {p["processor_id"] for p in status_document(config)["processors"] if p["live"]}
    assert by_leader == by_registry == by_status == {"new", "started", "in_rebalance", "running"}


def test_no_module_spells_a_processor_state_instead_of_using_processor_state() -> None:
    states = {s.value for s in ProcessorState}
    offenders = _offenders(
        lambda node, text: isinstance(node, ast.Constant) and text in states, {"weirflow/coordination/state.py"}
    )
    assert offenders == []


# --- now in ms -------------------------------------------------------------------------------------------
def test_now_ms_reads_time_time_when_called(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("time.time", lambda: 1_700_000_000.1239)
    assert clock.now_ms() == 1_700_000_000_123


def test_every_clock_reader_follows_a_patched_now_ms(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The leader's default clock, the embedded leases, the embedded log's timestamps and `weirflow status`
    all read `weirflow.base.clock.now_ms` when they run."""
    config = _config(tmp_path)
    t = 1_800_000_000_000
    monkeypatch.setattr(clock, "now_ms", lambda: t)
    ctx = JobContext.open(config, owner="p1")
    try:
        duties = LeaderDuties("p1", ctx.coordination, ctx.metadata, dict, TIMINGS)
        assert duties._clock() == t
        lock = ctx.coordination.lock("task-a")
        assert lock.try_acquire() and lock.is_held()
        beat = ProcessorInfo("p1", "h", 1, ProcessorState.RUNNING.value, heartbeat_ms=t - 2500)
        ctx.coordination.processor_registry().heartbeat(beat)
        ctx.systems.admin("local").create_stream(StreamSpec("s", 1))
        ctx.systems.producer("local").send([OutgoingRecord("s", b"v", partition=0)])
        (record,) = ctx.systems.consumer("local").read(SystemStreamPartition("local", "s", 0), "0", 10)
        assert record.timestamp_ms == t
        monkeypatch.setattr(clock, "now_ms", lambda: t + TIMINGS.lease_ms + 1)  # default lease: 15 s
        assert not lock.is_held(), "the lease expired by the patched clock"
    finally:
        ctx.close()
    monkeypatch.setattr(clock, "now_ms", lambda: t)
    (row,) = status_document(config)["processors"]
    assert row["heartbeat_age_s"] == 2.5 and row["live"]


def _is_time_time(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "time"
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "time"
    )


def test_no_module_computes_epoch_ms_itself() -> None:
    """``time.time() * 1000`` (either way round) anywhere but `weirflow.base.clock` is a second clock."""
    found = []
    for path, tree in _sources():
        if path.relative_to(REPOSITORY).as_posix() == "weirflow/base/clock.py":
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
                sides = (node.left, node.right)
                thousand = any(isinstance(side, ast.Constant) and side.value == 1000 for side in sides)
                if thousand and any(map(_is_time_time, sides)):
                    found.append(f"{path.relative_to(REPOSITORY)}:{node.lineno}")
    assert found == [], "use weirflow.base.clock.now_ms"


# --- stream id -> system and physical name ------------------------------------------------------------
def _stream_config(tmp_path: Path) -> Config:
    return Config.from_dict(
        {
            "job.name": "j",
            "job.id": "7",
            "job.state.dir": str(tmp_path),
            "job.default.system": "local",
            "streams.views.physical.name": "page-views",
            "streams.clicks.system": "other",
            "systems.other.factory": "local",
            "job.intermediate.system": "other",
        },
        base_dir=tmp_path,
    )


def test_stream_ref_is_the_rule_for_declared_and_intermediate_streams(tmp_path: Path) -> None:
    config = _stream_config(tmp_path)
    assert (stream_ref(config, "views").system, stream_ref(config, "views").physical) == ("local", "page-views")
    assert (stream_ref(config, "clicks").system, stream_ref(config, "clicks").physical) == ("other", "clicks")
    assert (stream_ref(config, "undeclared").system, stream_ref(config, "undeclared").physical) == (
        "local",
        "undeclared",
    )
    by = stream_ref(config, "by-page", intermediate=True)
    assert (by.system, by.physical) == ("other", "j-7-by-page")
    assert stream_id_of(declared_streams(config), "local", "page-views") == "views"
    assert stream_id_of(declared_streams(config), "local", "nobody") == "nobody"


def test_systems_the_pipeline_plan_and_the_event_hubs_plugin_resolve_streams_alike(tmp_path: Path) -> None:
    from weirflow_azure.eventhubs.factory import _hubs_of

    config = _stream_config(tmp_path)
    systems = Systems(config)
    systems.admin("local").create_stream(StreamSpec("page-views", 2))
    app = App(config)
    app.input("views").partition_by("k", name="by-page").send_to("out")
    plan = PipelinePlan(app, config, systems)
    try:
        for stream_id in ("views", "clicks", "out"):
            assert systems.resolve(stream_id) == plan.ref(stream_id) == stream_ref(config, stream_id)
        assert plan.ref("by-page") == stream_ref(config, "by-page", intermediate=True)
        for ref in (stream_ref(config, "views"), stream_ref(config, "by-page", intermediate=True)):
            assert plan.stream_id_of(ref.system, ref.physical) == ref.stream_id
        assert systems.stream_id_of("local", "page-views") == plan.stream_id_of("local", "page-views") == "views"
        on_other = {r.physical for r in declared_streams(config) if r.system == "other"}
        assert on_other and set(_hubs_of("other", config)) == on_other
    finally:
        systems.close()


def test_no_module_builds_a_physical_name_from_config_itself() -> None:
    def rebuilds(node: ast.AST, text: str) -> bool:  # f"streams.{id}.physical.name", f"streams.{id}.system"
        return isinstance(node, ast.JoinedStr) and (".physical.name" in text or text.endswith(".system"))

    offenders = _offenders(rebuilds, {"weirflow/interfaces/stream_names.py"})
    assert offenders == [], "resolve stream ids with weirflow.interfaces.stream_names.stream_ref"


# --- the dead-letter stream ----------------------------------------------------------------------------
def test_the_dead_letter_stream_is_created_and_written_under_one_name(tmp_path: Path) -> None:
    assert dead_letter_stream("page-views") == "page-views.dlq"
    config = _stream_config(tmp_path)
    systems = Systems(config)
    systems.admin("local").create_stream(StreamSpec("page-views", 2))
    systems.admin("local").create_stream(StreamSpec("out", 1))
    app = App(config)
    app.input("views").send_to("out")
    try:
        PipelinePlan(app, config, systems).ensure_streams()
        assert systems.admin("local").list_streams()[dead_letter_stream("page-views")] == 2
    finally:
        systems.close()

    from weirflow.spark.sink import WeirflowStreamWriter

    class Producer(SystemProducer):
        def __init__(self) -> None:
            self.sent: list[OutgoingRecord] = []

        def send(self, records: Sequence[OutgoingRecord]) -> None:
            big = [r for r in records if r.stream == "page-views" and len(r.value) > 10]
            if big:
                raise RecordTooLargeError(big, ["too big"] * len(big))
            self.sent.extend(records)

    producer = Producer()
    writer = WeirflowStreamWriter(config.snapshot(), [])
    writer._send(producer, [OutgoingRecord("page-views", b"x" * 11, partition=1, id="views/65792/0/0")])
    assert [r.stream for r in producer.sent] == [dead_letter_stream("page-views")]
    assert [r.id for r in producer.sent] == ["views/65792/0/0"], "the dead letter has its record's id"


def test_no_module_spells_the_dead_letter_suffix_itself() -> None:
    offenders = _offenders(
        lambda node, text: (isinstance(node, ast.JoinedStr) and ".dlq" in text) or text == ".dlq",
        {"weirflow/interfaces/stream_names.py"},
    )
    assert offenders == [], "name dead-letter streams with weirflow.interfaces.stream_names.dead_letter_stream"


# --- a task's stage comes from the job model -----------------------------------------------------------
def test_a_task_s_stage_is_the_model_s_field_not_parsed_from_its_name() -> None:
    from weirflow.spark.task_state import TaskState

    asked = []
    runner = SimpleNamespace(plan=SimpleNamespace(stage=lambda name: asked.append(name) or name), checkpoints=None)
    task = TaskModel("odd-name-with-dashes-3", "real_stage", (SystemStreamPartition("local", "s", 3),))
    state = TaskState(runner, task, lock=SimpleNamespace(), checkpoint=None)
    assert asked == ["real_stage"] and state.stage == "real_stage"


# --- Event Hubs systems are recognised by their factory's class ------------------------------------------
class _NotEventHubs(SystemFactory):
    def get_admin(self, system_name, config):  # pragma: no cover - never built
        raise NotImplementedError

    get_consumer = get_producer = get_admin


def test_event_hubs_systems_are_the_ones_whose_factory_is_the_plugin_s_class() -> None:
    from weirflow_azure.eventhubs.configured import eventhubs_systems
    from weirflow_azure.eventhubs.factory import EventHubSystemFactory

    connection = "Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=k;SharedAccessKey=a2V5"
    factories = {
        "alias": "eventhub",
        "path": f"{EventHubSystemFactory.__module__}:EventHubSystemFactory",
        "subclass": f"{__name__}:_EventHubsSubclass",
        "lookalike": f"{__name__}:_NotEventHubs",
        "plain": "local",
    }
    config = Config.from_dict(
        {
            "job.name": "j",
            **{f"systems.{n}.factory": f for n, f in factories.items()},
            # Event Hubs keys are accepted only on Event Hubs systems (the plugin owns them): on the others
            # they would be a config error, so only those get one.
            **{f"systems.{n}.connection.string": connection for n in ("alias", "path", "subclass")},
        }
    )
    assert sorted(eventhubs_systems(config)) == ["alias", "path", "subclass"]


def _event_hubs_subclass() -> type:
    from weirflow_azure.eventhubs.factory import EventHubSystemFactory

    return type("_EventHubsSubclass", (EventHubSystemFactory,), {"__module__": __name__})


_EventHubsSubclass = _event_hubs_subclass()


# --- every error that crosses an interface is a WeirflowError ----------------------------------------------
BUILTIN_ERRORS = {"ValueError", "RuntimeError", "KeyError", "TypeError", "TimeoutError"}

# The built-in errors still raised, each a programming-error assertion that never leaves its module (or the
# lookup protocol of a mapping-like method), keyed by (class, the message's first literal words, or the
# enclosing function when there is no message), so that moving one between files keeps its key.
INTERNAL_RAISES = {
    # the serde's converters signal "not this type / out of range" to their one caller, which dead-letters it
    ("TypeError", "_timestamp_us"),
    ("ValueError", "_timestamp_us"),
    ("TypeError", "convert"),
    ("ValueError", "convert"),
    ("TypeError", "_floating"),
    ("TypeError", "_string"),
    ("TypeError", "_boolean"),
    ("TypeError", "_decimal"),
    ("ValueError", "the json serde needs a schema"),  # checked as a PipelineError before the query is built
    ("ValueError", "unknown operator "),  # the pipeline API builds only the operators the query knows
    ("KeyError", "stage"),  # PipelinePlan lookups by names the plan itself gave out
    ("KeyError", "writer_stage"),
    ("ValueError", "config key "),  # a plugin's key declaration, checked when its module is imported
    ("ValueError", "blob leases last 15 to 60 whole seconds, not "),  # turned into a ConfigError by its caller
    ("ValueError", "the connection string has no 'Endpoint=sb://<namespace>/' part"),  # likewise
    ("ValueError", "undecodable AMQP section at byte "),  # the emulator's decoder, caught by its server
    ("ValueError", "hub '"),  # the emulator's store, refused to its admin client
    ("TimeoutError", "timed out after "),  # `weirflow.base.waiting.wait_until`: tests, contracts, demo, benchmarks
    (
        "ValueError",
        "metric ",
    ),  # `weirflow.base.telemetry`: counted under labels it does not declare (a bug of ours)
}


def _builtin_raises() -> list[tuple[str, str, str]]:
    """(class, key, ``file:line``) of every raise of a `BUILTIN_ERRORS` class in the packages."""
    found = []
    for path, tree in _sources():
        functions = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
        for node in ast.walk(tree):
            if not isinstance(node, ast.Raise) or node.exc is None:
                continue
            call = node.exc if isinstance(node.exc, ast.Call) else None
            target = call.func if call is not None else node.exc
            if not (isinstance(target, ast.Name) and target.id in BUILTIN_ERRORS):
                continue
            text = _literal_text(call.args[0]) if call is not None and call.args else None
            if text is not None:
                key = text.split("\x00")[0]
            else:
                enclosing = [f for f in functions if f.lineno <= node.lineno <= (f.end_lineno or f.lineno)]
                key = max(enclosing, key=lambda f: f.lineno).name if enclosing else "<module>"
            found.append((target.id, key, f"{path.relative_to(REPOSITORY).as_posix()}:{node.lineno}"))
    return found


def test_errors_that_cross_an_interface_are_weirflow_errors_not_builtins() -> None:
    """A ``raise ValueError`` (or RuntimeError, KeyError, TypeError) a caller of an interface or a user can meet
    must be a class of `weirflow.base.errors` or of the plugin's errors module (several are a `ValueError` too)."""
    found = _builtin_raises()
    unexpected = sorted(where for cls, key, where in found if (cls, key) not in INTERNAL_RAISES)
    assert unexpected == [], "raise a WeirflowError subclass (weirflow/base/errors.py draws the tree)"
    stale = sorted(INTERNAL_RAISES - {(cls, key) for cls, key, _ in found})
    assert stale == [], "these are gone: take them off INTERNAL_RAISES"


# --- SDK errors → weirflow errors: one lookup for every plugin's table ---------------------------------------
PLUGIN_ERROR_MODULES = (
    "weirflow_azure.eventhubs.errors",
    "weirflow_kinesis.errors",
    "weirflow_azure.coordinator.errors",
    "weirflow_aws.errors",
    "weirflow_delta.errors",
)


def test_every_plugin_looks_its_error_table_up_through_the_shared_lookup() -> None:
    """Each plugin's ``classify`` is `weirflow.base.errors.table_entry` over its table, so every table weighs the
    service's answer over the exception's type alike; no plugin walks an exception's lineage itself, and
    botocore's error code is read by one function, which both AWS-based plugins use."""
    import importlib
    import inspect

    from weirflow.base import errors

    for name in PLUGIN_ERROR_MODULES:
        module = importlib.import_module(name)
        calls = {
            node.func.id
            for node in ast.walk(ast.parse(inspect.getsource(module.classify)))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
        }
        assert "table_entry" in calls and module.table_entry is errors.table_entry, name
    sources = [(p.relative_to(REPOSITORY).as_posix(), tree) for p, tree in _sources()]
    walkers = [
        p
        for p, tree in sources
        if any(isinstance(n, ast.Attribute) and n.attr == "__mro__" for n in ast.walk(tree))
    ]
    assert walkers == ["weirflow/base/errors.py"], "look the table up with table_entry (and lineage_keys)"
    readers = [
        p
        for p, tree in sources
        for n in ast.walk(tree)
        if isinstance(n, ast.FunctionDef) and n.name == "error_code"
    ]
    assert readers == ["weirflow/base/errors.py"], "import weirflow.base.errors.error_code"
    kinesis, aws = (importlib.import_module(n) for n in ("weirflow_kinesis.errors", "weirflow_aws.errors"))
    assert kinesis.error_code is aws.error_code is errors.error_code


def test_the_shared_lookup_takes_an_answer_scoped_to_its_exception_type_and_botocore_s_code() -> None:
    from botocore.exceptions import ClientError, HTTPClientError

    from weirflow.base.errors import ServiceUnavailableError, WeirflowError, error_code, lineage_keys, table_entry

    class Reply(Exception):
        pass

    class Refusal(Reply):
        pass

    table = {(Reply, 503): ServiceUnavailableError, (Refusal, 503): WeirflowError, Reply: WeirflowError}
    assert table_entry(table, Refusal(), *lineage_keys(Refusal(), 503)) is WeirflowError, "the subclass's entry"
    assert table_entry(table, Reply(), *lineage_keys(Reply(), 503)) is ServiceUnavailableError
    assert table_entry(table, Refusal(), *lineage_keys(Refusal(), 404)) is WeirflowError, "then by type"
    assert table_entry(table, ValueError(), *lineage_keys(ValueError(), 503)) is None
    assert error_code(ClientError({"Error": {"Code": "SlowDown"}}, "PutObject")) == "SlowDown"  # type: ignore[arg-type]
    assert error_code(ClientError({}, "PutObject")) == ""  # type: ignore[arg-type]
    assert error_code(HTTPClientError(response=object(), error="reset")) == "", "a reply object is not a code"
    assert error_code(ValueError("ours")) == ""


# --- a storage call's retry deadline ends before the renew margin ------------------------------------------
@pytest.mark.parametrize(
    ("factory", "values", "timeout_key"),
    [
        (
            "weirflow_azure.coordinator.factories:AzureJobCoordinatorFactory",
            {"azure.storage.account": "acme", "azure.retry.deadline.ms": 6000},
            "azure.storage.request.timeout.ms",
        ),
        (
            "weirflow_aws.factories:AwsJobCoordinatorFactory",
            {"aws.retry.deadline.ms": 6000},
            "aws.request.timeout.ms",
        ),
    ],
    ids=["azure", "aws"],
)
def test_both_coordinators_refuse_a_retry_deadline_the_renew_margin_cannot_hold(
    factory: str, values: dict[str, object], timeout_key: str
) -> None:
    """The rule is `CoordinationTimings.check_call_deadline`; each coordinator factory asks it with its keys."""
    import importlib

    from weirflow.base.errors import ConfigError

    module, name = factory.split(":")
    deadline_key = next(k for k in values if k.endswith("retry.deadline.ms"))
    config = Config.from_dict(
        {"job.name": "homes", "job.coordinator.lease.renew.margin.ms": 5000, **values}, source="job.yaml"
    )
    with pytest.raises(ConfigError) as err:
        getattr(importlib.import_module(module), name)().get_coordination_utils(config, "p1")
    assert str(err.value) == (
        f"key '{deadline_key}' in job.yaml: 6000 ms is not shorter than job.coordinator.lease.renew.margin.ms "
        "(5000 ms): a lease renewal could still be retrying when the processor must fence itself; lower it "
        f"(with {timeout_key}) or raise the margin"
    )
    assert err.value.key == deadline_key
    timings = CoordinationTimings.from_config(config)
    timings.check_call_deadline(config, deadline_key, 4.999, timeout_key)  # shorter: accepted
    with pytest.raises(ConfigError, match=timeout_key):
        timings.check_call_deadline(config, deadline_key, 4.9996, timeout_key)  # rounds to the margin
