"""The contract suite (`weirflow.testing`) run on the project's backends, exactly as a third party runs it on
theirs: through the ``weirflow_backend`` fixture. Each ``test_*_contract.py`` subclasses one contract class;
this fixture gives every test each of `BACKENDS` (`tests/contract/backends.py` builds them).
``test_system_contract.py`` overrides it with the systems (`SYSTEMS`).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.contract.backends import aws_backend, azure_backend, local_backend
from weirflow.testing import Backend

BACKENDS = ["local", "azure", "aws"]
SYSTEMS = ["local", "eventhub", "kinesis"]


@pytest.fixture(params=BACKENDS)
def weirflow_backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    if request.param == "aws":
        from tests.support.moto_server import BUCKET

        return aws_backend(request.getfixturevalue("moto").endpoint, BUCKET)
    if request.param == "azure":
        return azure_backend(request.getfixturevalue("azure_storage"))
    return local_backend(tmp_path)
