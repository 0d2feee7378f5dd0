"""Charts for the Decks, as inline SVG (matplotlib, no display needed).

Every chart stays readable and small at any number of classes: at most `MAX_TICK_LABELS` category
labels per axis, no per-cell text past `CELL_TEXT_LIMIT` classes, and many bars drawn as one image.

Margins are fitted before the one draw that writes the SVG: the tick labels an axis will draw are
formatted without drawing and measured with the font's metrics, so no layout engine draws the
figure first (a constrained layout lays every text out twice before the final draw).
"""

from __future__ import annotations

import heapq
import io
import math

MAX_TICK_LABELS = 20  # more overlap on a chart a few inches wide
CELL_TEXT_LIMIT = 20  # classes; past this a count per cell is unreadable and costs a text element each
MARKER_LIMIT = 40  # points per line
RASTER_LIMIT = 100  # bars; past this one image is smaller than a vector shape per bar
PIXEL_LIMIT = 400  # heatmap pixels a side; past this many classes, a pixel stands for a block of cells
EDGE = 4.0  # points of blank canvas around the outermost texts
LINE = 1.25  # a text line's height, in font sizes
MIN_PLOT = 0.25  # of the figure's width and height, kept for the plot however long the labels


def new_axes(figsize: tuple[float, float]):
    """A figure outside pyplot on the SVG canvas: no global figure registry, no GUI backend, nothing
    to close. Imported here so that processes which never draw (DDP workers, registration) skip
    matplotlib."""
    from matplotlib.backends.backend_svg import FigureCanvasSVG
    from matplotlib.figure import Figure

    figure = Figure(figsize=figsize)
    FigureCanvasSVG(figure)
    return figure, figure.subplots()


def to_svg(figure) -> str:
    fit_margins(figure)
    buffer = io.StringIO()
    figure.savefig(buffer, format="svg", dpi=200)  # for raster parts only (many bars): sharp on dense screens
    text = buffer.getvalue()
    return text[text.index("<svg") :]  # drop the XML prolog so it embeds in HTML


def fit_margins(figure) -> None:
    """Margins that hold the first axes' title, axis labels and tick labels, and the tick labels right
    of a colour bar (the figure's second axes, if any)."""
    axes, *colorbar = figure.axes
    width, height = figure.get_size_inches() * 72  # points
    below, left, right = x_axis_extent(axes)
    left = max(left, y_axis_width(axes.yaxis, axes.get_ylabel()))
    if colorbar:
        right = max(right, y_axis_width(colorbar[0].yaxis, ""))
    left, right = within(left / width, right / width, EDGE / width)
    bottom, top = within(below / height, title_height(axes) / height, EDGE / height)
    figure.subplots_adjust(left=left, right=1 - right, bottom=bottom, top=1 - top)


def within(low: float, high: float, edge: float) -> tuple[float, float]:
    """Two opposite margins with the `edge` added, as fractions of the side, shrunk together so that
    at least `MIN_PLOT` of the side is left to the plot (past that, the longest labels are clipped)."""
    low, high = low + edge, high + edge
    scale = min(1.0, (1 - MIN_PLOT) / (low + high))
    return low * scale, high * scale


def x_axis_extent(axes) -> tuple[float, float, float]:
    """Points the x axis's tick labels and label take below the plot, and past its left and right
    edges (centred labels reach half their width past the first and last ticks; slanted ones reach
    left from their tick)."""
    from matplotlib import rcParams

    widths = [text_width(label, "xtick.labelsize") for label in shown_tick_labels(axes.xaxis)] or [0.0]
    line = line_height("xtick.labelsize")
    below = rcParams["xtick.major.size"] + rcParams["xtick.major.pad"]
    below += line_height("axes.labelsize") + rcParams["axes.labelpad"] if axes.get_xlabel() else 0.0
    if slanted(axes.xaxis):
        return below + (max(widths) + line) * math.sqrt(0.5), (widths[0] + line) * math.sqrt(0.5), 0.0
    return below + line, widths[0] / 2, widths[-1] / 2


def y_axis_width(axis, title: str) -> float:
    """Points a vertical axis's tick labels and label take beside the plot."""
    from matplotlib import rcParams

    widths = [text_width(label, "ytick.labelsize") for label in shown_tick_labels(axis)] or [0.0]
    label = line_height("axes.labelsize") + rcParams["axes.labelpad"] if title else 0.0
    return rcParams["ytick.major.size"] + rcParams["ytick.major.pad"] + max(widths) + label


