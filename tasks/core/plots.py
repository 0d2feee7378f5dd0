"""Charts for the Decks, written directly as inline SVG.

Bars, lines and a heatmap are all the Decks draw, so they are written here with a little arithmetic:
no plotting library to import and no layout pass (a library's import and layout were most of what a
Deck cost). Margins come from the longest label at a generous width per character.

Every chart stays readable and small at any number of classes: at most `MAX_TICK_LABELS` category
labels per axis, no per-cell text past `CELL_TEXT_LIMIT` classes, all bars one path, and the
confusion matrix one image, pooled to at most `PIXEL_LIMIT` pixels a side.
"""

from __future__ import annotations

import base64
import heapq
import html
import math
import struct
import zlib
from dataclasses import dataclass

MAX_TICK_LABELS = 20  # more overlap on a chart a few inches wide
CELL_TEXT_LIMIT = 20  # classes; past this a count per cell is unreadable and costs a text element each
MARKER_LIMIT = 40  # points per line
PIXEL_LIMIT = 400  # heatmap pixels a side; past this many classes, a pixel stands for a block of cells
LABEL_CHARS = 24  # longer category labels end in an ellipsis; the tables beside the charts give them whole

WIDTH, HEIGHT = 600, 320  # px of a line or bar chart; narrower pages shrink it
FONT, TITLE_FONT = 12, 14  # px
CHAR_WIDTH = 0.62  # of the font size: a sans-serif character's width or more, so labels fit their margin
PAD, GAP, TICK, SCALE_WIDTH = 6, 4, 4, 14  # px: canvas edge, label spacing, tick mark, colour scale
COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f")
BAR_COLOUR, INK, GRID = "#4c72b0", "#333", "#e4e4e4"
BLUES = ((247, 251, 255), (222, 235, 247), (198, 219, 239), (158, 202, 225), (107, 174, 214),
         (66, 146, 198), (33, 113, 181), (8, 81, 156), (8, 48, 107))  # fmt: skip  # ColorBrewer Blues


@dataclass
class Frame:
    """The plot area in canvas pixels, and the data ranges it shows."""

    left: float
    top: float
    right: float
    bottom: float
    x_range: tuple[float, float]
    y_range: tuple[float, float]

    def x(self, value: float) -> float:
        low, high = self.x_range
        return self.left + (value - low) / (high - low) * (self.right - self.left)

    def y(self, value: float) -> float:
        low, high = self.y_range
        return self.bottom - (value - low) / (high - low) * (self.bottom - self.top)


@dataclass
class Axis:
    """Tick positions (in data units) and their labels."""

    ticks: list[float]
    labels: list[str]
    title: str = ""

    @property
    def rotated(self) -> bool:
        """Whether the labels are slanted: they would not fit side by side under a chart."""
        return len(self.labels) * (text_width(self.longest) + FONT) > 400

    @property
    def longest(self) -> str:
        return max(self.labels, key=len, default="")

    def depth(self) -> float:
        """Pixels below a horizontal axis that its tick labels and title take."""
        labels = (text_width(self.longest) + FONT) * math.sqrt(0.5) if self.rotated else FONT
        return TICK + GAP + labels + (GAP + FONT if self.title else 0)

    def width(self) -> float:
        """Pixels left of a vertical axis that its tick labels and title take."""
        return TICK + GAP + text_width(self.longest) + (GAP + FONT if self.title else 0)


def text_width(label: str, size: float = FONT) -> float:
    return len(label) * size * CHAR_WIDTH


def category_axis(labels: list, title: str = "") -> tuple[Axis, tuple[float, float]]:
    """Every k-th of the categories at positions 0, 1, ..., at most `MAX_TICK_LABELS` of them; and
    the range to show, half a category beyond the first and the last."""
    shown = tick_positions(len(labels))
    return Axis(list(shown), [shorten(str(labels[i])) for i in shown], title), (
        -0.5,
        max(1, len(labels)) - 0.5,
    )


def shorten(label: str) -> str:
    return label if len(label) <= LABEL_CHARS else label[: LABEL_CHARS - 1] + "…"


def tick_positions(count: int) -> range:
    """Every k-th of `count` category positions, k chosen so that at most `MAX_TICK_LABELS` remain."""
    return range(0, count, max(1, math.ceil(count / MAX_TICK_LABELS)))


def value_axis(
    low: float, high: float, title: str = "", whole: bool = False
) -> tuple[Axis, tuple[float, float]]:
    """About five round ticks over [low, high] (whole numbers only when `whole`), and the range to show."""
    if not (math.isfinite(low) and math.isfinite(high)):
        low, high = 0.0, 1.0
    if high - low < 1e-12 * max(1.0, abs(high)):
        low, high = low - 0.5 * max(1.0, abs(low)), high + 0.5 * max(1.0, abs(high))
    step = nice_step((high - low) / 5, whole)
    ticks = [i * step for i in range(math.ceil(low / step - 1e-9), math.floor(high / step + 1e-9) + 1)]
    return Axis(ticks, [f"{t:,.{decimals(step)}f}" for t in ticks], title), (low, high)


