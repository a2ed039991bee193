"""Render an IAM policy template of this folder for one job (docs/aws.md, "IAM").

The templates are IAM policy documents with placeholders, so that one reviewed file serves every job:

* ``${Region}``, ``${Account}``: where the job's tables and streams live;
* ``${TablePrefix}``: ``aws.dynamodb.table.prefix`` (the tables are ``<prefix>-coordination`` and
  ``<prefix>-checkpoints``);
* ``${Bucket}``, ``${S3Prefix}``: ``aws.s3.bucket`` and ``aws.s3.prefix`` (which ends in ``/``, so that prefix
  ``jobs/a/`` never grants ``jobs/ab/``);
* ``${Stream}``: a Kinesis stream of the job. An entry of a ``Resource`` list holding it stands for one entry per
  stream given (``--stream``, repeated; IAM's ``*`` and ``?`` work in a name); a statement left with no resource
  (a job without Kinesis streams) is dropped.

A placeholder without a value is an error, never an empty string: an empty ``${S3Prefix}`` would grant the
whole bucket.

    python infra/aws/render_policy.py infra/aws/processor-policy.json --config job.yaml --account 123456789012 \\
        --stream page-views --stream page-views.dlq --stream page-counts

``--config`` reads the table prefix, bucket, S3 prefix and region from a job's config as the processors compute
them (the default prefixes carry a hash of the job's name and id), which needs weirflow installed;
``--table-prefix``, ``--bucket``, ``--s3-prefix`` and ``--region`` give or override them. Without ``--config``
the script needs nothing but Python.
"""

from __future__ import annotations

import argparse
import json
import re
import string
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

PLACEHOLDERS = ("Region", "Account", "TablePrefix", "Bucket", "S3Prefix")
STREAM = "${Stream}"

_ACCOUNT_RE = re.compile(r"^\d{12}$")
_STREAM_RE = re.compile(r"^[A-Za-z0-9_.*?-]{1,128}$")


class RenderError(ValueError):
    """A template or a value that cannot make a correct policy; the message says which."""


def _check(values: Mapping[str, str], streams: Sequence[str]) -> None:
    for name in PLACEHOLDERS:
        if not values.get(name):
            raise RenderError(f"no value for ${{{name}}}")
    if not _ACCOUNT_RE.match(values["Account"]):
        raise RenderError(f"${{Account}} must be 12 digits, not {values['Account']!r}")
    if not values["S3Prefix"].endswith("/"):
        raise RenderError(f"${{S3Prefix}} must end with '/' (as aws.s3.prefix does), not {values['S3Prefix']!r}")
    for stream in streams:
        if not _STREAM_RE.match(stream):
            raise RenderError(f"{stream!r} is not a Kinesis stream name (letters, digits, '_', '.', '-', or * ?)")


def _substitute(text: str, values: Mapping[str, str]) -> str:
    try:
        return string.Template(text).substitute(values)
    except KeyError as exc:
        raise RenderError(f"no value for ${{{exc.args[0]}}} (in {text!r})") from None
    except ValueError as exc:
        raise RenderError(f"{text!r} is not a valid template string: {exc}") from None


def _value(node: Any, values: Mapping[str, str]) -> Any:
    if isinstance(node, str):
        if STREAM in node:
            raise RenderError(f"{STREAM} may only appear in a statement's Resource: {node!r}")
        return _substitute(node, values)
    if isinstance(node, list):
        return [_value(item, values) for item in node]
    if isinstance(node, dict):
        return {key: _value(item, values) for key, item in node.items()}
    return node


def _resources(resource: str | list[str], values: Mapping[str, str], streams: Sequence[str]) -> list[str]:
    entries = [resource] if isinstance(resource, str) else list(resource)
    out: list[str] = []
    for entry in entries:
        if STREAM in entry:
            out.extend(_substitute(entry, {**values, "Stream": stream}) for stream in streams)
        else:
            out.append(_substitute(entry, values))
    return out


def render(template: Mapping[str, Any], values: Mapping[str, str], streams: Sequence[str] = ()) -> dict[str, Any]:
    """The policy document of ``template`` for one job: every placeholder replaced (`RenderError` when one has no
    value), ``${Stream}`` resources expanded once per stream, statements left without resources dropped."""
    _check(values, streams)
    statements = []
    for statement in template["Statement"]:
        resources = _resources(statement["Resource"], values, streams)
        if not resources:
            continue
        resource = resources[0] if isinstance(statement["Resource"], str) else resources
        statements.append(
            {key: resource if key == "Resource" else _value(item, values) for key, item in statement.items()}
        )
    return {**_value({k: v for k, v in template.items() if k != "Statement"}, values), "Statement": statements}


def render_file(path: str | Path, values: Mapping[str, str], streams: Sequence[str] = ()) -> dict[str, Any]:
    return render(json.loads(Path(path).read_text()), values, streams)


def values_of_config(path: str | Path) -> dict[str, str]:
    """``TablePrefix``, ``Bucket``, ``S3Prefix`` and (when set) ``Region`` of a job's config, computed by the AWS
    suite itself."""
    from weirflow_aws.clients import AwsSettings

    from weirflow.config import load_config

    settings = AwsSettings.from_config(load_config(path))
    found = {"TablePrefix": settings.table_prefix, "S3Prefix": settings.s3_prefix}
    if settings.bucket:
        found["Bucket"] = settings.bucket
    if settings.region:
        found["Region"] = settings.region
    return found


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Render an IAM policy template of infra/aws/ for one job.")
    parser.add_argument("template", help="infra/aws/processor-policy.json, create-storage-policy.json, ...")
    parser.add_argument("--config", help="the job's config: table prefix, bucket, S3 prefix and region from it")
    parser.add_argument("--account", help="the AWS account id (12 digits)")
    parser.add_argument("--region")
    parser.add_argument("--table-prefix")
    parser.add_argument("--bucket")
    parser.add_argument("--s3-prefix")
    parser.add_argument("--stream", action="append", default=[], help="a Kinesis stream of the job (repeat it)")
    args = parser.parse_args(argv)
    values = values_of_config(args.config) if args.config else {}
    given = {
        "Account": args.account,
        "Region": args.region,
        "TablePrefix": args.table_prefix,
        "Bucket": args.bucket,
        "S3Prefix": args.s3_prefix,
    }
    values.update({key: value for key, value in given.items() if value})
    try:
        policy = render_file(args.template, values, args.stream)
    except RenderError as exc:
        print(f"render_policy: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(policy, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
