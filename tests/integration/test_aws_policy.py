"""The IAM policies of infra/aws/ against the calls weirflow really makes (docs/aws.md, "IAM").

The AWS suite runs against the moto server and the Kinesis plugin against kinesalite, both through unmodified
boto3, while `tests.support.aws_calls.recording` notes every call from botocore's event system. Each call
becomes the IAM requests AWS would authorise (`tests.support.aws_calls.IAM_ACTIONS`), and a small evaluator
(`tests.support.iam_policy`) checks them against the policies rendered for the test's job:

* a processor with ``aws.create.missing: false`` on tables and a bucket deployed beforehand (as docs/aws.md's
  AWS CLI snippet does) calls nothing the processor policy does not allow, and the policy grants no storage
  action it does not call;
* a first start with ``aws.create.missing: true`` needs ``create-storage-policy.json`` for its creates only;
* a Kinesis processor needs the processor policy on the job's streams, also at a start that finds its dead-letter
  and intermediate streams deployed; creating them needs ``create-streams-policy.json``;
* the same requests on another job's tables, prefix or streams are denied.

A call the table does not know (say the suite began calling ``BatchWriteItem``) fails naming it. No Spark, no
processors: the primitives are driven directly, as a processor's loops drive them.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.contract.backends import AWS_LEASE_MS, aws_backend, kinesis_backend
from tests.support.aws_calls import Call, authorisations, recording
from tests.support.iam_policy import Request, allows, decide
from weirflow.base.errors import EtagMismatchError, FencedOffError
from weirflow.interfaces.checkpoint import Checkpoint
from weirflow.interfaces.coordination import LatchState, ProcessorInfo
from weirflow.interfaces.system import OutgoingRecord, StreamSpec, SystemStreamPartition
from weirflow.testing import FactoryBackend
from weirflow.testing.contracts.spark_state import committed_contents, contents, write_batches

pytestmark = pytest.mark.integration

ACCOUNT = "123456789012"
REGION = "us-east-1"
INFRA = Path(__file__).resolve().parents[2] / "infra" / "aws"
CREATES = {"dynamodb:CreateTable", "s3:CreateBucket"}


def _renderer() -> ModuleType:
    spec = importlib.util.spec_from_file_location("render_policy", INFRA / "render_policy.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


render_policy = _renderer()


def _names(backend: FactoryBackend, job: str) -> dict[str, str]:
    """The placeholders' values for ``job``, computed by the AWS suite itself (its default prefixes)."""
    from weirflow_aws.clients import AwsSettings

    settings = AwsSettings.from_config(backend.job_config(job))
    assert settings.bucket is not None
    return {
        "Region": REGION,
        "Account": ACCOUNT,
        "TablePrefix": settings.table_prefix,
        "Bucket": settings.bucket,
        "S3Prefix": settings.s3_prefix,
    }


def _policy(name: str, values: Mapping[str, str], streams: Iterable[str] = ()) -> dict[str, Any]:
    return render_policy.render_file(INFRA / name, values, list(streams))


def _requests(calls: Iterable[Call]) -> list[tuple[Call, Request]]:
    return [(call, request) for call in calls for request in authorisations(call, ACCOUNT)]


def _refused(pairs: Iterable[tuple[Call, Request]], policies: list[dict[str, Any]]) -> list[str]:
    return [f"{call}: {request}" for call, request in pairs if not allows(policies, request)]


def _elsewhere(request: Request, swaps: Mapping[str, str]) -> Request:
    """``request`` on another job's resources: each of ``swaps`` replaced in its resource and condition keys."""
    resource, context = request.resource, dict(request.context)
    for mine, theirs in swaps.items():
        resource = resource.replace(mine, theirs)
        context = {key: value.replace(mine, theirs) for key, value in context.items()}
    assert resource != request.resource or context != request.context, f"nothing of the job's in {request}"
    return Request(request.action, resource, context)


def _actions(statement: Mapping[str, Any]) -> list[str]:
    action = statement["Action"]
    return [action] if isinstance(action, str) else list(action)


def _fresh_bucket() -> str:
    return f"weirflow-iam-{uuid.uuid4().hex[:10]}"


