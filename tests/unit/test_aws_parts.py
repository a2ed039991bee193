"""The AWS suite's parts that need no service: its error table, and the clock-free judgement of leases and
heartbeats (`weirflow_aws.leases.Observations`, `weirflow_aws.registry`), with clocks the test moves."""

from __future__ import annotations

from typing import Any

import pytest
from botocore.exceptions import ClientError, EndpointConnectionError, NoCredentialsError, ReadTimeoutError
from weirflow_aws.checkpoints import decode, encode
from weirflow_aws.clients import Aws, AwsSettings, default_s3_prefix, default_table_prefix
from weirflow_aws.errors import (
    AwsAccessError,
    AwsError,
    AwsResourceError,
    aws_errors,
    classify,
    is_condition_failure,
    is_transient,
)
from weirflow_aws.leases import Observations
from weirflow_aws.registry import DynamoProcessorRegistry

from weirflow.base.errors import ServiceUnavailableError, WeirflowError
from weirflow.interfaces.coordination import ProcessorInfo


def client_error(code: str, status: int, operation: str = "PutItem", **extra: Any) -> ClientError:
    response: dict[str, Any] = {
        "Error": {"Code": code, "Message": "m"},
        "ResponseMetadata": {"HTTPStatusCode": status},
    }
    response.update(extra)
    return ClientError(response, operation)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("exc", "target"),
    [
        (client_error("ProvisionedThroughputExceededException", 400), ServiceUnavailableError),
        (client_error("ThrottlingException", 400), ServiceUnavailableError),
        (client_error("SlowDown", 503), ServiceUnavailableError),
        (client_error("Whatever", 500), ServiceUnavailableError),  # by status, no code known
        (client_error("AccessDeniedException", 400), AwsAccessError),
        (client_error("AccessDenied", 403), AwsAccessError),
        (client_error("ResourceNotFoundException", 400), AwsResourceError),
        (client_error("NoSuchBucket", 404), AwsResourceError),
        (client_error("ValidationException", 400), AwsError),
        (EndpointConnectionError(endpoint_url="http://x"), ServiceUnavailableError),
        (ReadTimeoutError(endpoint_url="http://x"), ServiceUnavailableError),
        (NoCredentialsError(), AwsAccessError),
    ],
)
def test_the_one_table_maps_codes_statuses_and_types(exc: BaseException, target: type[WeirflowError]) -> None:
    assert classify(exc) is target
    assert is_transient(exc) == issubclass(target, ServiceUnavailableError)


def test_mapped_errors_name_the_resource_and_keep_botocore_s_as_cause() -> None:
    cause = client_error("AccessDeniedException", 400)
    with pytest.raises(AwsAccessError, match="write checkpoint to t/task-1 on http://aws") as info:
        with aws_errors("write checkpoint to", "t/task-1", "http://aws"):
            raise cause
    assert info.value.__cause__ is cause
    assert "IAM policy" in str(info.value)


def test_a_failed_condition_is_an_answer_not_an_error() -> None:
    assert is_condition_failure(client_error("ConditionalCheckFailedException", 400))
    assert is_condition_failure(client_error("PreconditionFailed", 412, "PutObject"))
    cancelled = client_error(
        "TransactionCanceledException",
        400,
        CancellationReasons=[{"Code": "None"}, {"Code": "ConditionalCheckFailed"}],
    )
    assert is_condition_failure(cancelled)
    assert not is_condition_failure(client_error("TransactionCanceledException", 400, CancellationReasons=[]))
    assert not is_condition_failure(client_error("ThrottlingException", 400))


def test_a_lease_is_stale_only_after_its_counter_stood_still_for_the_lease_on_the_observer_s_clock() -> None:
    now = [100.0]
    seen = Observations(clock=lambda: now[0])
    assert seen.stale_for("leader", 7) == 0.0, "first sight: assumed just renewed, as KCL does"
    now[0] += 9.0
    assert seen.stale_for("leader", 7) == 9.0
    assert seen.stale_for("leader", 8) == 0.0, "the counter moved: the holder renewed"
    now[0] += 3.0
    assert seen.stale_for("leader", 8) == 3.0
    seen.moved("leader", 9)
    assert seen.stale_for("leader", 9) == 0.0


def _registry(
    monkeypatch: pytest.MonkeyPatch, rows: list[ProcessorInfo], now: list[int]
) -> DynamoProcessorRegistry:
    import json

    from weirflow_aws import registry as module

    aws = Aws(AwsSettings(table_prefix="t-x", bucket=None, s3_prefix="p/"))
    reg = DynamoProcessorRegistry(aws)
    monkeypatch.setattr(
        reg,
        "_call",
        lambda _op, fn: [{"sk": {"S": r.processor_id}, "row": {"S": json.dumps(r.to_json())}} for r in rows],
    )
    monkeypatch.setattr(module.clock, "now_ms", lambda: now[0])
    return reg


def test_a_heartbeat_ages_on_the_reader_s_clock_whatever_the_writer_s_clock_says(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A writer whose clock is an hour behind (or ahead) writes heartbeat stamps the reader never compares with
    its own clock: a row is as old as the time since the reader first saw its current heartbeat."""
    now = [1_000_000]
    behind = ProcessorInfo("p1", "h", 1, "RUNNING", heartbeat_ms=now[0] - 3_600_000, instance="a", beat=1)
    ahead = ProcessorInfo("p2", "h", 2, "RUNNING", heartbeat_ms=now[0] + 3_600_000, instance="b", beat=1)
    rows = [behind, ahead]
    reg = _registry(monkeypatch, rows, now)
    first = {r.processor_id: r.heartbeat_ms for r in reg.processors()}
    assert first == {"p1": now[0], "p2": now[0]}, "first sight: as fresh as the read"
    now[0] += 8_000
    behind.beat, behind.heartbeat_ms = 2, behind.heartbeat_ms + 3000  # p1 wrote again; p2 went silent
    later = {r.processor_id: r.heartbeat_ms for r in reg.processors()}
    assert later == {"p1": now[0], "p2": now[0] - 8_000}
    rows.remove(ahead)
    assert [r.processor_id for r in reg.processors()] == ["p1"]


def test_a_checkpoint_body_round_trips_and_a_corrupt_one_is_named() -> None:
    from weirflow.base.errors import MalformedDocumentError
    from weirflow.interfaces.system import SystemStreamPartition

    offsets = {SystemStreamPartition("kin", "views", p): f"o{p}" for p in range(3)}
    assert decode("t", encode(offsets, {"marks": [1, 2]})) == (offsets, {"marks": [1, 2]})
    with pytest.raises(MalformedDocumentError, match="checkpoint of task t"):
        decode("t", b"not zlib")


def test_default_names_keep_two_jobs_apart_and_fit_aws_rules() -> None:
    assert default_table_prefix("a.b", "1") != default_table_prefix("a-b", "1")
    assert default_table_prefix("page views", "1").startswith("weirflow-page-views-1-")
    assert default_s3_prefix("pv", "1").startswith("weirflow/pv-1-") and default_s3_prefix("pv", "1").endswith("/")