def decimals(step: float) -> int:
    """Digits after the point that show every multiple of `step` exactly (0.25: 2, 500: 0)."""
    digits = max(0, -math.floor(math.log10(step) + 1e-9))
    while abs(round(step, digits) - step) > 1e-9 * step:
        digits += 1
    return digits


def nice_step(raw: float, whole: bool) -> float:
    """The smallest of 1, 2, 2.5 or 5 times a power of ten that is at least `raw`."""
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw * (1 - 1e-9))
    return max(1.0, round(step)) if whole else step


def padded(values: list[float], share: float = 0.05) -> tuple[float, float]:
    finite = [v for v in values if math.isfinite(v)] or [0.0]
    low, high = min(finite), max(finite)
    margin = (high - low) * share
    return low - margin, high + margin


# --- SVG pieces ---


def svg(width: float, height: float, parts: list[str]) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" xmlns:xlink="http://www.w3.org/1999/xlink" '
        f'viewBox="0 0 {width:.0f} {height:.0f}" width="{width:.0f}" height="{height:.0f}" '
        f'style="max-width:100%;height:auto" font-family="DejaVu Sans, Verdana, sans-serif" '
        f'font-size="{FONT}" fill="{INK}"><rect width="100%" height="100%" fill="white"/>{"".join(parts)}</svg>'
    )


def text(x: float, y: float, label: str, anchor: str = "middle", size: float = FONT, rotate: float = 0,
         css_class: str = "", colour: str = "") -> str:  # fmt: skip
    turn = f' transform="rotate({rotate:g} {x:.1f} {y:.1f})"' if rotate else ""
    extra = (f' class="{css_class}"' if css_class else "") + (f' fill="{colour}"' if colour else "")
    return (f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}" font-size="{size:g}"{turn}{extra}>'
            f"{html.escape(label)}</text>")  # fmt: skip


def path(
    commands: list[str], stroke: str = "none", fill: str = "none", width: float = 1, css_class: str = ""
) -> str:
    extra = f' class="{css_class}"' if css_class else ""
    return f'<path d="{" ".join(commands)}" stroke="{stroke}" fill="{fill}" stroke-width="{width:g}"{extra}/>'


def axes_parts(
    frame: Frame, x_axis: Axis, y_axis: Axis, title: str, x_grid: bool
) -> tuple[list[str], list[str]]:
    """What goes under the data (grid lines) and over it (border, ticks, labels, titles)."""
    f = frame
    grid = [f"M{f.left:.1f} {f.y(t):.1f}H{f.right:.1f}" for t in y_axis.ticks]
    grid += [f"M{f.x(t):.1f} {f.top:.1f}V{f.bottom:.1f}" for t in x_axis.ticks] if x_grid else []
    marks = [f"M{f.x(t):.1f} {f.bottom:.1f}v{TICK}" for t in x_axis.ticks]
    marks += [f"M{f.left:.1f} {f.y(t):.1f}h{-TICK}" for t in y_axis.ticks]
    over = [
        path([f"M{f.left:.1f} {f.top:.1f}H{f.right:.1f}V{f.bottom:.1f}H{f.left:.1f}Z"], INK),
        path(marks, INK),
    ]
    below = f.bottom + TICK + GAP
    for tick, label in zip(x_axis.ticks, x_axis.labels, strict=True):
        if x_axis.rotated:
            over.append(text(f.x(tick), below + FONT * 0.7, label, "end", rotate=-45, css_class="xtick"))
        else:
            over.append(text(f.x(tick), below + FONT * 0.8, label, css_class="xtick"))
    for tick, label in zip(y_axis.ticks, y_axis.labels, strict=True):
        over.append(text(f.left - TICK - GAP, f.y(tick) + FONT * 0.35, label, "end", css_class="ytick"))
    if x_axis.title:
        over.append(text((f.left + f.right) / 2, f.bottom + x_axis.depth(), x_axis.title))
    if y_axis.title:
        over.append(
            text(f.left - y_axis.width() + FONT * 0.8, (f.top + f.bottom) / 2, y_axis.title, rotate=-90)
        )
    if title:
        over.append(text((f.left + f.right) / 2, PAD + TITLE_FONT * 0.8, title, size=TITLE_FONT))
    return [path(grid, GRID)] if grid else [], over