def _job() -> str:
    return f"iam-{uuid.uuid4().hex[:10]}"


# --- the templates ---------------------------------------------------------------------------------------------
def test_the_templates_render_for_one_job_and_refuse_a_missing_value() -> None:
    values = {
        "Region": REGION,
        "Account": ACCOUNT,
        "TablePrefix": "weirflow-pageviews-1-0a1b2c",
        "Bucket": "acme-weirflow",
        "S3Prefix": "weirflow/pageviews-1-0a1b2c/",
    }
    policy = _policy("processor-policy.json", values, ["page-views", "page-views.dlq"])
    text = json.dumps(policy)
    assert "${" not in text
    streams = next(s for s in policy["Statement"] if s["Sid"] == "JobStreams")
    assert streams["Resource"] == [
        f"arn:aws:kinesis:{REGION}:{ACCOUNT}:stream/page-views",
        f"arn:aws:kinesis:{REGION}:{ACCOUNT}:stream/page-views.dlq",
    ]
    listing = next(s for s in policy["Statement"] if s["Sid"] == "JobListing")
    assert listing["Condition"] == {"StringLike": {"s3:prefix": "weirflow/pageviews-1-0a1b2c/*"}}
    # a job without Kinesis streams gets no stream statement, not one granting nothing (or everything)
    assert "JobStreams" not in {s["Sid"] for s in _policy("processor-policy.json", values)["Statement"]}
    for broken, why in [
        ({**values, "S3Prefix": ""}, "S3Prefix"),
        ({k: v for k, v in values.items() if k != "TablePrefix"}, "TablePrefix"),
        ({**values, "S3Prefix": "weirflow/pageviews"}, "end with '/'"),
        ({**values, "Account": "acme"}, "12 digits"),
    ]:
        with pytest.raises(render_policy.RenderError, match=why):
            _policy("processor-policy.json", broken)


def test_parliament_finds_nothing_in_the_rendered_policies() -> None:
    """An independent linter of IAM's grammar (known actions, resource types that fit them, condition keys that
    exist for the action): a typo in an action or in ``s3:prefix`` is caught here, not on AWS."""
    from parliament import analyze_policy_string

    values = {
        "Region": REGION,
        "Account": ACCOUNT,
        "TablePrefix": "weirflow-job-1-0a1b2c",
        "Bucket": "acme-weirflow",
        "S3Prefix": "weirflow/job-1-0a1b2c/",
    }
    for name in ("processor-policy.json", "create-storage-policy.json", "create-streams-policy.json"):
        policy = _policy(name, values, ["views", "views.dlq"])
        findings = analyze_policy_string(json.dumps(policy), include_community_auditors=True).findings
        assert not findings, f"{name}: " + "; ".join(f"{f.issue} {f.detail} at {f.location}" for f in findings)


# --- DynamoDB and S3 -------------------------------------------------------------------------------------------
def _deploy_beforehand(endpoint: str, values: Mapping[str, str]) -> None:
    """The tables and the bucket as docs/aws.md's AWS CLI snippet creates them (key pk/sk, strings)."""
    import boto3

    dynamodb = boto3.client("dynamodb", endpoint_url=endpoint, region_name=REGION)
    for suffix in ("coordination", "checkpoints"):
        dynamodb.create_table(
            TableName=f"{values['TablePrefix']}-{suffix}",
            KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}],
            AttributeDefinitions=[
                {"AttributeName": "pk", "AttributeType": "S"},
                {"AttributeName": "sk", "AttributeType": "S"},
            ],
            BillingMode="PAY_PER_REQUEST",
        )
    boto3.client("s3", endpoint_url=endpoint, region_name=REGION).create_bucket(Bucket=values["Bucket"])


