"""Line charts as inline SVG, drawn on the server: the status page's throughput and lag over time.

The page has no scripts and no external assets (`weirflow.endpoints.page`), so a chart is markup: one
``<polyline>`` per series, scaled from zero to the largest value shown, a time axis from the window's start
to now, and a caption with each series' latest and largest value as text (what a reader, or a test, reads
without measuring lines). A gap in the samples (a null) breaks the line rather than drawing through it.
"""

from __future__ import annotations

from dataclasses import dataclass
from html import escape

_WIDTH, _HEIGHT = 560, 140
_LEFT, _RIGHT, _TOP, _BOTTOM = 52, 8, 8, 20  # margins of the plot area, for the axis labels


@dataclass(frozen=True)
class Series:
    """``points``: (epoch ms, value or None), oldest first; ``css_class`` colours the line."""

    label: str
    css_class: str
    points: list[tuple[int, float | None]]


def _number(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 100 or value == int(value) else f"{value:,.1f}"


def line_chart(title: str, unit: str, series: list[Series], start_ms: int, end_ms: int) -> str:
    """A ``<figure>`` with the chart of ``series`` between ``start_ms`` and ``end_ms``."""
    values = [v for s in series for _, v in s.points if v is not None]
    top = max(values, default=0.0) or 1.0
    span = max(1, end_ms - start_ms)
    plot_w, plot_h = _WIDTH - _LEFT - _RIGHT, _HEIGHT - _TOP - _BOTTOM

    def xy(at_ms: int, value: float) -> str:
        x = _LEFT + (min(max(at_ms, start_ms), end_ms) - start_ms) / span * plot_w
        y = _TOP + plot_h - value / top * plot_h
        return f"{x:.1f},{y:.1f}"

    lines = []
    captions = []
    for s in series:
        runs: list[list[str]] = [[]]
        for at, value in s.points:
            if value is None:
                runs.append([])
            else:
                runs[-1].append(xy(at, value))
        for run in runs:
            if run:
                lines.append(
                    f'<polyline class="{s.css_class}" data-series="{escape(s.label)}" fill="none" '
                    f'points="{" ".join(run)}"/>'
                )
        known = [v for _, v in s.points if v is not None]
        if known:
            captions.append(
                f'<span class="{s.css_class}">{escape(s.label)} <b>{_number(known[-1])}</b> {escape(unit)} now, '
                f"max {_number(max(known))}</span>"
            )
        else:
            captions.append(f'<span class="{s.css_class}">{escape(s.label)}: no samples yet</span>')
    minutes = span / 60_000
    bottom = _TOP + plot_h
    axes = (
        f'<line class="axis" x1="{_LEFT}" y1="{bottom}" x2="{_WIDTH - _RIGHT}" y2="{bottom}"/>'
        f'<line class="grid" x1="{_LEFT}" y1="{_TOP}" x2="{_WIDTH - _RIGHT}" y2="{_TOP}"/>'
        f'<text x="{_LEFT - 4}" y="{_TOP + 4}" text-anchor="end">{_number(top)}</text>'
        f'<text x="{_LEFT - 4}" y="{bottom}" text-anchor="end">0</text>'
        f'<text x="{_LEFT}" y="{_HEIGHT - 4}">−{minutes:.0f} min</text>'
        f'<text x="{_WIDTH - _RIGHT}" y="{_HEIGHT - 4}" text-anchor="end">now</text>'
    )
    return (
        f'<figure class="chart"><figcaption><b>{escape(title)}</b> {" ".join(captions)}</figcaption>'
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {_WIDTH} {_HEIGHT}" width="{_WIDTH}" '
        f'height="{_HEIGHT}" role="img" aria-label="{escape(title)}">{axes}{"".join(lines)}</svg></figure>'
    )
