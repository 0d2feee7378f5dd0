"""Evaluation streams the test split through the bundle one row group at a time: the metrics equal
those of the whole split scored at once, and memory does not grow with the split. A raw split of text,
booleans, dates and missing values gives the metrics that scoring the same rows later gives."""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from tasks.core.bundle.loading import Bundle, load_bundle
from tasks.core.evaluation.metrics import classification_metrics
from tasks.core.evaluation.split_metrics import split_metrics
from tasks.core.scoring.run import score_dataset
from tests.conftest import blobs_frame
from tests.unit.publish.test_publish import (
    CLASSES,
    FEATURES,
    messy_table,
    write_messy_bundle,
    write_test_bundle,
)

GROUP_ROWS = 7


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> Bundle:
    return load_bundle(write_test_bundle(tmp_path_factory.mktemp("evaluation") / "bundle", seed=3))


def raw_split(rows: int, seed: int = 5) -> pa.Table:
    """A test split as preprocessing writes it: the raw feature values and the class codes."""
    frame = blobs_frame(n_rows=rows, n_classes=3, seed=seed)
    frame["species"] = frame["species"].map(CLASSES.index)
    return pa.Table.from_pandas(frame[[*FEATURES, "species"]], preserve_index=False)


def count_batches(bundle: Bundle, monkeypatch) -> list[int]:
    """The rows of each batch the bundle scores from now on."""
    sizes: list[int] = []
    score = bundle.predict_proba

    def counted(table, *args):
        sizes.append(table.num_rows)
        return score(table, *args)

    monkeypatch.setattr(bundle, "predict_proba", counted)
    return sizes


@pytest.mark.slow
def test_the_streamed_metrics_equal_the_metrics_of_the_whole_split(bundle, tmp_path, monkeypatch):
    split = raw_split(300)
    folder = tmp_path / "test"
    folder.mkdir()
    for index, part in enumerate((split.slice(0, 200), split.slice(200))):  # two part files
        pq.write_table(part, folder / f"part-{index}.parquet", row_group_size=GROUP_ROWS)
    whole = pq.read_table(folder)
    predicted = bundle.predict_codes(whole)
    expected = classification_metrics(whole.column("species").to_numpy(), predicted, CLASSES)
    batches = count_batches(bundle, monkeypatch)
    assert split_metrics(bundle, str(folder), "species", CLASSES) == expected
    assert batches == [GROUP_ROWS] * 28 + [4] + [GROUP_ROWS] * 14 + [2], "one row group at a time"
    assert len(set(predicted)) > 1, "an untrained model that predicts one class tests little"


def peak_bytes(evaluate: Callable[[], object]) -> tuple[int, int]:
    """The peak memory that `evaluate` allocates: through Python and numpy, and through Arrow."""
    default = pa.default_memory_pool()
    arrow = pa.proxy_memory_pool(default)
    pa.set_memory_pool(arrow)
    tracemalloc.start()
    try:
        evaluate()
        return tracemalloc.get_traced_memory()[1], arrow.max_memory()
    finally:
        tracemalloc.stop()
        pa.set_memory_pool(default)


@pytest.mark.slow
def test_memory_does_not_grow_with_the_split(bundle, tmp_path):
    peaks = {}
    for rows in (20_000, 400_000):
        path = tmp_path / f"{rows}.parquet"
        pq.write_table(raw_split(rows), path, row_group_size=2_000)
        split_metrics(bundle, str(path), "species", CLASSES)  # lazy imports and set-up, not measured
        peaks[rows] = peak_bytes(lambda path=path: split_metrics(bundle, str(path), "species", CLASSES))
    whole_split = raw_split(400_000).nbytes  # 16 MB
    for small, large in zip(peaks[20_000], peaks[400_000], strict=True):
        assert large < 1.5 * small + 64_000, f"{large:,} bytes for 20x the rows of {small:,}"
        assert large < whole_split / 20


@pytest.mark.slow  # writes a bundle with its model exports: seconds
def test_a_raw_split_of_text_booleans_dates_and_nulls_gives_the_metrics_its_later_scoring_gives(tmp_path):
    """The test split as preprocessing writes it for a mixed table: the raw columns with their own types
    and the class codes; a user's scoring of the same rows, labels as text, counts the same."""
    bundle = load_bundle(write_messy_bundle(tmp_path / "bundle", seed=3))
    rows = messy_table(200, seed=5)
    codes = pc.index_in(rows.column("species"), value_set=pa.array(CLASSES))
    split = rows.set_column(rows.schema.get_field_index("species"), "species", pc.cast(codes, pa.int64()))
    folder = tmp_path / "test"
    folder.mkdir()
    for index, part in enumerate((split.slice(0, 120), split.slice(120))):
        pq.write_table(part, folder / f"part-{index}.parquet", row_group_size=GROUP_ROWS)
    metrics = split_metrics(bundle, str(folder), "species", CLASSES)
    predicted = bundle.predict_codes(rows)
    assert metrics == classification_metrics(split.column("species").to_numpy(), predicted, CLASSES)
    pq.write_table(rows, tmp_path / "users.parquet")
    scored = score_dataset(str(tmp_path / "bundle"), str(tmp_path / "users.parquet"), str(tmp_path / "out"))
    assert scored.metrics == metrics and len(set(predicted)) > 1