def title_height(axes) -> float:
    """Points above the plot: the title, or the value axis's offset (like "1e6") where that is taller."""
    from matplotlib import rcParams

    offset = line_height("ytick.labelsize") if axes.yaxis.get_major_formatter().get_offset() else 0.0
    title = line_height("axes.titlesize") + rcParams["axes.titlepad"] if axes.get_title() else 0.0
    return max(offset, title)


def shown_tick_labels(axis) -> list[str]:
    """The tick labels `axis` will draw, formatted as drawing formats them, without drawing."""
    low, high = sorted(axis.get_view_interval())
    locations = axis.get_majorticklocs()
    labels = axis.get_major_formatter().format_ticks(locations)
    slack = (high - low) * 1e-9
    return [label for at, label in zip(locations, labels, strict=True) if low - slack <= at <= high + slack]


def slanted(axis) -> bool:
    return any(label.get_rotation() for label in axis.get_ticklabels())


def font(setting: str):
    """The font of an rcParams size setting ("xtick.labelsize": "medium", ...)."""
    from matplotlib import rcParams
    from matplotlib.font_manager import FontProperties

    return FontProperties(size=rcParams[setting])


def line_height(setting: str) -> float:
    return font(setting).get_size_in_points() * LINE


def text_width(text: str, setting: str) -> float:
    """The width in points of `text` in the font of `setting`, from the font's own metrics."""
    from matplotlib.textpath import text_to_path

    return text_to_path.get_text_width_height_descent(text, font(setting), ismath=False)[0]


def tick_positions(count: int) -> range:
    """Every k-th of `count` category positions, k chosen so that at most `MAX_TICK_LABELS` remain."""
    return range(0, count, max(1, math.ceil(count / MAX_TICK_LABELS)))


def set_category_ticks(axis, labels: list) -> None:
    """Label a categorical `axis` (axes.xaxis or axes.yaxis), thinned to every k-th category."""
    shown = tick_positions(len(labels))
    axis.set_ticks(list(shown), [str(labels[i]) for i in shown])
    if axis.axis_name == "x" and len(shown) > 6:
        for label in axis.get_ticklabels():
            label.set(rotation=45, ha="right", rotation_mode="anchor")


def set_labels(axes, title: str, xlabel: str, ylabel: str) -> None:
    # y=1.0 places the title at the top; left to find its place itself, matplotlib measures the tick
    # labels at every draw to clear ones drawn above the plot, which these charts never have.
    axes.set_title(title, y=1.0)
    axes.set(xlabel=xlabel, ylabel=ylabel)


def line_chart(
    series: dict[str, tuple[list[float], list[float]]], title: str, xlabel: str, ylabel: str
) -> str:
    """One line per name: (x values, y values). String x values are categories, in first-seen order."""
    figure, axes = new_axes((6, 3.2))
    categories = category_index(series)
    for name, (xs, ys) in series.items():
        positions = [categories[x] for x in xs] if categories else xs
        axes.plot(positions, ys, marker="o" if len(xs) < MARKER_LIMIT else None, label=name)
    if categories:
        set_category_ticks(axes.xaxis, list(categories))
    set_labels(axes, title, xlabel, ylabel)
    axes.grid(alpha=0.3)
    axes.legend()
    return to_svg(figure)


def category_index(series: dict[str, tuple[list, list]]) -> dict[str, int]:
    """Position of each string x value across all series; empty when the x values are numbers."""
    if not any(isinstance(x, str) for xs, _ in series.values() for x in xs[:1]):
        return {}
    return {x: i for i, x in enumerate(dict.fromkeys(x for xs, _ in series.values() for x in xs))}


def bar_chart(labels: list[str], values: list[float], title: str, ylabel: str) -> str:
    figure, axes = new_axes((6, 3.2))
    positions = list(range(len(labels)))  # numeric positions: labels like "0".."9" stay categories
    axes.bar(positions, values, color="#4c72b0", rasterized=len(labels) > RASTER_LIMIT)
    set_category_ticks(axes.xaxis, labels)
    set_labels(axes, title, "", ylabel)
    axes.grid(axis="y", alpha=0.3)
    return to_svg(figure)