def plot_area(
    width: float, height: float, x_axis: Axis, y_axis: Axis, title: str, right: float = PAD
) -> tuple:
    """(left, top, right, bottom) of the plot, leaving room for the axes' labels and the title."""
    top = PAD + (TITLE_FONT + 2 * GAP if title else GAP)
    left = PAD + y_axis.width()
    if x_axis.rotated and x_axis.labels:  # the first slanted label reaches left of its tick
        left = max(left, PAD + text_width(x_axis.labels[0]) * math.sqrt(0.5))
    if x_axis.labels and not x_axis.rotated:  # the last label is centred on its tick
        right = max(right, PAD + text_width(x_axis.labels[-1]) / 2)
    return left, top, width - right, height - PAD - x_axis.depth()


def legend(names: list[str], left: float, top: float) -> list[str]:
    parts = []
    for i, name in enumerate(names):
        y = top + i * (FONT + GAP) + FONT / 2
        parts.append(path([f"M{left:.1f} {y:.1f}h16"], COLOURS[i % len(COLOURS)], width=2))
        parts.append(text(left + 20, y + FONT * 0.35, name, "start"))
    return parts


# --- The charts ---


def line_chart(
    series: dict[str, tuple[list[float], list[float]]], title: str, xlabel: str, ylabel: str
) -> str:
    """One line per name: (x values, y values). String x values are categories, in first-seen order."""
    categories = category_index(series)
    points = {name: ([categories[x] for x in xs] if categories else list(xs), list(ys))
              for name, (xs, ys) in series.items()}  # fmt: skip
    all_x = [x for xs, _ in points.values() for x in xs]
    if categories:
        x_axis, x_range = category_axis(list(categories), xlabel)
    else:
        whole = all(float(x).is_integer() for x in all_x)  # epochs: no tick between two of them
        x_axis, x_range = value_axis(*padded(all_x, 0.03), xlabel, whole=whole)
    y_axis, y_range = value_axis(*padded([y for _, ys in points.values() for y in ys]), ylabel)
    legend_width = max(text_width(name) for name in series) + 20 + 2 * GAP
    frame = Frame(*plot_area(WIDTH, HEIGHT, x_axis, y_axis, title, PAD + legend_width), x_range, y_range)
    under, over = axes_parts(frame, x_axis, y_axis, title, x_grid=True)
    parts = [*under]
    for i, (xs, ys) in enumerate(points.values()):
        colour = COLOURS[i % len(COLOURS)]
        drawn = [(frame.x(x), frame.y(y)) for x, y in zip(xs, ys, strict=True) if math.isfinite(y)]
        parts.append(path([f"{'M' if j == 0 else 'L'}{x:.1f} {y:.1f}" for j, (x, y) in enumerate(drawn)], colour,
                          width=1.8, css_class="line"))  # fmt: skip
        if len(xs) < MARKER_LIMIT:
            parts += [f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="{colour}"/>' for x, y in drawn]
    return svg(WIDTH, HEIGHT, parts + over + legend(list(series), frame.right + 2 * GAP, frame.top))


def category_index(series: dict[str, tuple[list, list]]) -> dict[str, int]:
    """Position of each string x value across all series; empty when the x values are numbers."""
    if not any(isinstance(x, str) for xs, _ in series.values() for x in xs[:1]):
        return {}
    return {x: i for i, x in enumerate(dict.fromkeys(x for xs, _ in series.values() for x in xs))}


def bar_chart(labels: list[str], values: list[float], title: str, ylabel: str) -> str:
    """One bar per label, all bars one path, whatever their number."""
    finite = [v for v in values if math.isfinite(v)]
    low, high = min([0.0, *finite]), max([0.0, *finite])  # bars stand on zero: pad only away from it
    margin = (high - low) * 0.05
    y_axis, y_range = value_axis(
        low - margin if low < 0 else low, high + margin if high > 0 else high, ylabel
    )
    x_axis, x_range = category_axis(labels)
    frame = Frame(*plot_area(WIDTH, HEIGHT, x_axis, y_axis, title), x_range, y_range)
    under, over = axes_parts(frame, x_axis, y_axis, title, x_grid=False)
    half = 0.4 * (frame.right - frame.left) / max(1, len(labels))
    bars = [f"M{frame.x(i) - half:.1f} {frame.y(0):.1f}V{frame.y(v):.1f}h{2 * half:.1f}V{frame.y(0):.1f}Z"
            for i, v in enumerate(values) if math.isfinite(v)]  # fmt: skip
    return svg(WIDTH, HEIGHT, [*under, path(bars, fill=BAR_COLOUR, css_class="bars"), *over])


def heatmap(matrix: list[list[int]], labels: list[str], title: str) -> str:
    """A confusion matrix: rows are true classes, columns predictions, counts in the cells up to
    `CELL_TEXT_LIMIT` classes (past that the colour alone shows them; see `top_confusions`)."""
    n = len(labels)
    side = 300 + 15 * min(n, CELL_TEXT_LIMIT)  # px of the matrix
    x_axis, x_range = category_axis(labels, "predicted")
    y_axis, (low, high) = category_axis(labels, "true")
    left, top = PAD + y_axis.width(), PAD + TITLE_FONT + 2 * GAP
    frame = Frame(left, top, left + side, top + side, x_range, (high, low))  # the first class on top
    pixels, _ = max_pooled(matrix, PIXEL_LIMIT)
    peak = int(pixels.max()) or 1
    _, over = axes_parts(frame, x_axis, y_axis, title, x_grid=False)  # no grid over the cells
    parts = [image(blues(pixels / peak), frame.left, frame.top, side, side), *over]
    if n <= CELL_TEXT_LIMIT:
        parts += cell_counts(matrix, frame, peak, size=10 if n <= 10 else 8)
    scale_parts, scale_width = colour_scale(peak, frame.right + 4 * GAP, frame.top, side)
    width = frame.right + 4 * GAP + scale_width + PAD
    return svg(width, frame.bottom + PAD + x_axis.depth(), parts + scale_parts)


def cell_counts(matrix: list[list[int]], frame: Frame, peak: int, size: float) -> list[str]:
    return [text(frame.x(j), frame.y(i) + size * 0.35, str(count), size=size,
                 colour="white" if count > peak / 2 else INK)
            for i, row in enumerate(matrix) for j, count in enumerate(row)]  # fmt: skip


def colour_scale(peak: int, left: float, top: float, height: float) -> tuple[list[str], float]:
    """A vertical colour bar from 0 to `peak` with its ticks; and the width it takes."""
    import numpy as np

    axis, _ = value_axis(0, peak, whole=True)
    y = lambda value: top + height - value / peak * height  # noqa: E731
    right = left + SCALE_WIDTH
    parts = [image(blues(np.linspace(1, 0, 64)[:, None]), left, top, SCALE_WIDTH, height),
             path([f"M{left:.1f} {top:.1f}H{right:.1f}v{height:.1f}H{left:.1f}Z"], INK),
             path([f"M{right:.1f} {y(t):.1f}h{TICK}" for t in axis.ticks], INK)]  # fmt: skip
    parts += [text(right + TICK + GAP, y(t) + FONT * 0.35, label, "start")
              for t, label in zip(axis.ticks, axis.labels, strict=True)]  # fmt: skip
    return parts, SCALE_WIDTH + TICK + GAP + text_width(axis.longest)


def blues(shares):
    """RGB bytes of values in [0, 1] on the Blues scale, shape (rows, columns, 3)."""
    import numpy as np

    anchors = np.linspace(0, 1, len(BLUES))
    channels = [np.interp(shares, anchors, [colour[c] for colour in BLUES]) for c in range(3)]
    return np.stack(channels, axis=-1).round().astype(np.uint8)


def image(rgb, x: float, y: float, width: float, height: float) -> str:
    """An RGB array as an embedded PNG, each pixel a sharp block (no smoothing between cells)."""
    data = base64.b64encode(png(rgb)).decode()
    return (f'<image x="{x:.1f}" y="{y:.1f}" width="{width:.1f}" height="{height:.1f}" preserveAspectRatio="none" '
            f'style="image-rendering:pixelated" xlink:href="data:image/png;base64,{data}"/>')  # fmt: skip


def png(rgb) -> bytes:
    """The smallest valid PNG of an RGB array (8 bits per channel, no filtering)."""
    height, width, _ = rgb.shape
    rows = b"".join(b"\x00" + row.tobytes() for row in rgb)

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


def max_pooled(matrix: list[list[int]], limit: int):
    """The largest count in each square block of cells, blocks as small as `limit` a side allows,
    so that a lone confusion among many classes stays visible. Returns (pooled array, block side)."""
    import numpy as np

    counts = np.asarray(matrix)
    block = max(1, math.ceil(len(counts) / limit))
    side = math.ceil(len(counts) / block)
    padded_counts = np.zeros((side * block, side * block), counts.dtype)
    padded_counts[: len(counts), : len(counts)] = counts
    return padded_counts.reshape(side, block, side, block).max(axis=(1, 3)), block


def top_confusions(matrix: list[list[int]], labels: list[str], k: int = 10) -> list[tuple[str, str, int]]:
    """The `k` largest off-diagonal cells of a confusion matrix, largest first, as
    (true label, predicted label, count); ties in row order; cells of zero left out."""
    cells = (
        (i, j, count) for i, row in enumerate(matrix) for j, count in enumerate(row) if i != j and count > 0
    )
    largest = heapq.nlargest(k, cells, key=lambda cell: cell[2])  # stable: ties keep row order
    return [(str(labels[i]), str(labels[j]), int(count)) for i, j, count in largest]