def _exercise_coordination(backend: FactoryBackend, job: str) -> None:
    """Leader election, task locks (break and release included), a latch and the registry, as two processors'
    loops use them."""
    one = backend.coordination(job, "p1", AWS_LEASE_MS, instance="i1")
    two = backend.coordination(job, "p2", AWS_LEASE_MS, instance="i2")
    try:
        leader, follower = one.leader_elector(), two.leader_elector()
        assert leader.try_become_leader() and leader.renew()
        assert not follower.try_become_leader() and follower.current_leader() == "p1"
        assert follower.break_if_held_by("p1", "i1") and follower.try_become_leader()
        follower.resign()

        lock, rival = one.lock("task-a"), two.lock("task-a")
        assert lock.try_acquire() and lock.renew() and lock.is_held() and lock.is_held_in(lock.epoch)
        assert not rival.try_acquire() and rival.current_holder() == "p1"
        assert rival.break_if_held_by("p1", "i1") and rival.try_acquire()
        rival.release()
        lock.release()

        latch = one.latch("jobmodel-1")
        latch.join("p1")
        two.latch("jobmodel-1").join("p2")
        assert latch.participants() == {"p1", "p2"}
        latch.complete()
        latch.time_out()  # the first outcome stands
        assert latch.state() is LatchState.COMPLETE

        registry = one.processor_registry()
        registry.heartbeat(ProcessorInfo("p1", "host-1", 1, "RUNNING", instance="i1"))
        assert [p.processor_id for p in two.processor_registry().processors()] == ["p1"]
        registry.unregister("p1")
    finally:
        one.close()
        two.close()


def _exercise_checkpoints(backend: FactoryBackend, job: str) -> None:
    manager = backend.checkpoint_manager(job)
    manager.start()
    ssp = SystemStreamPartition("kin", "views", 0)
    try:
        manager.write_checkpoint("stage-v0", Checkpoint({ssp: "1"}, epoch=1))
        manager.write_checkpoint("stage-v0", Checkpoint({ssp: "2"}, control={"finished": "run-1"}, epoch=1))
        with pytest.raises(FencedOffError):
            manager.write_checkpoint("stage-v0", Checkpoint({ssp: "3"}, epoch=0))
        last = manager.read_last_checkpoint("stage-v0")
        assert last is not None and last.offsets[ssp] == "2"
        assert list(manager.read_all()) == ["stage-v0"]
    finally:
        manager.stop()


def _exercise_metadata(backend: FactoryBackend, job: str) -> None:
    """Every condition of the store: create-only, compare-and-set, a stale etag, a conditional delete of a
    document that is gone (the HeadObject path), listing a prefix."""
    store = backend.metadata_store(job)
    store.start()
    try:
        first = store.put("job-model", {"version": 1}, if_none_match=True)
        with pytest.raises(EtagMismatchError):
            store.put("job-model", {"version": 1}, if_none_match=True)
        doc = store.get("job-model")
        assert doc is not None and doc.etag == first
        second = store.put("job-model", {"version": 2}, if_match=first)
        with pytest.raises(EtagMismatchError):
            store.put("job-model", {"version": 3}, if_match=first)
        store.put("drain/one", {"run_id": "run-1"})
        assert [d.key for d in store.list("drain/")] == ["drain/one"]
        store.delete("job-model", if_match=second)
        with pytest.raises(EtagMismatchError):
            store.delete("job-model", if_match=second)
        store.delete("drain/one")
        assert store.get("job-model") is None
    finally:
        store.stop()


def _exercise_spark_state(backend: FactoryBackend, job: str, tmp_path: Path) -> None:
    """A mirror, a newer one dropping files Spark purged, a restore on another processor, a fenced mirror and a
    discard: a small fake of Spark's checkpoint layout (`weirflow.testing.contracts.spark_state`)."""
    local, elsewhere = tmp_path / "one" / "stage-v0", tmp_path / "two" / "stage-v0"
    store, other = backend.spark_state_store(job), backend.spark_state_store(job)
    try:
        write_batches(local, 1, 1)
        store.mirror("stage-v0", local, 1, 1)
        write_batches(local, 3, 3, purged_before=2)
        assert store.mirror("stage-v0", local, 3, 1).deleted > 0
        assert other.restore("stage-v0", elsewhere) == 3
        assert contents(elsewhere) == committed_contents(3, first=2)
        with pytest.raises(FencedOffError):
            other.mirror("stage-v0", elsewhere, 3, 0)
        other.discard("stage-v0")
        assert other.restore("stage-v0", tmp_path / "three" / "stage-v0") is None
    finally:
        store.close()
        other.close()


