"""The Deck charts stay small, fast and readable at any number of classes."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ElementTree

import numpy as np
import pytest

from tasks.core.evaluation import plots

LABELS_200 = [f"class_{i}" for i in range(200)]


def confusion_matrix(n_classes: int, seed: int = 0) -> list[list[int]]:
    """Mostly right, with a few confusions in every row: every cell is a nonzero count."""
    rng = np.random.default_rng(seed)
    matrix = rng.integers(1, 5, size=(n_classes, n_classes))
    matrix[np.arange(n_classes), np.arange(n_classes)] = rng.integers(50, 100, size=n_classes)
    return matrix.tolist()


def texts(svg: str) -> list[str]:
    """The strings of the SVG's text elements (drawn as glyph paths, each preceded by its text as a comment)."""
    return re.findall(r'<g id="text_\d+">\s*<!-- (.*?) -->', svg)


def ticks(svg: str, axis: str) -> int:
    return len(re.findall(rf'<g id="{axis}tick_\d+">', svg))


def test_a_200_class_heatmap_is_small_and_writes_no_count_per_cell():
    """What made it slow (58 s for one chart): a text per cell."""
    svg = plots.heatmap(confusion_matrix(200), LABELS_200, "confusion matrix")

    ElementTree.fromstring(svg)  # well-formed
    assert len(svg.encode()) < 300_000, f"{len(svg.encode()) / 1e3:.0f} KB"
    assert len(texts(svg)) < 80, "a text element per cell (or per tick) is back"
    assert 20 <= sum(text.startswith("class_") for text in texts(svg)) <= 40  # at most 20 per axis
    assert svg.count("<image") == 2  # the matrix and the colour bar, one raster each


def test_a_5_class_heatmap_shows_its_counts_and_every_label():
    matrix = [[90 + i if i == j else 0 for j in range(5)] for i in range(5)]
    matrix[3][1] = 1234
    svg = plots.heatmap(matrix, [f"class_{i}" for i in range(5)], "five classes")

    shown = texts(svg)
    assert {"1234", "90", "94", "0"} <= set(shown)
    assert shown.count("0") >= 19  # the zero cells (the colour bar's "0" tick may add one)
    assert {f"class_{i}" for i in range(5)} <= set(shown)
    assert "five classes" in shown


