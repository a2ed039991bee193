"""`weirflow upgrade`'s checks before it drains anything (`weirflow.ops.upgrade`): the new config must be the same
job in the same stores, and must not run under the run being drained."""

from __future__ import annotations

import pytest

from weirflow.base.errors import ConfigError
from weirflow.config.loader import Config
from weirflow.ops.upgrade import check_next_run, check_same_job


def _config(**values: str) -> Config:
    return Config.from_dict({"job.name": "pageviews", "job.id": "1", **values}, source="v2/job.yaml")


def test_the_same_job_passes_and_another_job_or_store_is_named() -> None:
    check_same_job(_config(), _config(**{"app.pipeline": "v2:pipeline"}))
    with pytest.raises(ConfigError, match=r"job\.id.*an upgrade continues the same job"):
        check_same_job(_config(), _config(**{"job.id": "2"}))
    with pytest.raises(ConfigError, match=r"job\.coordinator\.factory"):
        check_same_job(_config(), _config(**{"job.coordinator.factory": "azure"}))


def test_the_new_run_is_free_unless_fixed_and_never_the_drained_one() -> None:
    assert check_next_run(_config(), "default", None) is None
    assert check_next_run(_config(), "default", "v2") == "v2"
    assert check_next_run(_config(**{"app.run.id": "v2"}), "v1", None) == "v2"
    with pytest.raises(ConfigError, match="would finish at once"):
        check_next_run(_config(**{"app.run.id": "v1"}), "v1", None)
    with pytest.raises(ConfigError, match="would finish at once"):
        check_next_run(_config(), "v1", "v1")
    with pytest.raises(ConfigError, match="--run-id"):
        check_next_run(_config(**{"app.run.id": "v2"}), "v1", "v3")
