"""The job model document: exact JSON round trip, and clear rejection of malformed documents."""

from __future__ import annotations

import json

import pytest

from weirflow.base.errors import InvalidArgumentError, MalformedDocumentError
from weirflow.interfaces.system import SystemStreamPartition
from weirflow.job.grouper import group_by_partition
from weirflow.job.model import JobModel


def ssps_of(system: str, stream: str, partitions: int) -> list[SystemStreamPartition]:
    return [SystemStreamPartition(system, stream, p) for p in range(partitions)]


def sample() -> JobModel:
    tasks = group_by_partition("s0", ssps_of("local", "views", 3) + ssps_of("local", "clicks", 2))
    tasks |= group_by_partition("s1", ssps_of("eh", "views-by-page", 4))
    assignment = {"p1": ("s0-0", "s0-1", "s1-0", "s1-1"), "p2": ("s0-2", "s1-2", "s1-3")}
    return JobModel(version=3, tasks=tasks, assignment=assignment, created_ms=1234, leader="p1")


def test_job_model_survives_a_json_round_trip() -> None:
    model = sample()
    assert JobModel.from_json(json.loads(json.dumps(model.to_json()))) == model


def test_tasks_of_and_owner_of() -> None:
    model = sample()
    assert model.tasks_of("p2") == ("s0-2", "s1-2", "s1-3")
    assert model.tasks_of("nobody") == ()
    assert model.owner_of("s1-0") == "p1"
    assert model.owner_of("missing") is None
    assert model.processors == ("p1", "p2")


def test_unknown_format_is_rejected() -> None:
    doc = sample().to_json() | {"format": 99}
    with pytest.raises(MalformedDocumentError, match="format 99"):
        JobModel.from_json(doc)


def test_a_task_assigned_twice_is_rejected() -> None:
    doc = sample().to_json()
    doc["assignment"]["p2"].append("s0-0")
    with pytest.raises(MalformedDocumentError, match="s0-0 assigned to"):
        JobModel.from_json(doc)


def test_a_missing_field_is_rejected_with_its_name() -> None:
    doc = sample().to_json()
    del doc["tasks"]
    with pytest.raises(MalformedDocumentError, match="tasks"):
        JobModel.from_json(doc)


def test_group_by_partition_names_tasks_after_stage_and_partition() -> None:
    tasks = group_by_partition("s0", ssps_of("local", "views", 3) + ssps_of("local", "clicks", 2))
    assert sorted(tasks) == ["s0-0", "s0-1", "s0-2"]
    assert tasks["s0-1"].ssps == (
        SystemStreamPartition("local", "clicks", 1),
        SystemStreamPartition("local", "views", 1),
    )
    assert tasks["s0-2"].ssps == (SystemStreamPartition("local", "views", 2),)
    assert all(t.stage == "s0" for t in tasks.values())


def test_stage_names_that_would_make_ambiguous_task_names_are_rejected() -> None:
    with pytest.raises(InvalidArgumentError, match="stage name"):
        group_by_partition("bad-stage", ssps_of("local", "views", 1))
