"""Server-rendered SVG charts: no JavaScript, no chart library.

The CSP forbids inline script and inline styles, so charts are plain SVG
elements with presentation attributes (``stroke``, ``fill``), which CSP does
not govern. Every piece of text goes through ``escape``.
"""
from __future__ import annotations

from dataclasses import dataclass

from markupsafe import Markup, escape

from app.pages.aggregates import per_minute_average

COLORS = {"claims": "#2563eb", "completions": "#16a34a"}
HOUR = 60
DAY_BUCKET_MINUTES = 5


@dataclass(frozen=True)
class Series:
    label: str
    values: list[float]
    color: str


def _nice_ceiling(value: float) -> float:
    """The smallest 1/2/5 × 10^k at or above ``value`` (at least 1)."""
    if value <= 1:
        return 1.0
    magnitude = 1.0
    while magnitude * 10 <= value:
        magnitude *= 10
    for step in (1, 2, 5, 10):
        if step * magnitude >= value:
            return step * magnitude
    return 10 * magnitude


def _number(value: float) -> str:
    if value >= 10_000:
        return f"{value / 1000:.0f}k"
    if value >= 1000:
        return f"{value / 1000:.1f}k"
    if value == int(value):
        return str(int(value))
    return f"{value:.1f}"


def _points(values: list[float], left: float, top: float, width: float, height: float,
            top_value: float) -> str:
    if len(values) == 1:
        values = values * 2
    step = width / (len(values) - 1)
    return " ".join(f"{left + i * step:.1f},{top + height - (v / top_value) * height:.1f}"
                    for i, v in enumerate(values))


def line_chart(series: list[Series], *, title: str, x_labels: tuple[str, str],
               unit: str = "/min", width: int = 720, height: int = 200) -> Markup:
    """A line chart of equally spaced values, oldest left, with a legend and a y scale."""
    left, right, top, bottom = 48, 8, 24, 22
    plot_w, plot_h = width - left - right, height - top - bottom
    peak = max((max(s.values) for s in series if s.values), default=0)
    top_value = _nice_ceiling(peak)
    parts = [f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" '
             f'width="100%" role="img" aria-label="{escape(title)}">',
             f"<title>{escape(title)}</title>"]
    for fraction in (0, 0.5, 1):
        y = top + plot_h - fraction * plot_h
        parts.append(f'<line x1="{left}" y1="{y:.1f}" x2="{width - right}" y2="{y:.1f}" '
                     f'stroke="#d4d4d8" stroke-width="1"/>')
        parts.append(f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end" font-size="11" '
                     f'fill="#52525b">{escape(_number(top_value * fraction))}</text>')
    parts.append(f'<text x="{left}" y="{height - 6}" font-size="11" fill="#52525b">'
                 f"{escape(x_labels[0])}</text>")
    parts.append(f'<text x="{width - right}" y="{height - 6}" text-anchor="end" font-size="11" '
                 f'fill="#52525b">{escape(x_labels[1])}</text>')
    legend_x = left
    for s in series:
        points = _points(s.values, left, top, plot_w, plot_h, top_value) if s.values else ""
        parts.append(f'<polyline fill="none" stroke="{escape(s.color)}" stroke-width="1.5" '
                     f'stroke-linejoin="round" points="{points}"/>')
        label = f"{s.label} (peak {_number(max(s.values, default=0))}{unit})"
        parts.append(f'<rect x="{legend_x}" y="6" width="10" height="10" fill="{escape(s.color)}"/>')
        parts.append(f'<text x="{legend_x + 14}" y="15" font-size="12" fill="#18181b">'
                     f"{escape(label)}</text>")
        legend_x += 14 + 7 * len(label) + 16
    parts.append("</svg>")
    return Markup("".join(parts))


def sparkline(series: list[Series], *, title: str, width: int = 120, height: int = 28) -> Markup:
    """A tiny chart for table rows: lines only, its numbers in the title."""
    peak = max((max(s.values) for s in series if s.values), default=0)
    top_value = _nice_ceiling(peak)
    parts = [f'<svg class="sparkline" xmlns="http://www.w3.org/2000/svg" '
             f'viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img" '
             f'aria-label="{escape(title)}"><title>{escape(title)}</title>',
             f'<line x1="0" y1="{height - 1}" x2="{width}" y2="{height - 1}" stroke="#d4d4d8"/>']
    for s in series:
        if s.values:
            points = _points(s.values, 1, 2, width - 2, height - 4, top_value)
            parts.append(f'<polyline fill="none" stroke="{escape(s.color)}" stroke-width="1.2" '
                         f'points="{points}"/>')
    parts.append("</svg>")
    return Markup("".join(parts))


def throughput(series: dict[str, list[int]], *, title_suffix: str = "") -> dict:
    """The hour chart (every minute) and the day chart (5-minute averages, so
    the day stays readable at page width) of per-minute claims and completions."""
    hour = [Series(kind, values[-HOUR:], COLORS[kind]) for kind, values in series.items()]
    day = [Series(kind, per_minute_average(values, DAY_BUCKET_MINUTES), COLORS[kind])
           for kind, values in series.items()]
    return {
        "hour": line_chart(hour, title=f"Claims and completions per minute, last hour{title_suffix}",
                           x_labels=("-60 min", "now")),
        "day": line_chart(day, title=f"Claims and completions per minute (5-minute averages), "
                                     f"last day{title_suffix}", x_labels=("-24 h", "now")),
        "last_hour": {kind: sum(values[-HOUR:]) for kind, values in series.items()},
    }
