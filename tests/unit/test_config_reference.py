"""docs/configuration.md is generated from the key registry and must not drift from it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from weirflow.config.keys import KEYS
from weirflow.config.reference import render_markdown

DOC = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def test_the_committed_reference_equals_the_generated_one() -> None:
    assert DOC.read_text() == render_markdown(), "docs/configuration.md is stale: run `make docs`"


def test_every_key_is_documented() -> None:
    text = DOC.read_text()
    missing = [k.name for k in KEYS if f"`{k.name}`" not in text]
    assert missing == []


def test_the_check_command_passes_on_the_committed_file() -> None:
    result = subprocess.run([sys.executable, "-m", "weirflow.config.reference", "--check", str(DOC)])
    assert result.returncode == 0
