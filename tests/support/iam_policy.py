"""A small IAM policy evaluator, enough of AWS's rules to say whether identity policies allow one request: for the
tests of infra/aws/'s policies against the calls weirflow really makes (tests/integration/test_aws_policy.py).

Evaluated as IAM does for one identity with no boundary, session policy or SCP: an explicit ``Deny`` wins, else
any ``Allow`` whose Action, Resource and Condition all match allows, else the request is denied implicitly.
``Action`` matches case-insensitively, ``Resource`` case-sensitively, both with ``*`` (any run of characters)
and ``?`` (one). Conditions: ``StringEquals`` and ``StringLike`` (keys compared case-insensitively, values as
written); a key the request does not carry makes the condition false, as in IAM (which is why S3's HeadBucket,
carrying no ``s3:prefix``, is refused by a ListBucket grant conditioned on the prefix).

Anything else in a document (NotAction, NotResource, Principal, another condition operator, IfExists) raises
`UnsupportedPolicy`: this evaluator must never call a request allowed under a rule it does not know.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

_SUPPORTED_KEYS = {"Sid", "Effect", "Action", "Resource", "Condition"}
_OPERATORS = ("StringEquals", "StringLike")


class UnsupportedPolicy(ValueError):
    """A policy uses IAM grammar this evaluator does not implement."""


@dataclass(frozen=True)
class Request:
    """One authorisation IAM makes: an action on a resource, with the request's condition keys."""

    action: str  # "dynamodb:PutItem"
    resource: str  # an ARN, or "*" for actions without resource types (kinesis:ListStreams)
    context: Mapping[str, str] = field(default_factory=dict)  # e.g. {"s3:prefix": "weirflow/job-1/"}

    def __str__(self) -> str:
        keys = "".join(f" [{key}={value!r}]" for key, value in self.context.items())
        return f"{self.action} on {self.resource}{keys}"


def _listed(value: str | Iterable[str]) -> list[str]:
    return [value] if isinstance(value, str) else list(value)


def wildcard_match(pattern: str, value: str, *, case_sensitive: bool = True) -> bool:
    """IAM's wildcards: ``*`` any run of characters (``/`` and ``:`` included), ``?`` any one character."""
    regex = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.fullmatch(regex, value, 0 if case_sensitive else re.IGNORECASE | re.DOTALL) is not None


def _condition_holds(condition: Mapping[str, Any], context: Mapping[str, str]) -> bool:
    present = {key.lower(): value for key, value in context.items()}
    for operator, keys in condition.items():
        if operator not in _OPERATORS:
            raise UnsupportedPolicy(f"condition operator {operator} is not supported by this evaluator")
        for key, expected in keys.items():
            actual = present.get(key.lower())
            if actual is None:
                return False  # IAM: a key missing from the request fails the condition (no ...IfExists here)
            patterns = _listed(expected)
            if operator == "StringEquals":
                matched = actual in patterns
            else:
                matched = any(wildcard_match(p, actual) for p in patterns)
            if not matched:
                return False
    return True


def _applies(statement: Mapping[str, Any], request: Request) -> bool:
    unknown = set(statement) - _SUPPORTED_KEYS
    if unknown:
        raise UnsupportedPolicy(f"statement {statement.get('Sid', '?')} uses {sorted(unknown)}")
    if statement.get("Effect") not in ("Allow", "Deny"):
        raise UnsupportedPolicy(f"statement {statement.get('Sid', '?')} has Effect {statement.get('Effect')!r}")
    if not any(wildcard_match(a, request.action, case_sensitive=False) for a in _listed(statement["Action"])):
        return False
    if not any(wildcard_match(r, request.resource) for r in _listed(statement["Resource"])):
        return False
    return _condition_holds(statement.get("Condition", {}), request.context)


def decide(policies: Iterable[Mapping[str, Any]], request: Request) -> str:
    """``"Allow"``, ``"Deny"`` (an explicit Deny matched) or ``"ImplicitDeny"`` (no Allow matched)."""
    allowed = False
    for policy in policies:
        for statement in _listed_statements(policy):
            if _applies(statement, request):
                if statement["Effect"] == "Deny":
                    return "Deny"
                allowed = True
    return "Allow" if allowed else "ImplicitDeny"


def allows(policies: Iterable[Mapping[str, Any]], request: Request) -> bool:
    return decide(policies, request) == "Allow"


def _listed_statements(policy: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    if policy.get("Version") != "2012-10-17":
        raise UnsupportedPolicy(f"policy version {policy.get('Version')!r}: only 2012-10-17 is evaluated")
    statements = policy["Statement"]
    return [statements] if isinstance(statements, Mapping) else list(statements)
