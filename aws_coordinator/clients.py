"""One job's AWS resources: how to reach them, what they are called, and how every call is retried.

The AWS suite keeps all of a job's state in two DynamoDB tables and one S3 prefix:

* ``<prefix>-coordination`` (``aws.dynamodb.table.prefix``, default ``weirflow-<job.name>-<job.id>-<hash>``):
  key ``pk``/``sk``; the leases (``pk = lease``), the processor registry (``pk = processor``) and the latches
  (``pk = latch/<name>``);
* ``<prefix>-checkpoints``: key ``pk``/``sk``, one item per task;
* ``s3://<aws.s3.bucket>/<aws.s3.prefix>``: ``metadata/<key>`` documents and ``spark-state/<task>/...``.

The ``<hash>`` (6 hex digits of the exact job name and id) keeps two jobs apart even when sanitising maps their
names to the same characters. Tables (on-demand capacity) and the bucket are created when missing unless
``aws.create.missing`` is false.

Credentials and region come from boto3's chain; ``aws.region`` and ``aws.endpoint.url`` override them.

Retries: botocore's own retries are switched off, so that one policy, ours, governs every call. Transient
failures (connection errors, timeouts, throttling, 5xx: the table of `weirflow_aws.errors`) are retried with
exponential backoff and jitter, ``aws.retry.attempts`` times at most and never past ``aws.retry.deadline.ms`` in
all, so that a lease renewal answers, or fails, while the processor can still fence itself (docs/coordination.md,
"The self-fence"); then `ServiceUnavailableError` names the endpoint and the resource. Each retry and each
failing call is counted for ``GET /metrics`` (`weirflow.base.telemetry`).
"""

from __future__ import annotations

import hashlib
import logging
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Any, TypeVar

from weirflow_aws.errors import AwsError, aws_errors, is_transient, short

from weirflow.base.errors import error_code
from weirflow.base.service_calls import ServiceCalls
from weirflow.interfaces.config import ConfigView

log = logging.getLogger("weirflow.aws")

T = TypeVar("T")

COORDINATION = "coordination"
CHECKPOINTS = "checkpoints"
TABLES = (COORDINATION, CHECKPOINTS)


def _job_hash(name: str, job_id: str) -> str:
    return hashlib.sha256(f"{name}\0{job_id}".encode()).hexdigest()[:6]


def default_table_prefix(job_name: str, job_id: str) -> str:
    """``weirflow-<name>-<id>-<hash>``: letters, digits, ``-`` ``_`` ``.``, short enough for every table name."""
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", f"{job_name}-{job_id}").strip("-")[:180]
    return f"weirflow-{slug}-{_job_hash(job_name, job_id)}" if slug else f"weirflow-{_job_hash(job_name, job_id)}"


def default_s3_prefix(job_name: str, job_id: str) -> str:
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", f"{job_name}-{job_id}").strip("-")[:200]
    return f"weirflow/{slug}-{_job_hash(job_name, job_id)}/"


_TABLE_PREFIX_RE = re.compile(r"^[A-Za-z0-9_.-]{3,240}$")
_BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")


