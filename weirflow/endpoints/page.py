"""``GET /``: the job's status as a small HTML page (any processor serves it), from the same document as
``GET /status`` and `weirflow status`. No scripts and no external assets; it refreshes itself every 5 s."""

from __future__ import annotations

from html import escape
from typing import Any

_STYLE = """
body { font: 14px system-ui, sans-serif; margin: 1.5rem; color: #1d232a; }
h1 { font-size: 1.3rem; margin: 0 0 .3rem; }
.facts span { margin-right: 1.5rem; }
table { border-collapse: collapse; margin: .8rem 0 1.5rem; }
th, td { border-bottom: 1px solid #d6dbe0; padding: .35rem .8rem; text-align: left; }
th { background: #f1f3f5; }
.dead { color: #a61b1b; }
.drain { background: #fff4d6; padding: .5rem .8rem; border-radius: 4px; display: inline-block; }
"""


def _table(headers: list[str], rows: list[list[str]], row_class: list[str] | None = None) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    classes = row_class or [""] * len(rows)
    body = "".join(
        f'<tr class="{classes[i]}">' + "".join(f"<td>{cell}</td>" for cell in row) + "</tr>"
        for i, row in enumerate(rows)
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _task_cells(report: dict[str, Any] | None, now_ms: int) -> list[str]:
    """Lag (total, and per SSP as the cell's title), records in, last batch, checkpoint age, dead letters."""
    if report is None:
        return ["", "", "", "", ""]
    lag = report.get("lag") or {}
    per_ssp = ", ".join(f"{ssp}: {n}" for ssp, n in sorted(lag.items()))
    total = report.get("lag_total")
    checkpoint = report.get("last_checkpoint_ms") or 0
    age = f"{max(0, now_ms - checkpoint) / 1000:.1f} s ago" if checkpoint and now_ms else ""
    return [
        f'<span title="{escape(per_ssp)}">{escape(str(total if total is not None else "?"))}</span>',
        escape(str(report.get("records_in", 0))),
        f"{report.get('last_batch_ms', 0)} ms",
        escape(age),
        escape(str(report.get("dead_letters", 0))),
    ]


def render_status_page(status: dict[str, Any]) -> str:
    processors = status.get("processors", [])
    owner = {task: p for p, tasks in status.get("assignment", {}).items() for task in tasks}
    proc_rows = [
        [
            escape(str(p["processor_id"])) + (" (leader)" if p.get("leader") else ""),
            escape(str(p["state"])),
            "yes" if p.get("live") else "no",
            f"{p.get('heartbeat_age_s', '')} s",
            escape(", ".join(p.get("tasks", []))),
            escape(str(p.get("endpoint") or "")),
        ]
        for p in processors
    ]
    classes = ["" if p.get("live") else "dead" for p in processors]
    reports = {
        task: r
        for by in (status.get("task_reports") or {}).values()
        if "error" not in by
        for task, r in by.items()
    }
    now_ms = status.get("now_ms") or 0
    task_rows = [
        [escape(task), escape(str(state)), escape(owner.get(task, "")), *_task_cells(reports.get(task), now_ms)]
        for task, state in sorted(status.get("tasks", {}).items())
    ]
    silent = [p for p, by in (status.get("task_reports") or {}).items() if "error" in by]
    silent_html = f'<p class="dead">No task report from {escape(", ".join(silent))}</p>' if silent else ""
    drain = status.get("drain")
    drain_html = (
        f'<p class="drain">Drain of run {escape(str(drain.get("run-id", "")))} requested</p>' if drain else ""
    )
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta http-equiv="refresh" content="5">
<title>{escape(str(status.get("job", "")))} · weirflow</title><style>{_STYLE}</style></head>
<body>
<h1>{escape(str(status.get("job", "")))}</h1>
<p class="facts"><span>leader <b>{escape(str(status.get("leader") or "none"))}</b></span>
<span>job model <b>v{escape(str(status.get("job_model_version", "")))}</b></span>
<span>tasks <b>{escape(str(status.get("task_count", "")))}</b></span>
<span>run <b>{escape(str(status.get("run_id", "")))}</b></span></p>
{drain_html}
<h2>Processors</h2>
{_table(["processor", "state", "live", "heartbeat", "tasks", "endpoint"], proc_rows, classes)}
<h2>Tasks</h2>
{
        _table(
            ["task", "state", "processor", "lag", "records in", "last batch", "last checkpoint", "dead letters"],
            task_rows,
        )
    }
{silent_html}
</body></html>
"""
