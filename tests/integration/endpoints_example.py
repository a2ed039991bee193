"""What the integration tests of examples/endpoints share: the example's ``views.py`` (loaded without putting
its folder on sys.path, where its ``pipeline.py`` would shadow other examples'), and a GET of an endpoint that
returns the status with the decoded JSON body."""

from __future__ import annotations

import importlib.util
import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "endpoints"

_spec = importlib.util.spec_from_file_location("endpoints_example_views", EXAMPLE / "views.py")
assert _spec is not None and _spec.loader is not None
views = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(views)


def get(url: str, token: str | None) -> tuple[int, Any]:
    """(status, body): the body as JSON, or as text when it is not weirflow's JSON (so a test shows it)."""
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        body = exc.read()
        try:
            return exc.code, json.loads(body)
        except ValueError:
            return exc.code, body.decode(errors="replace")
