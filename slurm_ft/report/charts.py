"""Inline SVG charts for the HTML drain report: faults per day by class (stacked bars), the nodes
with the most faults (horizontal bars) and the Xid histogram. No JavaScript, no external file:
the report opens offline in any browser.

Every label is untrusted text (node names and Xid keys come from Slurm and the journal): it is
XML-escaped here, and the SVG is returned as :class:`markupsafe.Markup` so the template's
autoescape does not escape it twice. Shapes: each function returns one ``<svg>`` element string,
or an empty Markup when there is nothing to draw.
"""

from __future__ import annotations

from collections import Counter

from markupsafe import Markup
from markupsafe import escape as _xml_escape

from slurm_ft.textsafe import terminal_safe

#: One colour per fault class (colour-blind safe palette, Okabe-Ito).
CLASS_COLOURS = {"hardware": "#D55E00", "hang": "#CC79A7", "infra": "#0072B2", "unknown": "#999999"}
BAR = "#0072B2"
#: Most bars one chart draws (the rest are summed into the table below it).
MAX_BARS = 30
_FONT = 'font-family="sans-serif" font-size="11"'


def escape(text) -> Markup:
    """A label as SVG text: control characters made visible (XML cannot hold most of them, even
    escaped; slurm_ft.textsafe.terminal_safe), then XML-escaped."""
    return _xml_escape(terminal_safe(str(text)))


def _svg(width: int, height: int, title: str, body: list[str]) -> Markup:
    head = (f'<svg xmlns="http://www.w3.org/2000/svg" role="img" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}"><title>{escape(title)}</title>')
    return Markup(head + "".join(body) + "</svg>")


def faults_per_day(per_day: dict[str, Counter], classes=tuple(CLASS_COLOURS)) -> Markup:
    """Stacked bars: one bar a day (``YYYY-MM-DD`` keys, oldest first, at most MAX_BARS days:
    the newest), one segment a fault class, a legend on top."""
    days = sorted(per_day)[-MAX_BARS:]
    if not days:
        return Markup("")
    top = max(sum(per_day[d].values()) for d in days) or 1
    bw, gap, left, plot_h, head = 22, 6, 36, 160, 28
    height = head + plot_h + 70
    body = []
    x = left
    for cls in classes:                                       # legend
        body.append(f'<rect x="{x}" y="6" width="10" height="10" fill="{CLASS_COLOURS.get(cls, BAR)}"/>'
                    f'<text x="{x + 14}" y="15" {_FONT}>{escape(cls)}</text>')
        x += 14 + 7 * len(cls) + 12
    width = max(x, left + len(days) * (bw + gap) + 20)
    base = head + plot_h
    body.append(f'<line x1="{left}" y1="{base}" x2="{width - 10}" y2="{base}" stroke="#333"/>'
                f'<text x="4" y="{head + 10}" {_FONT}>{top}</text><text x="4" y="{base}" {_FONT}>0</text>')
    for i, day in enumerate(days):
        x = left + i * (bw + gap)
        y = base
        for cls in classes:
            k = per_day[day].get(cls, 0)
            if not k:
                continue
            h = k / top * plot_h
            y -= h
            body.append(f'<rect x="{x}" y="{y:.1f}" width="{bw}" height="{h:.1f}" '
                        f'fill="{CLASS_COLOURS.get(cls, BAR)}"><title>{escape(day)}: {k} {escape(cls)}</title></rect>')
        body.append(f'<text {_FONT} transform="translate({x + bw / 2:.0f},{base + 8}) rotate(60)">'
                    f'{escape(day[5:])}</text>')
    return _svg(width, height, "Faults per day by class", body)


def hbars(counts: Counter, title: str, label=str, limit: int = 15) -> Markup:
    """Horizontal bars of the ``limit`` largest counts (label: key -> text), largest first."""
    items = [(k, v) for k, v in counts.most_common(limit) if v > 0]
    if not items:
        return Markup("")
    top = items[0][1]
    row, left, plot_w = 18, 150, 300
    width, height = left + plot_w + 60, row * len(items) + 10
    body = []
    for i, (k, v) in enumerate(items):
        y = 4 + i * row
        w = max(1.0, v / top * plot_w)
        text = label(k)
        if len(text) > 22:
            text = text[:21] + "\u2026"
        body.append(f'<text x="{left - 6}" y="{y + 12}" text-anchor="end" {_FONT}>{escape(text)}</text>'
                    f'<rect x="{left}" y="{y}" width="{w:.1f}" height="{row - 4}" fill="{BAR}"/>'
                    f'<text x="{left + w + 4:.1f}" y="{y + 12}" {_FONT}>{escape(_num(v))}</text>')
    return _svg(width, height, title, body)


def xid_histogram(xids_by_node: dict[str, Counter]) -> Markup:
    """Vertical bars: hardware faults per Xid over all nodes, in Xid order."""
    total: Counter = Counter()
    for c in xids_by_node.values():
        total.update(c)
    keys = sorted(total, key=_xid_order)
    keys = keys[:MAX_BARS]
    if not keys:
        return Markup("")
    top = max(total[k] for k in keys)
    bw, gap, left, plot_h, top_m = 28, 8, 30, 140, 16
    base = top_m + plot_h
    width, height = left + len(keys) * (bw + gap) + 10, base + 34
    body = [f'<line x1="{left}" y1="{base}" x2="{width - 5}" y2="{base}" stroke="#333"/>']
    for i, k in enumerate(keys):
        x = left + i * (bw + gap)
        h = total[k] / top * plot_h
        body.append(f'<rect x="{x}" y="{base - h:.1f}" width="{bw}" height="{h:.1f}" fill="{BAR}">'
                    f'<title>Xid {escape(str(k))}: {total[k]}</title></rect>'
                    f'<text x="{x + bw / 2}" y="{base + 14}" text-anchor="middle" {_FONT}>{escape(str(k))}</text>'
                    f'<text x="{x + bw / 2}" y="{base - h - 4:.1f}" text-anchor="middle" {_FONT}>{total[k]}</text>')
    body.append(f'<text x="{left}" y="{base + 30}" {_FONT}>Xid</text>')
    return _svg(width, height, "Hardware faults per Xid", body)


def _xid_order(x) -> tuple:
    """Xids in number order, anything else after them by text (ASCII digits only: ``"²"`` is
    a digit to ``str.isdigit`` but not a number)."""
    s = str(x)
    number = s.isascii() and s.isdigit()
    return (not number, int(s) if number else 0, s)


def _num(v) -> str:
    return f"{v:.1f}" if isinstance(v, float) else str(v)
