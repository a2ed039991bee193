"""The test tree's own rules (docs/architecture.md, the `tests/` row):

* a test waits for a condition (`wait_until`), never sleeps for a time that is usually long enough: a sleep
  under tests/ (outside tests/support/, whose launchers poll what they start) carries the reason it is not
  synchronisation on its line, ``# not synchronisation: <why>`` (a fake of a slow service, the window of an
  assertion that something does not happen);
* `wait_until` is defined once in the repository (`weirflow.base.waiting`) and tests import it from
  `weirflow.testing`;
* what is not a test lives in tests/support/: directly under tests/ there are only the suite's conftest.py and
  the package's __init__.py.
"""

from __future__ import annotations

import ast
import os
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"
SUPPORT = TESTS / "support"

SLEEP = re.compile(r"\bsleep\(")
ALLOWED = re.compile(r"#\s*not synchronisation:\s*\S")
DEFINES_WAIT_UNTIL = re.compile(r"^\s*(?:async\s+)?def\s+wait_until\b", re.MULTILINE)
# Folders of the repository that are not its source: environments, caches, installed packages, builds.
NOT_SOURCE = {"node_modules", "build", "dist", "__pycache__"}


def unexplained_sleeps(text: str) -> list[int]:
    """The numbers of the lines of ``text`` that call a sleep without saying why it is not synchronisation."""
    return [n for n, line in enumerate(text.splitlines(), 1) if SLEEP.search(line) and not ALLOWED.search(line)]


def _test_files() -> list[Path]:
    return sorted(p for p in TESTS.rglob("*.py") if SUPPORT not in p.parents)


def _source_files() -> list[Path]:
    found = []
    for folder, subfolders, names in os.walk(ROOT):
        subfolders[:] = [
            d for d in subfolders if not (d.startswith(".") or d in NOT_SOURCE or d.endswith(".egg-info"))
        ]
        found += [Path(folder) / name for name in names if name.endswith(".py")]
    return sorted(found)


def _modules_importing_wait_until(text: str) -> list[str]:
    return [
        node.module or "." * node.level
        for node in ast.walk(ast.parse(text))
        if isinstance(node, ast.ImportFrom) and any(alias.name == "wait_until" for alias in node.names)
    ]


def test_no_test_sleeps_as_synchronisation() -> None:
    files = _test_files()
    assert len(files) > 100, "the test files were not found"
    found = [
        f"{path.relative_to(ROOT)}:{line}"
        for path in files
        for line in unexplained_sleeps(path.read_text(encoding="utf-8"))
    ]
    assert found == [], (
        "wait for a condition with `from weirflow.testing import wait_until`; a sleep that is not synchronisation "
        "says why on its line: `# not synchronisation: <why>`"
    )


def test_the_sleep_finder_finds_an_unexplained_sleep() -> None:
    call = "sleep" + "(0.3)"
    text = "\n".join(
        [
            f"time.{call}",
            f"    await asyncio.{call}  # let the reader poll",
            f"time.{call}  # not synchronisation: a slow fake",
            f"{call}  # not synchronisation:",
            "time.monotonic()  # sleep is mentioned, not called",
        ]
    )
    assert unexplained_sleeps(text) == [1, 2, 4]


def test_wait_until_is_defined_once_and_tests_import_it_from_the_test_kit() -> None:
    sources = _source_files()
    assert any(p.relative_to(ROOT).as_posix() == "weirflow/base/waiting.py" for p in sources), sources[:5]
    texts = {path.relative_to(ROOT).as_posix(): path.read_text(encoding="utf-8") for path in sources}
    defined = sorted(name for name, text in texts.items() if DEFINES_WAIT_UNTIL.search(text))
    assert defined == ["weirflow/base/waiting.py"], "one wait_until: weirflow.base.waiting's"
    elsewhere = sorted(
        f"{name}: from {module}"
        for name, text in texts.items()
        if name.startswith("tests/")
        for module in _modules_importing_wait_until(text)
        if module != "weirflow.testing"
    )
    assert elsewhere == [], "tests import it as `from weirflow.testing import wait_until`"


def test_only_the_suite_s_conftest_and_package_live_directly_under_tests() -> None:
    loose = sorted(p.name for p in TESTS.glob("*.py") if p.name not in {"__init__.py", "conftest.py"})
    assert loose == [], "a helper that is not a test goes to tests/support/ (listed in its __init__.py)"
