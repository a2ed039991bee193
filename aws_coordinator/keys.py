"""The AWS suite's keys (``aws.*``), shared by the ``aws`` coordinator, metadata store and Spark state store
and the ``dynamodb`` checkpoint manager; registered under ``weirflow.config_keys`` as ``aws``."""

from __future__ import annotations

from weirflow.interfaces.config import ConfigKey

SECTION = "AWS suite (`aws`, `dynamodb`)"

KEYS: tuple[ConfigKey, ...] = (
    ConfigKey(
        "aws.region",
        "str",
        None,
        "AWS region of the job's DynamoDB tables and S3 bucket; default: boto3's own (`AWS_REGION`, "
        "`AWS_DEFAULT_REGION`, the profile). Credentials always come from boto3's chain (environment, profile, "
        "an instance or task role, web identity).",
        SECTION,
    ),
    ConfigKey(
        "aws.endpoint.url",
        "str",
        None,
        "Endpoint of DynamoDB and S3, for a local emulator (`http://127.0.0.1:5000` for moto); default: AWS's "
        "own (or `AWS_ENDPOINT_URL`).",
        SECTION,
    ),
    ConfigKey(
        "aws.dynamodb.table.prefix",
        "str",
        None,
        "Prefix of the job's DynamoDB tables `<prefix>-coordination` (leases, latches, processors) and "
        "`<prefix>-checkpoints`; default `weirflow-<job.name>-<job.id>-<hash>`, sanitised.",
        SECTION,
    ),
    ConfigKey(
        "aws.s3.bucket",
        "str",
        None,
        "S3 bucket of the job's metadata documents (job model, drain notices) and Spark state copies. Required "
        "by the `aws` coordinator: bucket names are global, so there is no default.",
        SECTION,
    ),
    ConfigKey(
        "aws.s3.prefix",
        "str",
        None,
        "Key prefix of the job's objects in `aws.s3.bucket`; default `weirflow/<job.name>-<job.id>-<hash>/`. "
        "The IAM policy of docs/aws.md grants a processor this prefix only.",
        SECTION,
    ),
    ConfigKey(
        "aws.create.missing",
        "bool",
        True,
        "Create the DynamoDB tables (on-demand capacity) and the bucket when missing. Set it to false where "
        "they are deployed beforehand: a processor then needs no create permission (docs/aws.md).",
        SECTION,
    ),
    ConfigKey(
        "aws.request.timeout.ms",
        "duration_ms",
        3000,
        "Connect and read timeout of one DynamoDB or S3 request (a timed-out request is retried within "
        "`aws.retry.deadline.ms`, which must not be shorter).",
        SECTION,
    ),
    ConfigKey(
        "aws.retry.deadline.ms",
        "duration_ms",
        4000,
        "Longest time one DynamoDB or S3 call may take, retries included; then it fails naming the endpoint. It "
        "must be shorter than `job.coordinator.lease.renew.margin.ms`, so that a lease renewal answers, or "
        "fails, while the processor can still fence itself in time.",
        SECTION,
    ),
    ConfigKey(
        "aws.retry.attempts",
        "int",
        5,
        "Tries of one call on transient failures (connection errors, timeouts, throttling, 5xx) before it fails "
        "naming the endpoint. Other errors are not retried.",
        SECTION,
    ),
    ConfigKey(
        "aws.retry.initial.backoff.ms",
        "duration_ms",
        100,
        "Wait before the first retry; doubles on each retry, with jitter.",
        SECTION,
    ),
    ConfigKey("aws.retry.max.backoff.ms", "duration_ms", 2000, "Longest wait between two retries.", SECTION),
)
