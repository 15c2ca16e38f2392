"""Line plots written as SVG files without matplotlib: the plots of the run reports.

A :class:`Figure` is a row of :class:`Panel` s with one legend on its right (every labelled
line, once). A panel holds lines (with markers), bands, horizontal and vertical reference lines
and notes at its top, over a linear x axis and a linear, log or symlog y axis. Whatever shows
the SVG lays out its text: writing one is string formatting, with neither matplotlib's import
nor its text layout (docs/results/startup.md). A non-finite point (or one at or below zero on
a log axis) breaks its line, as in matplotlib.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path

#: matplotlib's default colour cycle ("tab10"): a line without a colour takes the next one in its panel
COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")
DASHES = {"-": "", "--": "6,3", ":": "1.5,2.5", "-.": "6,2,1.5,2"}  # line style -> stroke-dasharray
CHAR = 0.6  # a character's width in font sizes (DejaVu Sans is about 0.55-0.6): sizes the margins only
TICK_FONT, LABEL_FONT = 11, 12
FORWARD = {"linear": lambda v: v, "log": lambda v: math.log10(v) if v > 0 else math.nan,
           "symlog": lambda v: math.copysign(math.log10(1 + abs(v)), v)}  # linear near 0, log beyond 1
INVERSE = {"linear": lambda t: t, "log": lambda t: 10.0**t, "symlog": lambda t: math.copysign(10.0 ** abs(t) - 1, t)}


class Panel:
    """One axes of a :class:`Figure`: set ``title``, ``xlabel``, ``ylabel``, ``yscale`` ("linear",
    "log" or "symlog") and ``integer_x`` (ticks at whole numbers only), then add what it shows."""

    def __init__(self) -> None:
        self.title = self.xlabel = self.ylabel = ""
        self.yscale, self.integer_x = "linear", False
        self.lines: list[dict] = []
        self.bands: list[tuple[list[float], list[float], list[float], str, float]] = []
        self.hlines: list[dict] = []
        self.vlines: list[dict] = []
        self.notes: list[tuple[float, str]] = []

    def plot(self, x: Iterable[float], y: Iterable[float], color: str | None = None, label: str | None = None,
             width: float = 1.5, dash: str | None = "-", alpha: float = 1.0, marker: str | None = None) -> str:
        """A line through the points (no line with ``dash=None``), ``marker`` "." or "o" (a dot) or "x" on each
        point; return its colour (the next of :data:`COLORS` in this panel when not given)."""
        x, y = [float(v) for v in x], [float(v) for v in y]
        if len(x) != len(y):
            raise ValueError(f"plot {label or ''!r}: {len(x)} x values but {len(y)} y values")
        if dash is not None and dash not in DASHES or marker not in (None, ".", "o", "x"):
            raise ValueError(f"plot {label or ''!r}: line style {dash!r} or marker {marker!r} unknown")
        auto = color is None  # matplotlib's cycle: only lines without a colour take the next one
        color = color or COLORS[sum(line["auto"] for line in self.lines) % len(COLORS)]
        self.lines.append(dict(x=x, y=y, color=color, label=label, width=width, dash=dash, alpha=alpha,
                               marker=marker, auto=auto))
        return color

    def band(self, x: Iterable[float], low: Iterable[float], high: Iterable[float], color: str,
             alpha: float = 0.12) -> None:
        """The area between ``low`` and ``high``, filled."""
        x, low, high = [float(v) for v in x], [float(v) for v in low], [float(v) for v in high]
        if not len(x) == len(low) == len(high):
            raise ValueError(f"band: {len(x)} x values, {len(low)} low and {len(high)} high values")
        self.bands.append((x, low, high, color, alpha))

    def hline(self, y: float, color: str = "black", dash: str = "--", width: float = 0.8,
              label: str | None = None) -> None:
        self.hlines.append(dict(at=float(y), color=color, dash=dash, width=width, label=label))

    def vline(self, x: float, color: str = "black", dash: str = "--", width: float = 1.0,
              label: str | None = None) -> None:
        self.vlines.append(dict(at=float(x), color=color, dash=dash, width=width, label=label))

    def note(self, x: float, text: str) -> None:
        """``text`` at the top of the panel, starting at ``x``."""
        self.notes.append((float(x), text))


class Figure:
    """``ncols`` panels side by side (:attr:`panels`), each ``size`` pixels (width, height); ``sharey``:
    one y range for all; ``title`` above them. :meth:`save` writes it."""

    def __init__(self, ncols: int = 1, size: tuple[float, float] = (540, 380), sharey: bool = False, title: str = ""):
        self.panels = [Panel() for _ in range(ncols)]
        self.size, self.sharey, self.title = size, sharey, title

    def save(self, out: Path) -> Path:
        """Write the figure to ``out`` as SVG."""
        legend = {}
        for p in self.panels:
            for item in (*p.lines, *p.hlines, *p.vlines):
                legend.setdefault(item["label"], item)
        legend.pop(None, None)
        legend_w = 50 + CHAR * TICK_FONT * max(map(len, legend)) if legend else 0
        cw, ch = self.size
        width, bottom = cw * len(self.panels) + legend_w, ch - 48
        top = 10 + 26 * bool(self.title) + 22 * any(p.title for p in self.panels)
        svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{ch:.0f}" '
               f'viewBox="0 0 {width:.0f} {ch:.0f}" font-family="DejaVu Sans, Arial, sans-serif" font-size="{TICK_FONT}">',
               '<rect width="100%" height="100%" fill="white"/>']
        if self.title:
            svg.append(_text(width / 2, 24, self.title, 14, "middle"))
        ys = [_ys(p, p.yscale) for p in self.panels]
        shared = _limits([v for y in ys for v in y]) if self.sharey else None
        for i, p in enumerate(self.panels):
            xlim, ylim = _limits(_xs(p, p.yscale)), shared or _limits(ys[i])
            xticks, yticks = _nice(*xlim, p.integer_x), _ticks(p.yscale, *ylim)
            left = cw * i + 18 * bool(p.ylabel) + CHAR * TICK_FONT * max((len(s) for _, s in yticks[0]), default=1) + 12
            right = cw * (i + 1) - 14
            px = lambda v, a=left, b=right, lim=xlim: a + (v - lim[0]) / (lim[1] - lim[0]) * (b - a)
            py = lambda t, lim=ylim: bottom - (t - lim[0]) / (lim[1] - lim[0]) * (bottom - top)
            svg += _panel(p, px, py, FORWARD[p.yscale], (left, right, top, bottom), xticks, yticks, cw * i)
        x = width - legend_w + 4
        if legend:
            svg.append(f'<rect x="{x:.1f}" y="{top:.1f}" width="{legend_w - 10:.1f}" height="{19 * len(legend) + 8}" '
                       'fill="white" stroke="#cccccc"/>')
        for k, (label, item) in enumerate(legend.items()):
            y = top + 12 + 19 * k
            svg.append(_stroke(f"M{x + 6:.1f},{y:.1f}h26", item) if item.get("dash") else "")
            svg += _markers([(x + 19, y)], item) + [_text(x + 38, y + 4, label)]
        out.write_text("\n".join(s for s in svg if s) + "\n</svg>\n")
        return out


def _panel(p: Panel, px, py, fy, box, xticks, yticks, cell_left) -> list[str]:
    """The SVG elements of one panel: grid, bands, lines, markers, reference lines, frame, ticks and text."""
    left, right, top, bottom = box
    out = [f'<path d="{"".join(f"M{px(v):.1f},{top:.1f}V{bottom:.1f}" for v, _ in xticks)}'
           f'{"".join(f"M{left:.1f},{py(t):.1f}H{right:.1f}" for t, _ in yticks[0])}" stroke="#b0b0b0" '
           'stroke-opacity="0.4" stroke-width="0.8"/>']
    for x, low, high, color, alpha in p.bands:
        for run in _runs([(a, fy(lo), fy(hi)) for a, lo, hi in zip(x, low, high)]):
            edge = [(px(a), py(hi)) for a, _, hi in run] + [(px(a), py(lo)) for a, lo, _ in reversed(run)]
            out.append(f'<polygon points="{_points(edge)}" fill="{color}" fill-opacity="{alpha}" stroke="none"/>')
    for line in p.lines:
        runs = [[(px(a), py(t)) for a, t in run] for run in _runs([(a, fy(b)) for a, b in zip(line["x"], line["y"])])]
        if line["dash"] is not None:
            out += [_stroke("M" + _points(_thin(run, right - left)).replace(" ", "L"), line)
                    for run in runs if len(run) > 1]
        out += _markers([q for run in runs for q in run], line)
    out += [_stroke(f"M{left:.1f},{py(fy(h['at'])):.1f}H{right:.1f}", h)
            for h in p.hlines if math.isfinite(fy(h["at"]))]
    out += [_stroke(f"M{px(v['at']):.1f},{top:.1f}V{bottom:.1f}", v) for v in p.vlines]
    out += [_text(px(x) + 3, top + 12, text, 10) for x, text in p.notes]
    out.append(f'<rect x="{left:.1f}" y="{top:.1f}" width="{right - left:.1f}" height="{bottom - top:.1f}" '
               'fill="none" stroke="black" stroke-width="0.8"/>')
    ticks = "".join(f"M{px(v):.1f},{bottom:.1f}v4" for v, _ in xticks) + "".join(
        f"M{left:.1f},{py(t):.1f}h-4" for t, _ in yticks[0]) + "".join(f"M{left:.1f},{py(t):.1f}h-2" for t in yticks[1])
    out.append(f'<path d="{ticks}" stroke="black" stroke-width="0.8"/>')
    out += [_text(px(v), bottom + 17, s, anchor="middle") for v, s in xticks]
    out += [_text(left - 7, py(t) + 4, s, anchor="end") for t, s in yticks[0]]
    out.append(_text((left + right) / 2, bottom + 38, p.xlabel, LABEL_FONT, "middle"))
    mid = (top + bottom) / 2
    turn = f' transform="rotate(-90 {cell_left + 16} {mid:.1f})"'
    out.append(_text(cell_left + 16, mid, p.ylabel, LABEL_FONT, "middle", turn))
    out.append(_text((left + right) / 2, top - 8, p.title, 13, "middle"))
    return out


def _xs(p: Panel, scale: str) -> list[float]:
    """The x values a panel shows: its lines' points that have a y on the axis, its bands, lines and notes."""
    f = FORWARD[scale]
    return ([a for line in p.lines for a, b in zip(line["x"], line["y"]) if math.isfinite(f(b))]
            + [a for x, *_ in p.bands for a in x] + [v["at"] for v in p.vlines] + [x for x, _ in p.notes])


