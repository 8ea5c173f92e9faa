"""Server-rendered SVG charts: no chart library.

The CSP forbids inline script and inline styles, so charts are plain SVG
elements with presentation attributes (``stroke``, ``fill``), which CSP does
not govern; values show on hover through SVG ``<title>`` elements. Clock
times are rendered in UTC with ``data-clock`` (UNIX seconds), which
``static/local-time.js`` turns into the viewer's own clock. Every piece of
text goes through ``escape``.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from flask_babel import gettext as _
from markupsafe import Markup, escape

from app.pages.aggregates import DAY_MINUTES, per_minute_average

COLORS = {"claims": "#2563eb", "completions": "#16a34a", "failures": "#dc2626"}
HOUR = 60
DAY_BUCKET_MINUTES = 5
# Clock labels along x: every 10 minutes of the hour chart, every 4 hours of
# the day's (whole hours in UTC, so zones a whole number of hours away read
# round times too).
HOUR_TICK_MINUTES, DAY_TICK_MINUTES = 10, 240


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


def _utc(minute: datetime) -> datetime:
    return minute.replace(tzinfo=UTC) if minute.tzinfo is None else minute.astimezone(UTC)


def _clock(minute: datetime) -> str:
    """A tick or hover's time as UTC ``HH:MM``; ``data-clock`` lets
    static/local-time.js put the viewer's own clock in its place."""
    return _utc(minute).strftime("%H:%M")


def _clock_attr(minute: datetime) -> str:
    return f' data-clock="{int(_utc(minute).timestamp())}"'


def _ticks(first: datetime, last: datetime, step_minutes: int) -> list[datetime]:
    """The whole multiples of ``step_minutes`` (of the UTC day) from ``first`` to ``last``."""
    start = _utc(first).replace(second=0, microsecond=0)
    midnight = start.replace(hour=0, minute=0)
    since = int((start - midnight).total_seconds() // 60)
    at = midnight + timedelta(minutes=-(-since // step_minutes) * step_minutes)
    out = []
    while at <= _utc(last):
        out.append(at)
        at += timedelta(minutes=step_minutes)
    return out


def line_chart(series: list[Series], *, title: str, ends: tuple[datetime, datetime], tick_minutes: int,
               unit: str | None = None, width: int = 720, height: int = 200) -> Markup:
    """A line chart of equally spaced values, oldest left: a legend, a y
    scale, clock times along x (the first value is at ``ends[0]``, the last at
    ``ends[1]``), and each point's values on hover (an SVG ``<title>`` per
    column, which needs no script)."""
    unit = _("/min") if unit is None else unit
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
    count = max((len(s.values) for s in series), default=0)
    first, last = ends
    span = (last - first) / max(count - 1, 1)
    for at in _ticks(first, last, tick_minutes):  # clock times along the bottom, on round minutes
        x = left + plot_w * ((at - first) / (last - first) if last > first else 1)
        parts.append(f'<line x1="{x:.1f}" y1="{top + plot_h}" x2="{x:.1f}" y2="{top + plot_h + 4}" '
                     f'stroke="#a1a1aa"/>')
        parts.append(f'<text x="{x:.1f}" y="{height - 6}" text-anchor="middle" font-size="11" '
                     f'fill="#52525b"{_clock_attr(at)}>{_clock(at)}</text>')
    legend_x = left
    for s in series:
        points = _points(s.values, left, top, plot_w, plot_h, top_value) if s.values else ""
        parts.append(f'<polyline fill="none" stroke="{escape(s.color)}" stroke-width="1.5" '
                     f'stroke-linejoin="round" points="{points}"/>')
        label = _("%(series)s (peak %(peak)s%(unit)s)", series=s.label,
                  peak=_number(max(s.values, default=0)), unit=unit)
        parts.append(f'<rect x="{legend_x}" y="6" width="10" height="10" fill="{escape(s.color)}"/>')
        parts.append(f'<text x="{legend_x + 14}" y="15" font-size="12" fill="#18181b">'
                     f"{escape(label)}</text>")
        legend_x += 14 + _text_width(label) + 16
    if count:  # hover: one transparent column per point with its time and values
        column = plot_w / max(count - 1, 1)
        for i in range(count):
            at = first + span * i
            values = " · ".join(f"{s.label} {_number(s.values[i])}" for s in series if i < len(s.values))
            x = max(left, left + column * (i - 0.5))
            w = min(left + column * (i + 0.5), width - right) - x
            parts.append(f'<rect class="hover" x="{x:.1f}" y="{top}" width="{w:.1f}" height="{plot_h}" '
                         f'fill="transparent"><title{_clock_attr(at)}>{_clock(at)} — '
                         f"{escape(values)}{escape(unit)}</title></rect>")
    parts.append("</svg>")
    return Markup("".join(parts))


def _text_width(label: str) -> int:
    """About how wide a legend label is at 12 px: CJK characters take twice a Latin one."""
    return sum(12 if ord(ch) > 0x2E80 else 7 for ch in label)


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


def progress_bar(done: int, failed: int, total: int, *, title: str, width: int = 240,
                 height: int = 14) -> Markup:
    """A project's bar: done (green) then failed (red) of the total (grey)."""
    parts = [f'<svg class="progress-bar" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" '
             f'width="{width}" height="{height}" role="img" aria-label="{escape(title)}">'
             f"<title>{escape(title)}</title>",
             f'<rect x="0" y="0" width="{width}" height="{height}" rx="3" fill="#e4e4e7"/>']
    x = 0.0
    for count, color in ((done, COLORS["completions"]), (failed, COLORS["failures"])):
        w = width * count / total if total else 0
        if w > 0:
            parts.append(f'<rect x="{x:.1f}" y="0" width="{max(w, 1):.1f}" height="{height}" fill="{color}"/>')
            x += w
    parts.append("</svg>")
    return Markup("".join(parts))


def label(kind: str) -> str:
    """A series' name in the page's language."""
    return {"claims": _("claims"), "completions": _("completions"), "failures": _("failures")}[kind]


def throughput(series: dict[str, list[int]], now: datetime, *, project: str | None = None) -> dict:
    """The hour chart (every minute) and the day chart (5-minute averages, so
    the day stays readable at page width) of per-minute claims, completions
    and failures; ``now`` is the current minute, the last of each series."""
    hour = [Series(label(kind), values[-HOUR:], COLORS[kind]) for kind, values in series.items()]
    day = [Series(label(kind), per_minute_average(values, DAY_BUCKET_MINUTES), COLORS[kind])
           for kind, values in series.items()]
    suffix = _(", %(project)s", project=project) if project else ""
    day_start = now - timedelta(minutes=DAY_MINUTES - 1)
    day_last = day_start + timedelta(minutes=DAY_BUCKET_MINUTES * (len(day[0].values) - 1) if day else 0)
    return {
        "hour": line_chart(hour, title=_("Claims, completions and failures per minute, last hour")
                           + suffix, ends=(now - timedelta(minutes=HOUR - 1), now),
                           tick_minutes=HOUR_TICK_MINUTES),
        "day": line_chart(day, title=_("Claims, completions and failures per minute "
                                       "(5-minute averages), last day") + suffix,
                          ends=(day_start, day_last), tick_minutes=DAY_TICK_MINUTES),
        "last_hour": {kind: sum(values[-HOUR:]) for kind, values in series.items()},
    }
