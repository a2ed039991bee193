"""`weirflow.testing` (the contract suite, docs/testing-backends.md) is for test suites only: it may import
pytest, but no other module of weirflow or of the Azure suite imports it, and all of them import without
pytest installed."""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

import weirflow
from tests.unit.test_packaging import PACKAGE_FOLDERS

REPOSITORY = Path(weirflow.__file__).resolve().parent.parent


def _imported_modules(tree: ast.Module) -> set[str]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def test_no_runtime_module_imports_the_testing_package_or_pytest() -> None:
    offenders = []
    for directory in PACKAGE_FOLDERS:
        for path in sorted((REPOSITORY / directory).rglob("*.py")):
            relative = path.relative_to(REPOSITORY).as_posix()
            if relative.startswith("weirflow/testing/"):
                continue
            for module in _imported_modules(ast.parse(path.read_text(), relative)):
                if module == "weirflow.testing" or module.startswith(("weirflow.testing.", "pytest", "_pytest")):
                    offenders.append(f"{relative}: {module}")
    assert offenders == []


def test_every_runtime_module_imports_without_pytest() -> None:
    probe = textwrap.dedent(
        """\
        import importlib, pkgutil, sys
        sys.modules["pytest"] = None  # as in a production install
        names = []
        for top in ("weirflow", *(f"weirflow_azure.{p}" for p in ("coordinator", "checkpoint", "eventhubs"))):
            names += [m.name for m in pkgutil.walk_packages(importlib.import_module(top).__path__, top + ".")]
        for name in names:
            if not name.startswith("weirflow.testing") and name != "weirflow.__main__":
                importlib.import_module(name)
        assert not [m for m in sys.modules if m.startswith(("weirflow.testing", "_pytest"))], sys.modules
        print(len(names))
        """
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout.split()[-1]) > 80, "the packages were not walked"


def test_the_testing_package_names_its_public_api() -> None:
    import weirflow.testing as testing

    assert set(testing.__all__) >= {
        "Backend",
        "FactoryBackend",
        "SystemClients",
        "CheckpointManagerContract",
        "JobCoordinatorContract",
        "LatchContract",
        "LeaderElectorContract",
        "LockContract",
        "MetadataStoreContract",
        "ProcessorRegistryContract",
        "SystemContract",
        "wait_until",
    }
    assert all(hasattr(testing, name) for name in testing.__all__)