def test_a_processor_on_deployed_tables_and_bucket_needs_the_processor_policy_and_nothing_more(
    moto: Any, tmp_path: Path
) -> None:
    bucket, job, other_job = _fresh_bucket(), _job(), _job()
    backend = aws_backend(moto.endpoint, bucket)
    backend = dataclasses.replace(backend, config={**backend.config, "aws.create.missing": False})
    values, theirs = _names(backend, job), _names(backend, other_job)
    with recording() as recorder:
        _deploy_beforehand(moto.endpoint, values)  # outside any phase: not a processor's call
        with recorder.phase("processor"):
            _exercise_coordination(backend, job)
            _exercise_checkpoints(backend, job)
            _exercise_metadata(backend, job)
            _exercise_spark_state(backend, job, tmp_path)
    pairs = _requests(recorder.of("processor"))
    processor = [_policy("processor-policy.json", values)]

    refused = _refused(pairs, processor)
    assert not refused, "calls the processor policy does not allow:\n" + "\n".join(refused)
    called = {request.action for _, request in pairs}
    assert not called & CREATES, f"a processor with aws.create.missing: false called {called & CREATES}"
    granted = {a for s in processor[0]["Statement"] if s["Sid"] != "JobStreams" for a in _actions(s)}
    assert granted == called, (
        f"granted but never called: {sorted(granted - called)}; called but not granted: {sorted(called - granted)}"
    )
    # the same requests on another job's tables and prefix, or on the rest of the bucket, are denied
    swaps = {values["TablePrefix"]: theirs["TablePrefix"], values["S3Prefix"]: theirs["S3Prefix"]}
    allowed_elsewhere = [str(r) for _, r in pairs if allows(processor, _elsewhere(r, swaps))]
    assert not allowed_elsewhere, "allowed on another job's resources:\n" + "\n".join(allowed_elsewhere)
    bucket_arn = f"arn:aws:s3:::{bucket}"
    coordination = f"arn:aws:dynamodb:{REGION}:{ACCOUNT}:table/{values['TablePrefix']}-coordination"
    for request in [
        Request("s3:ListBucket", bucket_arn),  # HeadBucket, or a listing of the whole bucket
        Request("s3:ListBucket", bucket_arn, {"s3:prefix": ""}),
        Request("s3:GetObject", f"{bucket_arn}/{values['S3Prefix'].rstrip('/')}-x/metadata/job-model"),
        Request("s3:PutObject", f"arn:aws:s3:::{bucket}-other/{values['S3Prefix']}metadata/job-model"),
        Request("dynamodb:GetItem", coordination.replace(REGION, "eu-west-1")),  # the same names in another region
        Request("dynamodb:BatchWriteItem", coordination),  # an action no processor calls
    ]:
        assert decide(processor, request) == "ImplicitDeny", request


def test_a_first_start_that_creates_its_tables_and_bucket_needs_the_create_policy_for_the_creates_only(
    moto: Any,
) -> None:
    bucket, job = _fresh_bucket(), _job()
    backend = aws_backend(moto.endpoint, bucket)  # aws.create.missing: true, the default
    values, theirs = _names(backend, job), _names(backend, _job())
    with recording() as recorder:
        with recorder.phase("first start"):
            store, manager = backend.metadata_store(job), backend.checkpoint_manager(job)
            store.start()
            manager.start()
            coordination = backend.coordination(job, "p1", AWS_LEASE_MS)
            assert coordination.processor_registry().processors() == []
            coordination.close()
            store.stop()
            manager.stop()
    pairs = _requests(recorder.of("first start"))
    processor = [_policy("processor-policy.json", values)]
    create = [_policy("create-storage-policy.json", values)]

    creates = [(call, r) for call, r in pairs if r.action in CREATES]
    assert sorted(r.action for _, r in creates) == ["dynamodb:CreateTable"] * 2 + ["s3:CreateBucket"]
    refused = _refused(pairs, processor + create)
    assert not refused, "calls of a first start not allowed by both policies:\n" + "\n".join(refused)
    assert not _refused([p for p in pairs if p not in creates], processor)
    for call, request in creates:
        assert not allows(processor, request), f"the processor policy allows {request} ({call})"
        other = _elsewhere(request, {values["TablePrefix"]: theirs["TablePrefix"], bucket: f"{bucket}-other"})
        assert not allows(create, other), f"the create policy allows {other}"