def _ys(p: Panel, scale: str) -> list[float]:
    """The y values a panel shows, on its axis (transformed by ``scale``)."""
    f = FORWARD[scale]
    return ([f(b) for line in p.lines for b in line["y"]] + [f(b) for _, low, high, *_ in p.bands for b in low + high]
            + [f(h["at"]) for h in p.hlines])


def _limits(values: list[float]) -> tuple[float, float]:
    """The finite values' range with 5% either side (a single value: +-0.5; none: 0 to 1)."""
    kept = [v for v in values if math.isfinite(v)]
    if not kept:
        return 0.0, 1.0
    lo, hi = min(kept), max(kept)
    if hi - lo <= 1e-9 * max(1.0, abs(lo)):
        return lo - 0.5, hi + 0.5
    return lo - 0.05 * (hi - lo), hi + 0.05 * (hi - lo)


def _nice(lo: float, hi: float, integer: bool = False) -> list[tuple[float, str]]:
    """About 4 to 7 ticks at multiples of 1, 2, 2.5 or 5 times a power of ten between ``lo`` and ``hi``, labelled."""
    raw = (hi - lo) / 6
    mag = 10.0 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw * (1 - 1e-9))
    step = max(1.0, float(round(step))) if integer else step
    ticks = [k * step for k in range(math.ceil(lo / step - 1e-9), math.floor(hi / step + 1e-9) + 1)]
    decimals = next((d for d in range(10) if abs(round(step, d) - step) <= 1e-9 * step), 10)
    big = max(abs(lo), abs(hi))
    if decimals <= 5 and big < 1e6:
        return [(v, f"{v:.{decimals}f}") for v in ticks]
    digits = max(1, math.floor(math.log10(big)) - math.floor(math.log10(step)) + 2)
    return [(v, f"{v:.{digits}g}") for v in ticks]


