"""Every AWS call a test's code makes, and what IAM would authorise it as (tests/integration/test_aws_policy.py).

`recording` hooks botocore's own event system in every botocore session created while it lasts: it adds two
handlers to botocore's list of built-in handlers, which each new session registers (the sessions the AWS suite
creates, and the default session `boto3.client` uses, which it resets so that the Kinesis plugin's clients get
one). Nothing of the SDK is replaced: the code under test creates its clients as always and its requests go over
the wire to moto and kinesalite as they would to AWS. The handlers only read each call's parameters
(``provide-client-params``) and, for Kinesis, which stream each shard iterator belongs to (``after-call``),
since ``GetRecords`` names no stream.

`authorisations` turns a call into the IAM requests AWS makes for it, through `IAM_ACTIONS`, the explicit table
of operation -> action: S3's HeadObject is ``s3:GetObject``, ListObjectsV2 is ``s3:ListBucket`` with the listing's
prefix as ``s3:prefix``, DeleteObjects is ``s3:DeleteObject`` of each key. An operation missing from the table
raises `UnknownOperation` naming it: a new call needs a decision about the policy, not a silent pass.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from tests.support.iam_policy import Request

# (service, operation) -> the IAM action AWS authorises it as.
IAM_ACTIONS: Mapping[tuple[str, str], str] = {
    ("dynamodb", "DescribeTable"): "dynamodb:DescribeTable",
    ("dynamodb", "CreateTable"): "dynamodb:CreateTable",
    ("dynamodb", "GetItem"): "dynamodb:GetItem",
    ("dynamodb", "PutItem"): "dynamodb:PutItem",
    ("dynamodb", "UpdateItem"): "dynamodb:UpdateItem",
    ("dynamodb", "DeleteItem"): "dynamodb:DeleteItem",
    ("dynamodb", "Query"): "dynamodb:Query",
    ("dynamodb", "Scan"): "dynamodb:Scan",
    ("s3", "CreateBucket"): "s3:CreateBucket",
    ("s3", "HeadBucket"): "s3:ListBucket",
    ("s3", "ListObjects"): "s3:ListBucket",
    ("s3", "ListObjectsV2"): "s3:ListBucket",
    ("s3", "GetObject"): "s3:GetObject",
    ("s3", "HeadObject"): "s3:GetObject",
    ("s3", "PutObject"): "s3:PutObject",
    ("s3", "DeleteObject"): "s3:DeleteObject",
    ("s3", "DeleteObjects"): "s3:DeleteObject",
    ("kinesis", "CreateStream"): "kinesis:CreateStream",
    ("kinesis", "DescribeStream"): "kinesis:DescribeStream",
    ("kinesis", "DescribeStreamSummary"): "kinesis:DescribeStreamSummary",
    ("kinesis", "AddTagsToStream"): "kinesis:AddTagsToStream",
    ("kinesis", "IncreaseStreamRetentionPeriod"): "kinesis:IncreaseStreamRetentionPeriod",
    ("kinesis", "ListTagsForStream"): "kinesis:ListTagsForStream",
    ("kinesis", "ListStreams"): "kinesis:ListStreams",
    ("kinesis", "ListShards"): "kinesis:ListShards",
    ("kinesis", "GetShardIterator"): "kinesis:GetShardIterator",
    ("kinesis", "GetRecords"): "kinesis:GetRecords",
    ("kinesis", "PutRecord"): "kinesis:PutRecord",
    ("kinesis", "PutRecords"): "kinesis:PutRecords",
}
_S3_BUCKET_OPERATIONS = {"CreateBucket", "HeadBucket", "ListObjects", "ListObjectsV2"}
_ACCOUNT_WIDE = {("kinesis", "ListStreams")}  # no resource type: IAM authorises them on "*"


class UnknownOperation(AssertionError):
    """A call the table cannot authorise: an operation it does not list, or a resource it cannot name."""


@dataclass(frozen=True)
class Call:
    """One SDK call: its service and operation, the client's region, its parameters and, for GetRecords, the
    stream of its shard iterator (None when the iterator came from no recorded call)."""

    phase: str
    service: str
    operation: str
    region: str
    params: Mapping[str, Any]
    stream: str | None = None

    def __str__(self) -> str:
        names = {
            k: v for k, v in self.params.items() if k in ("TableName", "Bucket", "Key", "Prefix", "StreamName")
        }
        return f"{self.service} {self.operation} {names}"


def _stream_arn(region: str, account: str, name: str) -> str:
    return f"arn:aws:kinesis:{region}:{account}:stream/{name}"


def _kinesis_resource(call: Call, account: str) -> str:
    if call.operation == "GetRecords":
        if call.stream is None:
            raise UnknownOperation(f"{call}: its shard iterator came from no recorded GetShardIterator")
        return _stream_arn(call.region, account, call.stream)
    if "StreamARN" in call.params:
        return str(call.params["StreamARN"])
    if "StreamName" in call.params:
        return _stream_arn(call.region, account, str(call.params["StreamName"]))
    raise UnknownOperation(f"{call}: names no stream (a ListShards page by NextToken alone?), so no resource")


def authorisations(call: Call, account: str) -> list[Request]:
    """The IAM requests AWS makes for ``call`` (one per key of a DeleteObjects); `UnknownOperation` when the table
    does not know the operation."""
    action = IAM_ACTIONS.get((call.service, call.operation))
    if action is None:
        raise UnknownOperation(
            f"{call.service} {call.operation} is not in tests/support/aws_calls.py's IAM_ACTIONS: decide which "
            "IAM action it needs, add it there, and grant it in infra/aws/ if the processors need it"
        )
    p = call.params
    if (call.service, call.operation) in _ACCOUNT_WIDE:
        return [Request(action, "*")]
    if call.service == "dynamodb":
        return [Request(action, f"arn:aws:dynamodb:{call.region}:{account}:table/{p['TableName']}")]
    if call.service == "s3":
        bucket = p["Bucket"]
        if call.operation in _S3_BUCKET_OPERATIONS:
            context = {"s3:prefix": str(p["Prefix"])} if "Prefix" in p else {}
            return [Request(action, f"arn:aws:s3:::{bucket}", context)]
        if call.operation == "DeleteObjects":
            return [Request(action, f"arn:aws:s3:::{bucket}/{o['Key']}") for o in p["Delete"]["Objects"]]
        return [Request(action, f"arn:aws:s3:::{bucket}/{p['Key']}")]
    return [Request(action, _kinesis_resource(call, account))]


class CallRecorder:
    """The calls made while a phase is open (`phase`), in order; calls outside any phase (a test's own set-up)
    are not recorded."""

    def __init__(self) -> None:
        self.calls: list[Call] = []
        self._phase: str | None = None
        self._iterators: dict[str, str] = {}  # Kinesis shard iterator -> its stream
        self._guard = threading.Lock()

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        self._phase = name
        try:
            yield
        finally:
            self._phase = None

    def of(self, phase: str) -> list[Call]:
        return [call for call in self.calls if call.phase == phase]

    def _before(self, params: Mapping[str, Any], model: Any, context: Mapping[str, Any], **_: Any) -> None:
        """``provide-client-params``: must return None, or botocore would take the value as the parameters."""
        service = model.service_model.service_name
        stream = None
        if service == "kinesis":
            with self._guard:
                stream = self._iterators.get(str(params.get("ShardIterator")))
        if self._phase is None:
            return
        call = Call(self._phase, service, model.name, str(context.get("client_region")), dict(params), stream)
        with self._guard:
            self.calls.append(call)

    def _after(self, parsed: Mapping[str, Any], model: Any, context: Mapping[str, Any], **_: Any) -> None:
        """``after-call`` of Kinesis: remember which stream the iterators a call returned belong to."""
        if model.name not in ("GetShardIterator", "GetRecords") or not isinstance(parsed, Mapping):
            return
        params = context.get("weirflow_test_params") or {}
        stream = params.get("StreamName") or self._iterators.get(str(params.get("ShardIterator")))
        returned = parsed.get("ShardIterator") or parsed.get("NextShardIterator")
        if stream and returned:
            with self._guard:
                self._iterators[str(returned)] = str(stream)

    def _keep_params(self, params: Mapping[str, Any], context: dict[str, Any], **_: Any) -> None:
        """Kinesis calls keep their parameters in the request context, where ``after-call`` finds them."""
        context["weirflow_test_params"] = dict(params)


@contextmanager
def recording() -> Iterator[CallRecorder]:
    """A `CallRecorder` hooked into every botocore session created until the block ends."""
    import boto3
    import botocore.handlers

    recorder = CallRecorder()
    builtin, default_session = botocore.handlers.BUILTIN_HANDLERS, boto3.DEFAULT_SESSION
    botocore.handlers.BUILTIN_HANDLERS = [
        *builtin,
        ("provide-client-params", recorder._before),
        ("provide-client-params.kinesis", recorder._keep_params),
        ("after-call.kinesis", recorder._after),
    ]
    boto3.DEFAULT_SESSION = None
    try:
        yield recorder
    finally:
        botocore.handlers.BUILTIN_HANDLERS = builtin
        boto3.DEFAULT_SESSION = default_session