@dataclass(frozen=True)
class AwsSettings:
    """Everything needed to reach one job's AWS resources; built from config by `from_config`."""

    table_prefix: str
    bucket: str | None
    s3_prefix: str
    region: str | None = None
    endpoint_url: str | None = None
    create_missing: bool = True
    request_timeout_s: float = 3.0
    retry_deadline_s: float = 4.0
    retry_attempts: int = 5
    retry_initial_s: float = 0.1
    retry_max_s: float = 2.0

    @classmethod
    def from_config(cls, config: ConfigView) -> AwsSettings:
        name, job_id = str(config.get("job.name")), str(config.get("job.id"))
        prefix = config.get("aws.dynamodb.table.prefix") or default_table_prefix(name, job_id)
        if not _TABLE_PREFIX_RE.match(prefix):
            raise config.error(
                "aws.dynamodb.table.prefix",
                f"'{prefix}' is not a valid table prefix: 3-240 letters, digits, '-', '_' and '.'",
            )
        bucket = config.get("aws.s3.bucket")
        if bucket is not None and not _BUCKET_RE.match(bucket):
            raise config.error(
                "aws.s3.bucket",
                f"'{bucket}' is not a valid bucket name: 3-63 lowercase letters, digits, '.' and '-'",
            )
        s3_prefix = config.get("aws.s3.prefix") or default_s3_prefix(name, job_id)
        if not s3_prefix.endswith("/"):
            s3_prefix += "/"
        attempts = int(config.get("aws.retry.attempts"))
        if attempts < 1:
            raise config.error("aws.retry.attempts", "must be at least 1")
        deadline_ms = int(config.get("aws.retry.deadline.ms"))
        if deadline_ms < int(config.get("aws.request.timeout.ms")):
            raise config.error(
                "aws.retry.deadline.ms",
                f"{deadline_ms} ms is shorter than one request may take (aws.request.timeout.ms); raise it or "
                "lower the request timeout",
            )
        return cls(
            table_prefix=prefix,
            bucket=bucket,
            s3_prefix=s3_prefix,
            region=config.get("aws.region") or None,
            endpoint_url=config.get("aws.endpoint.url") or None,
            create_missing=bool(config.get("aws.create.missing")),
            request_timeout_s=config.get("aws.request.timeout.ms") / 1000,
            retry_deadline_s=deadline_ms / 1000,
            retry_attempts=attempts,
            retry_initial_s=config.get("aws.retry.initial.backoff.ms") / 1000,
            retry_max_s=config.get("aws.retry.max.backoff.ms") / 1000,
        )

    def table_name(self, suffix: str) -> str:
        return f"{self.table_prefix}-{suffix}"


def require_bucket(config: ConfigView, settings: AwsSettings) -> str:
    """The bucket, or a config error saying to set it: the metadata store and Spark state need one."""
    if not settings.bucket:
        raise config.error(
            "aws.s3.bucket",
            "the aws backend keeps the job model, drain notices and Spark state in S3: set aws.s3.bucket to a "
            "bucket the processors may write under aws.s3.prefix (docs/aws.md)",
        )
    return settings.bucket


