"""The Deck charts stay small, fast and readable at any number of classes."""

from __future__ import annotations

import html
import re
import xml.etree.ElementTree as ElementTree

import numpy as np

from tasks.core import plots

LABELS_200 = [f"class_{i}" for i in range(200)]


def confusion_matrix(n_classes: int, seed: int = 0) -> list[list[int]]:
    """Mostly right, with a few confusions in every row: every cell is a nonzero count."""
    rng = np.random.default_rng(seed)
    matrix = rng.integers(1, 5, size=(n_classes, n_classes))
    matrix[np.arange(n_classes), np.arange(n_classes)] = rng.integers(50, 100, size=n_classes)
    return matrix.tolist()


def texts(svg: str) -> list[str]:
    """The strings of the SVG's text elements."""
    return [html.unescape(text) for text in re.findall(r"<text[^>]*>(.*?)</text>", svg)]


def ticks(svg: str, axis: str) -> list[str]:
    """The tick labels of the x or y axis."""
    return [
        html.unescape(text) for text in re.findall(rf'<text[^>]*class="{axis}tick"[^>]*>(.*?)</text>', svg)
    ]


def markers(svg: str) -> list[tuple[float, float]]:
    return [(float(x), float(y)) for x, y in re.findall(r'<circle cx="([\d.]+)" cy="([\d.]+)"', svg)]


def test_a_200_class_heatmap_is_small_and_writes_no_count_per_cell():
    """What made it slow (58 s for one chart): a text per cell."""
    svg = plots.heatmap(confusion_matrix(200), LABELS_200, "confusion matrix")

    ElementTree.fromstring(svg)  # well-formed
    assert len(svg.encode()) < 300_000, f"{len(svg.encode()) / 1e3:.0f} KB"
    assert len(texts(svg)) < 80, "a text element per cell (or per tick) is back"
    assert 20 <= sum(text.startswith("class_") for text in texts(svg)) <= 40  # at most 20 per axis
    assert svg.count("<image") == 2  # the matrix and the colour scale, one raster each


def test_a_5_class_heatmap_shows_its_counts_and_every_label():
    matrix = [[90 + i if i == j else 0 for j in range(5)] for i in range(5)]
    matrix[3][1] = 1234
    svg = plots.heatmap(matrix, [f"class_{i}" for i in range(5)], "five classes")

    shown = texts(svg)
    assert {"1234", "90", "94", "0"} <= set(shown)
    assert shown.count("0") >= 19  # the zero cells (the colour scale's "0" tick may add one)
    assert {f"class_{i}" for i in range(5)} <= set(shown)
    assert "five classes" in shown


def test_the_heatmap_image_is_a_valid_png_of_the_blues_scale():
    pixels = plots.blues(np.array([[0.0, 1.0]]))
    assert pixels.tolist() == [[list(plots.BLUES[0]), list(plots.BLUES[-1])]]
    png = plots.png(np.zeros((3, 2, 3), np.uint8))
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and png.endswith(b"IEND\xaeB`\x82")


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
    assert 10 <= len(ticks(svg, "x")) <= 20
    assert "class_10" in ticks(svg, "x") and "class_1" not in ticks(svg, "x")  # every 10th label


def test_thousands_of_bars_are_one_path_not_a_shape_each():
    labels = [str(i) for i in range(1000)]
    svg = plots.bar_chart(labels, [float(i % 37) for i in range(1000)], "rows per class", "rows")

    assert svg.count('class="bars"') == 1 and svg.count("<path") < 10
    assert svg.count("<rect") == 1  # the background
    assert len(svg.encode()) < 100_000, f"{len(svg.encode()) / 1e3:.0f} KB"


def test_a_200_label_line_chart_is_small_shows_at_most_20_labels_and_no_markers():
    series = {name: (LABELS_200, [i / 200 for i in range(200)]) for name in ("precision", "recall", "F1")}
    svg = plots.line_chart(series, "per-class metrics", "class", "score")

    ElementTree.fromstring(svg)
    assert len(svg.encode()) < 100_000, f"{len(svg.encode()) / 1e3:.0f} KB"
    assert 10 <= len(ticks(svg, "x")) <= 20
    assert "class_190" in ticks(svg, "x") and "class_199" not in ticks(svg, "x")
    assert not markers(svg)  # no marker per point
    assert {"precision", "recall", "F1"} <= set(texts(svg))  # the legend


def test_a_few_points_keep_their_markers_and_numeric_x_stays_numeric():
    svg = plots.line_chart({"train": ([1, 2, 10], [0.9, 0.5, 0.2])}, "loss", "epoch", "cross-entropy")

    (x1, _), (x2, _), (x10, _) = markers(svg)
    assert abs((x10 - x2) - 8 * (x2 - x1)) < 1  # placed by value, not as three categories
    assert all(label.isdigit() for label in ticks(svg, "x"))  # whole x values (epochs) get whole ticks


def test_value_ticks_are_round_and_cover_the_range():
    axis, shown = plots.value_axis(0, 100_000)
    assert axis.labels == ["0", "20,000", "40,000", "60,000", "80,000", "100,000"] and shown == (0, 100_000)
    assert plots.value_axis(0.2, 0.9)[0].labels == ["0.2", "0.4", "0.6", "0.8"]
    assert plots.value_axis(0, 1.1)[0].labels == ["0.00", "0.25", "0.50", "0.75", "1.00"]
    assert plots.value_axis(5.0, 5.0)[0].labels  # a flat line still gets ticks around it
    assert plots.value_axis(float("nan"), float("inf"))[0].labels


def test_long_labels_are_shortened_and_empty_or_missing_values_still_draw():
    svg = plots.bar_chart([f"a rather long class name {i}" for i in range(30)], list(range(30)), "t", "rows")
    assert "a rather long class nam…" in ticks(svg, "x")
    ElementTree.fromstring(plots.line_chart({"val": ([1, 2], [float("nan"), 0.5])}, "t", "x", "y"))
    ElementTree.fromstring(plots.bar_chart(["a", "b"], [0.0, float("nan")], "t", "y"))
