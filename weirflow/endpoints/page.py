"""``GET /``: the job's status as a small HTML page (any processor serves it), from the same document as
``GET /status`` and `weirflow status`. No scripts and no external assets; it refreshes itself every 5 s.

What each part shows and where it comes from is in docs/endpoints.md ("Status page and metrics"): the
processors (a silent one as ``SILENT``, with where its tasks went: `weirflow.ops.status`), the last job model
changes and the count of failovers (the leader's record, `weirflow.coordination.model_history`), the tasks
(each live processor's ``GET /tasks``) and charts of throughput and lag over the last minutes (each live
processor's ``GET /status/history``, summed: `weirflow.endpoints.history`, drawn by `weirflow.endpoints.charts`).
"""

from __future__ import annotations

import time
from collections import Counter
from html import escape
from typing import Any

from weirflow.endpoints.charts import Series, line_chart

_STYLE = """
body { font: 14px system-ui, sans-serif; margin: 1.5rem; color: #1d232a; }
h1 { font-size: 1.3rem; margin: 0 0 .3rem; }
.facts span { margin-right: 1.5rem; }
table { border-collapse: collapse; margin: .8rem 0 1.5rem; }
th, td { border-bottom: 1px solid #d6dbe0; padding: .35rem .8rem; text-align: left; }
th { background: #f1f3f5; }
.dead { color: #a61b1b; }
.drain { background: #fff4d6; padding: .5rem .8rem; border-radius: 4px; display: inline-block; }
.note { color: #5c6670; }
ul.changes { padding-left: 1.2rem; }
.chart { display: inline-block; margin: 0 1.5rem 1rem 0; }
.chart svg { display: block; }
.chart text { font-size: 11px; fill: #5c6670; }
.chart .axis { stroke: #8a939c; }
.chart .grid { stroke: #e3e7eb; }
polyline { stroke-width: 2; }
.in { stroke: #1f6fb2; color: #1f6fb2; }
.out { stroke: #2f8a4c; color: #2f8a4c; }
.lag { stroke: #b26b1f; color: #b26b1f; }
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


def _silence(p: dict[str, Any]) -> str:
    """How long a silent processor has been silent, and where the tasks it last reported are now."""
    moved_to: dict[str, str | None] = p.get("moved_to") or {}
    owners = sorted({o for o in moved_to.values() if o is not None})
    unassigned = sum(1 for o in moved_to.values() if o is None)
    if p.get("assigned"):
        where = "the leader has not moved its tasks yet"
    elif owners:
        where = f"its tasks moved to {', '.join(owners)}" + (f"; {unassigned} unassigned" if unassigned else "")
    elif unassigned:
        where = "its tasks are unassigned"
    else:
        where = "it reported no tasks"
    return f"silent for {p.get('heartbeat_age_s', '?')} s — {where}"


def _processor_rows(processors: list[dict[str, Any]]) -> list[list[str]]:
    rows = []
    for p in processors:
        state = escape(str(p["state"]))
        if p.get("silent"):
            state = f'<b>{state}</b> <span class="note">{escape(_silence(p))}</span>'
        rows.append(
            [
                escape(str(p["processor_id"])) + (" (leader)" if p.get("leader") else ""),
                state,
                "yes" if p.get("live") else "no",
                f"{p.get('heartbeat_age_s', '')} s",
                escape(", ".join(p.get("tasks", []))),
                escape(str(p.get("endpoint") or "")),
            ]
        )
    return rows


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def describe_change(change: dict[str, Any], now_ms: int) -> str:
    """One job model change as a sentence: "v7 at 12:03:41 UTC (14 s ago): p0 went silent; 4 tasks moved p0 →
    p1"."""
    reason = change.get("reason") or {}
    why = [
        *(f"{p} went silent" for p in reason.get("silent", [])),
        *(f"{p} left" for p in reason.get("left", [])),
        *(f"{p} joined" for p in reason.get("joined", [])),
    ]
    if reason.get("latch_timed_out"):
        why.append("a processor did not join the previous model's latch in time")
    moves: Counter[tuple[str | None, str | None]] = Counter(
        (before, after) for before, after in (change.get("moved") or {}).values()
    )
    for (before, after), n in sorted(moves.items(), key=lambda m: (str(m[0][0]), str(m[0][1]))):
        if before is None:
            why.append(f"{_plural(n, 'task')} assigned to {after}")
        elif after is None:
            why.append(f"{_plural(n, 'task')} of {before} unassigned")
        else:
            why.append(f"{_plural(n, 'task')} moved {before} → {after}")
    at_ms = int(change.get("at_ms") or 0)
    at = time.strftime("%H:%M:%S", time.gmtime(at_ms / 1000))
    ago = f" ({max(0, now_ms - at_ms) // 1000} s ago)" if now_ms else ""
    return f"v{change.get('version')} at {at} UTC{ago}: {'; '.join(why) or 'no change of members or tasks'}"


def _changes_html(status: dict[str, Any], now_ms: int, shown: int = 8) -> str:
    changes = status.get("job_model_changes") or []
    if not changes:
        return '<p class="note">No job model change recorded yet.</p>'
    items = "".join(
        f'<li title="{escape(", ".join(sorted(c.get("moved") or {})))}">{escape(describe_change(c, now_ms))}</li>'
        for c in changes[:shown]
    )
    return f'<ul class="changes">{items}</ul>'


def _charts_html(status: dict[str, Any], now_ms: int) -> str:
    over_time = status.get("throughput")
    if not over_time:
        return ""
    series = over_time.get("series") or []
    window_ms = int(over_time.get("window_ms") or 600_000)
    start = now_ms - window_ms

    def points(key: str) -> list[tuple[int, float | None]]:
        return [(int(s["at_ms"]), s.get(key)) for s in series]

    rates = line_chart(
        "Records per second",
        "/s",
        [Series("in", "in", points("records_in_per_s")), Series("out", "out", points("records_out_per_s"))],
        start,
        now_ms,
    )
    lag = line_chart("Lag", "records", [Series("lag", "lag", points("lag"))], start, now_ms)
    summed = ", ".join(over_time.get("processors") or []) or "none"
    missing = over_time.get("missing") or {}
    missing_html = (
        '<p class="dead">No history from '
        + escape(", ".join(f"{p} ({e})" for p, e in sorted(missing.items())))
        + "</p>"
        if missing
        else ""
    )
    return (
        f"<h2>Throughput and lag, last {window_ms // 60_000} min</h2>"
        f'<p class="note">summed over {escape(summed)}</p>{rates}{lag}{missing_html}'
    )


def render_status_page(status: dict[str, Any]) -> str:
    processors = status.get("processors", [])
    owner = {task: p for p, tasks in status.get("assignment", {}).items() for task in tasks}
    proc_rows = _processor_rows(processors)
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
<span>failovers <b>{escape(str(status.get("failovers", 0)))}</b></span>
<span>run <b>{escape(str(status.get("run_id", "")))}</b></span></p>
{drain_html}
<h2>Processors</h2>
{_table(["processor", "state", "live", "heartbeat", "tasks", "endpoint"], proc_rows, classes)}
<h2>Job model changes</h2>
{_changes_html(status, now_ms)}
{_charts_html(status, now_ms)}
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