class Aws:
    """boto3 clients of one job's tables and bucket, plus `call`, the one retry policy. Clients are created
    lazily and shared by the threads of a process (botocore clients are thread-safe)."""

    def __init__(self, settings: AwsSettings) -> None:
        self.settings = settings
        self._ready: set[str] = set()
        self._lock = threading.Lock()

    @classmethod
    def from_config(cls, config: ConfigView) -> Aws:
        return cls(AwsSettings.from_config(config))

    @cached_property
    def _session(self) -> Any:
        import boto3

        return boto3.session.Session(region_name=self.settings.region)

    def _client(self, service: str) -> Any:
        from botocore.config import Config

        timeout = self.settings.request_timeout_s
        options: dict[str, Any] = {
            "connect_timeout": timeout,
            "read_timeout": timeout,
            "retries": {"total_max_attempts": 1},
            "max_pool_connections": 32,
        }
        if service == "s3" and self.settings.endpoint_url:
            options["s3"] = {"addressing_style": "path"}  # emulators serve one host, not one per bucket
        with aws_errors(f"open {service} client for", "the job", self.settings.endpoint_url or "AWS"):
            return self._session.client(service, endpoint_url=self.settings.endpoint_url, config=Config(**options))

    @cached_property
    def dynamodb(self) -> Any:
        return self._client("dynamodb")

    @cached_property
    def s3(self) -> Any:
        return self._client("s3")

    @property
    def dynamodb_endpoint(self) -> str:
        return str(self.dynamodb.meta.endpoint_url)

    @property
    def s3_endpoint(self) -> str:
        return str(self.s3.meta.endpoint_url)

    def table(self, suffix: str) -> str:
        """The name of table ``<prefix>-<suffix>``, created (and waited for) on first use when missing."""
        name = self.settings.table_name(suffix)
        if name not in self._ready:
            with self._lock:
                if name not in self._ready:
                    self._ensure_table(name)
                    self._ready.add(name)
        return name

    def _ensure_table(self, name: str) -> None:
        client = self.dynamodb

        def describe() -> str | None:
            try:
                return str(client.describe_table(TableName=name)["Table"]["TableStatus"])
            except client.exceptions.ResourceNotFoundException:
                return None

        status = self.call("describe table", name, self.dynamodb_endpoint, describe)
        if status is None:
            if not self.settings.create_missing:
                raise AwsError(
                    f"DynamoDB table {name} does not exist on {self.dynamodb_endpoint}: deploy it (docs/aws.md) "
                    "or set aws.create.missing: true"
                )

            def create() -> None:
                try:
                    client.create_table(
                        TableName=name,
                        KeySchema=[
                            {"AttributeName": "pk", "KeyType": "HASH"},
                            {"AttributeName": "sk", "KeyType": "RANGE"},
                        ],
                        AttributeDefinitions=[
                            {"AttributeName": "pk", "AttributeType": "S"},
                            {"AttributeName": "sk", "AttributeType": "S"},
                        ],
                        BillingMode="PAY_PER_REQUEST",
                    )
                except client.exceptions.ResourceInUseException:
                    pass  # created by another processor a moment ago

            self.call("create table", name, self.dynamodb_endpoint, create)
            log.info("created DynamoDB table %s on %s", name, self.dynamodb_endpoint)
            status = "CREATING"
        if status != "ACTIVE":
            waiter = client.get_waiter("table_exists")
            with aws_errors("wait for table", name, self.dynamodb_endpoint):
                waiter.wait(TableName=name, WaiterConfig={"Delay": 1, "MaxAttempts": 120})

    def bucket(self) -> str:
        """The job's bucket, created on first use when missing (and allowed)."""
        name = self.settings.bucket
        if not name:
            raise AwsError("no S3 bucket is configured: set aws.s3.bucket")
        if "bucket" not in self._ready:
            with self._lock:
                if "bucket" not in self._ready:
                    self._ensure_bucket(name)
                    self._ready.add("bucket")
        return name

    def _ensure_bucket(self, name: str) -> None:
        client = self.s3

        def exists() -> bool:
            # One key listed under the job's prefix rather than HeadBucket: S3 authorises HeadBucket as
            # s3:ListBucket with no s3:prefix in the request, which the least-privilege policy (docs/aws.md,
            # infra/aws/processor-policy.json) refuses; a listing under aws.s3.prefix is what it grants.
            try:
                client.list_objects_v2(Bucket=name, Prefix=self.settings.s3_prefix, MaxKeys=1)
            except Exception as exc:
                if error_code(exc) in ("404", "NoSuchBucket", "NotFound"):
                    return False
                raise
            return True

        if self.call("check bucket", name, self.s3_endpoint, exists):
            return
        if not self.settings.create_missing:
            raise AwsError(
                f"S3 bucket {name} does not exist on {self.s3_endpoint}: create it (docs/aws.md) or set "
                "aws.create.missing: true"
            )

        def create() -> None:
            region = self._session.region_name
            kwargs: dict[str, Any] = {"Bucket": name}
            if region and region != "us-east-1":
                kwargs["CreateBucketConfiguration"] = {"LocationConstraint": region}
            try:
                client.create_bucket(**kwargs)
            except (client.exceptions.BucketAlreadyOwnedByYou, client.exceptions.BucketAlreadyExists):
                pass

        self.call("create bucket", name, self.s3_endpoint, create)
        log.info("created S3 bucket %s on %s", name, self.s3_endpoint)

    @cached_property
    def _calls(self) -> ServiceCalls:
        return ServiceCalls(
            store="aws",
            settings=self.settings,
            is_transient=is_transient,
            short=short,
            errors=aws_errors,
            mapped=(AwsError,),
            hint="Is the endpoint reachable (and the emulator running, in development)?",
            log=log,
        )

    def call(self, operation: str, resource: str, endpoint: str, fn: Callable[[], T]) -> T:
        """Run ``fn`` under the retry policy (`weirflow.base.service_calls`). ``fn`` handles the errors it
        expects (a
        failed condition) and returns; transient ones are retried; the rest are raised naming ``resource``
        (`weirflow_aws.errors`)."""
        return self._calls.call(operation, resource, endpoint, fn)

    def close(self) -> None:
        for name in ("dynamodb", "s3"):
            client = self.__dict__.pop(name, None)
            if client is not None:
                client.close()
