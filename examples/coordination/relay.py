"""The record function of the coordination example: route each page view to `page-visits`, keyed by page."""

from __future__ import annotations

import json
from typing import Any


def route_by_page(record: dict[str, Any]) -> list[dict[str, Any]]:
    view = json.loads(record["value"])
    view["source"] = f"{record['stream']}/{record['partition']}@{record['offset']}"
    return [{"stream": "page-visits", "key": view["page"], "value": view}]