def test_heatmap_pools_thousands_of_classes_into_a_bounded_image_keeping_a_lone_confusion():
    matrix = np.zeros((1000, 1000), dtype=int)
    matrix[700, 3] = 9
    pooled, block = plots.max_pooled(matrix.tolist(), limit=400)
    assert pooled.shape == (334, 334) and block == 3
    assert pooled[700 // 3, 3 // 3] == 9 and pooled.sum() == 9

    svg = plots.heatmap(confusion_matrix(1000), [str(i) for i in range(1000)], "many")
    assert len(svg.encode()) < 300_000, f"{len(svg.encode()) / 1e3:.0f} KB"


def test_top_confusions_are_the_largest_off_diagonal_cells_in_order():
    matrix = [
        [99, 3, 0, 7],
        [5, 80, 7, 0],
        [0, 0, 70, 1],
        [2, 0, 9, 60],
    ]
    labels = ["a", "b", "c", "d"]

    assert plots.top_confusions(matrix, labels, k=4) == [
        ("d", "c", 9),
        ("a", "d", 7),  # ties keep row order
        ("b", "c", 7),
        ("b", "a", 5),
    ]
    assert [true for true, predicted, _ in plots.top_confusions(matrix, labels, k=100)].count("c") == 1
    assert all(true != predicted for true, predicted, _ in plots.top_confusions(matrix, labels, k=100))
    assert len(plots.top_confusions(matrix, labels, k=100)) == 7  # the zero cells are left out
    assert plots.top_confusions([[5, 0], [0, 6]], ["x", "y"]) == []


def test_a_200_label_bar_chart_is_small_and_shows_at_most_20_labels():
    svg = plots.bar_chart(LABELS_200, [float(i % 37) for i in range(200)], "rows per class", "rows")

    ElementTree.fromstring(svg)
    assert len(svg.encode()) < 100_000, f"{len(svg.encode()) / 1e3:.0f} KB"
    assert 10 <= ticks(svg, "x") <= 20
    assert "class_10" in texts(svg) and "class_1" not in texts(svg)  # every 10th label


@pytest.mark.slow  # draws a thousand bars: seconds
def test_thousands_of_bars_are_one_image_not_a_shape_each():
    labels = [str(i) for i in range(1000)]
    svg = plots.bar_chart(labels, [float(i % 37) for i in range(1000)], "rows per class", "rows")

    assert svg.count("<image") == 1
    assert len(svg.encode()) < 100_000, f"{len(svg.encode()) / 1e3:.0f} KB"


def test_a_200_label_line_chart_is_small_shows_at_most_20_labels_and_no_markers():
    series = {name: (LABELS_200, [i / 200 for i in range(200)]) for name in ("precision", "recall", "F1")}
    svg = plots.line_chart(series, "per-class metrics", "class", "score")

    ElementTree.fromstring(svg)
    assert len(svg.encode()) < 100_000, f"{len(svg.encode()) / 1e3:.0f} KB"
    assert 10 <= ticks(svg, "x") <= 20
    assert "class_190" in texts(svg) and "class_199" not in texts(svg)
    assert svg.count('xlink:href="#m') < 60  # tick marks only: no marker per point


def test_a_few_points_keep_their_markers_and_numeric_x_stays_numeric():
    svg = plots.line_chart({"train": ([1, 2, 3], [0.9, 0.5, 0.2])}, "loss", "epoch", "cross-entropy")

    assert svg.count('xlink:href="#m') >= 3 + ticks(svg, "x") + ticks(svg, "y")
    assert "1.50" in texts(svg)  # ticks between the points: a numeric axis, not three categories


def test_charts_fit_their_titles_and_rotated_labels_without_a_second_pass():
    figure, axes = plots.new_axes((6, 3.2))
    axes.bar(range(200), range(200))
    plots.set_category_ticks(axes.xaxis, [f"a rather long class name {i}" for i in range(200)])
    plots.set_labels(axes, "a title", "", "rows")

    svg = plots.to_svg(figure)

    assert svg.startswith("<svg") and "a title" in texts(svg)
    ElementTree.fromstring(svg)
    assert figure.get_layout_engine() is None, "a layout engine lays the figure out again at every draw"
    assert not texts_outside_the_canvas(figure)


def drawn_texts(figure) -> list:
    """Every text the figure's axes (a colour bar's included) drew: titles, axis labels, offsets, and
    the labels of the ticks in view."""
    found = []
    for axes in figure.axes:
        found += [
            axes.title,
            axes.xaxis.label,
            axes.yaxis.label,
            axes.xaxis.offsetText,
            axes.yaxis.offsetText,
        ]
        for axis in (axes.xaxis, axes.yaxis):
            low, high = sorted(axis.get_view_interval())
            found += [tick.label1 for tick in axis.get_major_ticks() if low <= tick.get_loc() <= high]
    return [text for text in found if text.get_visible() and text.get_text()]


def texts_outside_the_canvas(figure) -> list[str]:
    canvas = figure.bbox.padded(1)
    return [
        text.get_text()
        for text in drawn_texts(figure)
        if not all(canvas.contains(x, y) for x, y in text.get_window_extent().corners())
    ]


def test_every_chart_draws_each_text_inside_its_canvas(monkeypatch):
    """The margins are computed from the labels before the one draw: long, many, large, negative or
    slanted labels and a colour bar's all still fit."""
    figures = []
    draw = plots.to_svg
    monkeypatch.setattr(plots, "to_svg", lambda figure: figures.append(figure) or draw(figure))
    long = [f"a rather long class name {i}" for i in range(30)]
    plots.bar_chart(long, list(range(30)), "rows per class", "rows")
    plots.bar_chart(["0", "1", "2"], [100_000.0, 2_500_000.0, 7.0], "rows per class", "rows")
    plots.heatmap([[i * j for j in range(30)] for i in range(30)], long, "confusion matrix")
    plots.heatmap([[1_000_000 * (i == j) for j in range(10)] for i in range(10)], list("abcdefghij"), "ten")
    plots.line_chart({"precision": (long, [0.5] * 30), "a long series name": (long, [-1234.5] * 30)},
                     "per-class metrics", "class", "score")  # fmt: skip
    plots.line_chart({"train": ([1, 2, 3], [0.9, 0.5, 0.2])}, "loss", "epoch", "cross-entropy")
    plots.line_chart({"CPU %": (list(range(100)), [float(i % 7) * 1e-7 for i in range(100)])}, "u", "s", "%")

    assert len(figures) == 7
    for figure in figures:
        assert drawn_texts(figure), "nothing checked"
        assert not texts_outside_the_canvas(figure), figure.axes[0].get_title()