# --- Kinesis ---------------------------------------------------------------------------------------------------
def test_a_kinesis_processor_needs_the_processor_policy_on_the_jobs_streams_and_creating_them_the_other(
    kinesalite: Any, tmp_path: Path
) -> None:
    job = _job()
    views, dead_letters, theirs = f"{job}-views", f"{job}-views.dlq", f"{_job()}-views"
    backend = kinesis_backend(kinesalite, tmp_path)
    # streams created with more than Kinesis's 24 h of retention: creating one also raises its retention
    backend = dataclasses.replace(backend, config={**backend.config, "systems.kin.retention.hours": 48})
    values = {
        "Region": REGION,
        "Account": ACCOUNT,
        "TablePrefix": f"weirflow-{job}",
        "Bucket": "acme-weirflow",
        "S3Prefix": f"weirflow/{job}/",
    }
    with recording() as recorder:
        clients = backend.system()
        try:
            with recorder.phase("create streams"):  # a pipeline's first start (weirflow.pipeline.plan)
                assert clients.admin.create_stream(StreamSpec(views, 4))
                assert clients.admin.create_stream(StreamSpec(dead_letters, 4))
            with recorder.phase("processor"):
                assert not clients.admin.create_stream(StreamSpec(dead_letters, 4))  # at every start: it exists
                _exercise_kinesis(clients, views, dead_letters)
        finally:
            clients.close()
    streams = [views, dead_letters]
    processor = [_policy("processor-policy.json", values, streams)]
    create = [_policy("create-streams-policy.json", values, streams)]

    used = _requests(recorder.of("processor"))
    refused = _refused(used, processor)
    assert not refused, "calls the processor policy does not allow:\n" + "\n".join(refused)
    called = {r.action for _, r in used}
    granted = {a for s in processor[0]["Statement"] if s["Sid"] == "JobStreams" for a in _actions(s)}
    assert granted == called, f"granted but never called: {sorted(granted - called)}"

    creating = _requests(recorder.of("create streams"))
    refused = _refused(creating, processor + create)
    assert not refused, "calls creating streams not allowed by both policies:\n" + "\n".join(refused)
    needs_create = {r.action for _, r in creating if not allows(processor, r)}
    assert needs_create == {
        "kinesis:CreateStream",
        "kinesis:DescribeStream",
        "kinesis:AddTagsToStream",
        "kinesis:IncreaseStreamRetentionPeriod",
    }, needs_create

    # another job's stream: no read, write or creation, whichever policies a processor holds
    for _, request in used + creating:
        other = _elsewhere(request, {views: theirs})
        assert decide(processor + create, other) == "ImplicitDeny", other


def _exercise_kinesis(clients: Any, views: str, dead_letters: str) -> None:
    """Admin, producer and consumer as a processor uses them: partitions and their metadata, the retention check,
    a start time, keyed and pinned sends, reads through the spool, a planned read and a count."""
    admin, producer, consumer = clients.admin, clients.producer, clients.consumer
    assert admin.partition_count(views) == 4
    assert admin.retention(views) is not None  # the start's check of streams read back whole
    metadata = admin.partition_metadata(views)
    admin.offset_for_time(views, 0, 0)
    producer.send([OutgoingRecord(views, f'{{"n":{n}}}'.encode(), key=f"user-{n}".encode()) for n in range(40)])
    producer.send([OutgoingRecord(dead_letters, b'{"reason":"x"}', partition=1)])
    read = 0
    for partition, meta in metadata.items():
        ssp = SystemStreamPartition(clients.name, views, partition)
        records = consumer.read(ssp, meta.oldest, 100)
        columns = consumer.read_columns(ssp, meta.oldest, 100)
        plan = admin.plan_read(views, partition, meta.oldest, 100)  # what the spool holds: read above
        assert len(columns.values) == len(records) == plan.records
        if records:
            assert admin.records_read(views, partition, meta.oldest, records[-1].next_offset) == len(records)
        read += len(records)
    assert read == 40