def heatmap(matrix: list[list[int]], labels: list[str], title: str) -> str:
    """A confusion matrix: rows are true classes, columns predictions, counts in the cells up to
    `CELL_TEXT_LIMIT` classes (past that the colour alone shows them; see `top_confusions`)."""
    side = 4.5 + 0.15 * min(len(labels), CELL_TEXT_LIMIT)
    figure, axes = new_axes((side + 0.8, side))
    pixels, block = max_pooled(matrix, PIXEL_LIMIT)
    edge = len(pixels) * block - 0.5
    # "none": one sharp pixel per block, not resampled to the figure's resolution
    image = axes.imshow(pixels, cmap="Blues", vmin=0, interpolation="none", extent=(-0.5, edge, edge, -0.5))
    axes.set(xlim=(-0.5, len(labels) - 0.5), ylim=(len(labels) - 0.5, -0.5))
    set_category_ticks(axes.xaxis, labels)
    set_category_ticks(axes.yaxis, labels)
    set_labels(axes, title, "predicted", "true")
    if len(labels) <= CELL_TEXT_LIMIT:
        write_counts(axes, matrix, fontsize=9 if len(labels) <= 10 else 7)
    figure.colorbar(image, ax=axes)
    return to_svg(figure)


def max_pooled(matrix: list[list[int]], limit: int):
    """The largest count in each square block of cells, blocks as small as `limit` a side allows,
    so that a lone confusion among many classes stays visible. Returns (pooled array, block side)."""
    import numpy as np

    counts = np.asarray(matrix)
    block = max(1, math.ceil(len(counts) / limit))
    side = math.ceil(len(counts) / block)
    padded = np.zeros((side * block, side * block), counts.dtype)
    padded[: len(counts), : len(counts)] = counts
    return padded.reshape(side, block, side, block).max(axis=(1, 3)), block


def write_counts(axes, matrix: list[list[int]], fontsize: float) -> None:
    peak = max(max(row) for row in matrix) or 1
    for i, row in enumerate(matrix):
        for j, count in enumerate(row):
            colour = "white" if count > peak / 2 else "black"
            axes.text(j, i, str(count), ha="center", va="center", color=colour, fontsize=fontsize)


def top_confusions(matrix: list[list[int]], labels: list[str], k: int = 10) -> list[tuple[str, str, int]]:
    """The `k` largest off-diagonal cells of a confusion matrix, largest first, as
    (true label, predicted label, count); ties in row order; cells of zero left out."""
    cells = (
        (i, j, count) for i, row in enumerate(matrix) for j, count in enumerate(row) if i != j and count > 0
    )
    largest = heapq.nlargest(k, cells, key=lambda cell: cell[2])  # stable: ties keep row order
    return [(str(labels[i]), str(labels[j]), int(count)) for i, j, count in largest]


SCATTER_POINTS = 2_000  # a regression's charts draw at most this many test rows, as one image


def scatter_sample(xs, ys, limit: int = SCATTER_POINTS):
    """At most `limit` of the (x, y) pairs, evenly spaced: a chart of a million test rows stays small."""
    import numpy as np

    xs, ys = np.asarray(xs, dtype=float), np.asarray(ys, dtype=float)
    keep = np.linspace(0, len(xs) - 1, limit).astype(int) if len(xs) > limit else slice(None)
    return xs[keep], ys[keep]


def predicted_against_actual(actual, predicted, label: str) -> str:
    """A regression's test rows: the prediction against the true value, and the line where they agree."""
    figure, axes = new_axes((4.8, 4.2))
    xs, ys = scatter_sample(actual, predicted)
    axes.scatter(xs, ys, s=8, alpha=0.5, color="#4c72b0", rasterized=len(xs) > RASTER_LIMIT)
    if len(xs):
        low, high = float(min(xs.min(), ys.min())), float(max(xs.max(), ys.max()))
        axes.plot([low, high], [low, high], color="#c44e52", linewidth=1, label="predicted = actual")
        axes.legend()
    set_labels(axes, "predicted against actual", f"actual {label}", f"predicted {label}")
    axes.grid(alpha=0.3)
    return to_svg(figure)


def residuals(actual, predicted, label: str) -> str:
    """Each test row's error (predicted - actual) against its prediction: a pattern is what the model missed."""
    figure, axes = new_axes((6, 3.2))
    xs, ys = scatter_sample(predicted, [p - a for a, p in zip(actual, predicted, strict=True)])
    axes.scatter(xs, ys, s=8, alpha=0.5, color="#4c72b0", rasterized=len(xs) > RASTER_LIMIT)
    axes.axhline(0.0, color="#c44e52", linewidth=1)
    set_labels(axes, "residuals", f"predicted {label}", "predicted - actual")
    axes.grid(alpha=0.3)
    return to_svg(figure)