def _ticks(scale: str, lo: float, hi: float) -> tuple[list[tuple[float, str]], list[float]]:
    """The y ticks between ``lo`` and ``hi`` (on the transformed axis): (position, label) and unlabelled positions.

    Log: a tick per decade (at most 8, minor ticks at 2-9 times each) over three decades or more, else at 1, 2
    and 5 times powers of ten; symlog: at 0 and +-powers of ten; else (fewer than 3 of those) evenly spaced values."""
    f = FORWARD[scale]
    if scale == "log" and math.floor(hi) - math.ceil(lo) >= 2:
        decades = list(range(math.ceil(lo), math.floor(hi) + 1))
        step = -(-len(decades) // 8)
        minor = [k + math.log10(m) for k in range(math.floor(lo), math.ceil(hi)) for m in range(2, 10)]
        minor = minor if step == 1 else []
        return [(k, f"{10.0**k:g}") for k in decades[::step]], [t for t in minor if lo <= t <= hi]
    if scale != "linear":
        top = math.ceil(hi) + 1 if scale == "log" else math.ceil(max(-lo, hi)) + 1
        powers = range(math.floor(lo) - 1 if scale == "log" else 0, top)
        factors = (1, 2, 5) if scale == "log" else (1, -1)
        kept = sorted(v for v in [0.0] * (scale == "symlog") + [m * 10.0**k for k in powers for m in factors]
                      if lo <= f(v) <= hi)
        if len(kept) >= 3:
            return [(f(v), f"{v:g}") for v in kept[:: -(-len(kept) // 8)]], []
    ticks = _nice(INVERSE[scale](lo), INVERSE[scale](hi))
    return [(f(v), s) for v, s in ticks if math.isfinite(f(v)) and lo <= f(v) <= hi], []


def _runs(points: list[tuple[float, ...]]) -> list[list[tuple[float, ...]]]:
    """The stretches of consecutive points whose coordinates are all finite."""
    runs: list[list[tuple[float, ...]]] = [[]]
    for q in points:
        if all(math.isfinite(v) for v in q):
            runs[-1].append(q)
        elif runs[-1]:
            runs.append([])
    return [r for r in runs if r]


def _thin(run: list[tuple[float, float]], width: float) -> list[tuple[float, float]]:
    """A line of more points than twice the pixels across: of each stretch of points within one pixel column,
    the first, lowest, highest and last (the same picture, a bounded file)."""
    if len(run) <= 2 * width:
        return run
    out, start = [], 0
    for i in range(1, len(run) + 1):
        if i == len(run) or int(run[i][0]) != int(run[start][0]):
            column = range(start, i)
            keep = {start, i - 1, min(column, key=lambda j: run[j][1]), max(column, key=lambda j: run[j][1])}
            out += [run[j] for j in sorted(keep)]
            start = i
    return out


def _points(points: list[tuple[float, float]]) -> str:
    return " ".join(f"{a:.1f},{b:.1f}" for a, b in points)


def _stroke(path: str, item: dict) -> str:
    """``path`` drawn in the colour, width, line style and opacity of ``item`` (a line or a reference line)."""
    dash, alpha = DASHES[item["dash"]], item.get("alpha", 1)
    return (f'<path d="{path}" fill="none" stroke="{item["color"]}" stroke-width="{item["width"]}"'
            + (f' stroke-dasharray="{dash}"' if dash else "") + (f' stroke-opacity="{alpha:.3g}"' if alpha < 1 else "")
            + ' stroke-linejoin="round"/>')


def _markers(points: list[tuple[float, float]], item: dict) -> list[str]:
    """The markers of a line (``item``) at ``points`` (pixels): crosses, or dots of two sizes."""
    marker, color, alpha = item.get("marker"), item["color"], item.get("alpha", 1)
    if marker == "x" and points:
        cross = "".join(f"M{a - 4:.1f},{b - 4:.1f}l8,8M{a - 4:.1f},{b + 4:.1f}l8,-8" for a, b in points)
        return [f'<path d="{cross}" stroke="{color}" stroke-width="1.5" stroke-opacity="{alpha:.3g}"/>']
    r = {".": 2.5, "o": 3.5}.get(marker)
    return [f'<circle cx="{a:.1f}" cy="{b:.1f}" r="{r}" fill="{color}" fill-opacity="{alpha:.3g}"/>'
            for a, b in points] if r else []


def _text(x: float, y: float, text: str, size: int = TICK_FONT, anchor: str = "start", extra: str = "") -> str:
    if not text:
        return ""
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}"{extra}>{text}</text>'


__all__ = ["COLORS", "Figure", "Panel"]
