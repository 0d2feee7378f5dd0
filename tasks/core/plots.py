"""Charts for the Decks, as inline SVG (matplotlib, no display needed)."""

from __future__ import annotations

import io


def new_axes(figsize: tuple[float, float]):
    """A figure outside pyplot: no global figure registry, no GUI backend, nothing to close.
    Imported here so that processes which never draw (DDP workers, registration) skip matplotlib."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=figsize)
    return figure, figure.subplots()


def to_svg(figure) -> str:
    buffer = io.StringIO()
    figure.savefig(buffer, format="svg", bbox_inches="tight")
    text = buffer.getvalue()
    return text[text.index("<svg") :]  # drop the XML prolog so it embeds in HTML


def line_chart(
    series: dict[str, tuple[list[float], list[float]]], title: str, xlabel: str, ylabel: str
) -> str:
    """One line per name: (x values, y values)."""
    figure, axes = new_axes((6, 3.2))
    for name, (xs, ys) in series.items():
        axes.plot(xs, ys, marker="o" if len(xs) < 40 else None, label=name)
    axes.set(title=title, xlabel=xlabel, ylabel=ylabel)
    axes.grid(alpha=0.3)
    axes.legend()
    return to_svg(figure)


def bar_chart(labels: list[str], values: list[float], title: str, ylabel: str) -> str:
    figure, axes = new_axes((6, 3.2))
    positions = list(range(len(labels)))  # numeric positions: labels like "0".."9" stay categories
    axes.bar(positions, values, color="#4c72b0")
    axes.set_xticks(positions, [str(label) for label in labels])
    axes.set(title=title, ylabel=ylabel)
    axes.tick_params(axis="x", rotation=45 if len(labels) > 6 else 0)
    axes.grid(axis="y", alpha=0.3)
    return to_svg(figure)


def heatmap(matrix: list[list[int]], labels: list[str], title: str) -> str:
    """A confusion matrix: rows are true classes, columns predictions, counts in the cells."""
    figure, axes = new_axes((5, 4.5))
    image = axes.imshow(matrix, cmap="Blues")
    ticks = range(len(labels))
    axes.set(xticks=list(ticks), yticks=list(ticks), xticklabels=labels, yticklabels=labels)
    axes.set(title=title, xlabel="predicted", ylabel="true")
    peak = max(max(row) for row in matrix) or 1
    for i, row in enumerate(matrix):
        for j, count in enumerate(row):
            axes.text(
                j, i, str(count), ha="center", va="center", color="white" if count > peak / 2 else "black"
            )
    figure.colorbar(image, ax=axes)
    return to_svg(figure)
