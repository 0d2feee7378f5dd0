"""The text kind: a value's words, their statistics merged in any grouping, the default choice between
text, a category and an identifier, the encoded counts and their moments, and a declared text column."""

from __future__ import annotations

import re
from collections import Counter

import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.parquet as pq
import pytest

from tasks.core.data.assignment import SplitConfig
from tasks.core.data.column_kinds import ColumnKind, propose_kinds
from tasks.core.data.column_stats import CategoryStats
from tasks.core.data.encoders import TextEncoding
from tasks.core.data.encoding import MIN_IDENTIFIER_ROWS, EncodingStats, FittedEncoding, batch_stats
from tasks.core.data.files import DatasetError
from tasks.core.data.kind_records import RECORDS
from tasks.core.data.kind_values import CATEGORICAL, TEXT
from tasks.core.data.moments import FeatureMoments
from tasks.core.data.prepare import prepare_dataset
from tasks.core.data.reading import open_dataset
from tasks.core.data.scaling import encoded_moments
from tasks.core.data.splits import read_split
from tasks.core.data.words import TEXT_BUCKETS, buckets_of, value_words

MAKERS = ["ford", "chevrolet", "toyota", "datsun", "volkswagen", "peugeot", "honda", "mazda"]
MODELS = ["pinto", "malibu", "corolla", "510", "rabbit", "504", "civic", "rx-4", "custom", "wagon"]


def car_names(rows: int, seed: int = 0) -> list[str | None]:
    """Names like a cars table's: a maker, a model and a number, mostly distinct, with gaps."""
    rng = np.random.default_rng(seed)
    names = [
        f"{rng.choice(MAKERS)} {rng.choice(MODELS)} {rng.integers(100, 10_000)}"
        + (" (SW)" if rng.random() < 0.2 else "")
        for _ in range(rows)
    ]
    return [None if row % 17 == 3 else name for row, name in enumerate(names)]


def fitted(table: pa.Table, overrides: dict[str, str] | None = None) -> FittedEncoding:
    return batch_stats(propose_kinds(table.schema, overrides=overrides, sample=table), table).fit()


def kinds_of(encoding: FittedEncoding) -> dict[str, str]:
    return {column.name: column.kind for column in encoding.columns}


# ---- words ----------------------------------------------------------------------------------------------


def test_words_are_runs_of_ascii_letters_and_digits_lowercased():
    text = pa.array(["Chevy-Malibu (SW)", None, "", " \t", "Ärger über_all", "id-000123", "a.B,c"])
    words, at = value_words(text)
    assert words.to_pylist() == ["chevy", "malibu", "sw", "rger", "ber", "all", "id", "000123", "a", "b", "c"]
    assert at.tolist() == [0, 0, 0, 4, 4, 4, 5, 5, 6, 6, 6]


def test_a_word_s_bucket_is_its_crc32_the_same_in_every_process():
    """Pinned: Python's own `hash` of a string differs between processes."""
    assert buckets_of(["ford", "chevrolet", "toyota"], 128).tolist() == [107, 38, 95]


# ---- statistics -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("form", ["text", "dictionary"])
def test_word_statistics_merge_exactly_in_any_grouping(form):
    names = pa.array(car_names(600))
    values = names.dictionary_encode() if form == "dictionary" else names
    whole = CategoryStats.with_words(values)
    rng = np.random.default_rng(1)
    for _ in range(3):
        cuts = np.sort(rng.choice(np.arange(1, len(names)), size=5, replace=False))
        pieces = [values[a:b] for a, b in zip([0, *cuts], [*cuts, len(names)], strict=True)]
        merged = RECORDS[TEXT].empty_stats(10_000)
        for piece in rng.permutation(len(pieces)):
            merged = merged.merge(CategoryStats.with_words(pieces[piece]))
        assert merged == whole
    assert CategoryStats.from_dict(whole.to_dict()) == whole
    assert whole.words.rows == whole.count == sum(name is not None for name in names.to_pylist())
    assert whole.words.counts["ford"] == sum("ford" in (name or "").split() for name in names.to_pylist())


def test_pieces_fit_the_encoding_and_the_scaler_one_pass_fits():
    table = pa.table({"name": car_names(500), "n": np.arange(500.0)})
    kinds = propose_kinds(table.schema, sample=table)
    whole = batch_stats(kinds, table)
    merged = EncodingStats.empty(kinds)
    for start in range(0, 500, 70):  # as pods hand them over: JSON dicts
        piece = batch_stats(kinds, table.slice(start, 70), first_row=start)
        merged = merged.merge(EncodingStats.from_dict(piece.to_dict()))
    assert merged.fit().to_dict() == whole.fit().to_dict()
    assert kinds_of(merged.fit())["name"] == TEXT


def test_the_moments_from_statistics_are_those_of_the_encoded_rows():
    table = pa.table({"name": car_names(400)})
    stats = batch_stats(propose_kinds(table.schema, sample=table), table)
    encoding = stats.fit()
    got, want = encoded_moments(stats, encoding), FeatureMoments.of(encoding.transform(table))
    assert got.count == want.count == 400
    np.testing.assert_allclose(got.mean, want.mean, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(got.m2, want.m2, rtol=1e-9, atol=1e-9)
    np.testing.assert_array_equal(got.low, want.low)
    np.testing.assert_array_equal(got.high, want.high)
    assert (got.high > 0).any() and (want.m2 > 0).sum() > TEXT_BUCKETS // 4


# ---- the default choice -----------------------------------------------------------------------------------

CHOICES = {
    # mostly distinct values whose words recur: text
    "names": (car_names(300), TEXT),
    # distinct in every row, one word in every row and the other in one: an identifier, left out
    "identifiers": ([f"id-{row:06d}" for row in range(300)], None),
    "structured identifiers": ([f"ORD-{2020 + row % 3}-{row:06d}" for row in range(300)], None),
    # values that recur: a category
    "colours": ([["red", "green", "dark blue"][row % 3] for row in range(300)], CATEGORICAL),
    # mostly distinct, words that do not recur: a category of a long tail (not every row distinct)
    "codes": ([f"q{row * 7919 % 100_003} z{row}" for row in range(290)] + ["q1 z1"] * 10, CATEGORICAL),
}


@pytest.mark.parametrize("case", sorted(CHOICES))
def test_text_is_chosen_where_values_differ_and_their_words_recur(case):
    values, kind = CHOICES[case]
    encoding = fitted(pa.table({"column": values, "n": np.arange(float(len(values)))}))
    assert kinds_of(encoding).get("column") == kind
    if kind is None:
        assert "like an identifier" in encoding.left_out["column"]


def test_a_declared_kind_and_a_small_table_are_not_turned_to_text():
    names = car_names(300)
    assert kinds_of(fitted(pa.table({"name": names}), {"name": CATEGORICAL})) == {"name": CATEGORICAL}
    few = names[: MIN_IDENTIFIER_ROWS - 1]
    assert kinds_of(fitted(pa.table({"name": few}))) == {"name": CATEGORICAL}
    assert kinds_of(fitted(pa.table({"name": few}), {"name": TEXT})) == {"name": TEXT}


def test_declared_text_without_a_word_is_left_out_saying_why():
    table = pa.table({"marks": ["--", "...", None, "!?"] * 20, "n": np.arange(80.0)})
    encoding = fitted(table, {"marks": TEXT})
    assert "hold no word" in encoding.left_out["marks"]


def test_declared_text_on_a_column_that_is_not_text_is_refused_naming_it():
    table = pa.table({"count": pa.array([1, 2, 3]), "name": ["a", "b", "c"]})
    with pytest.raises(
        DatasetError, match="feature column 'count' has type int64, which cannot be read as text"
    ):
        propose_kinds(table.schema, overrides={"count": TEXT}, sample=table)


def test_a_csv_column_declared_text_is_read_as_the_file_writes_it(tmp_path):
    path = tmp_path / "data.csv"
    pcsv.write_csv(pa.table({"code": ["00123", "7", "0042"], "label": ["a", "b", "a"]}), path)
    schema = open_dataset(str(path), "label", column_kinds={"code": TEXT}).schema
    assert schema.field("code").type == pa.string()


# ---- encoding ----------------------------------------------------------------------------------------------


def test_each_bucket_counts_the_value_s_words_in_the_table():
    encoder = TextEncoding({"ford": 1, "pinto": 3, "wagon": 1}, buckets=4, indicator=True)
    text = pa.array(["Ford Pinto Wagon", "FORD-ford unseen", "", None, "pinto_pinto!"])
    out = np.zeros((len(text), encoder.width()))
    encoder.write(text, out)
    assert out.tolist() == [
        [0, 2, 0, 1, 0],
        [0, 2, 0, 0, 0],
        [0, 0, 0, 0, 0],
        [0, 0, 0, 0, 1],
        [0, 0, 0, 2, 0],
    ]
    assert encoder.names("t") == ["t:words0", "t:words1", "t:words2", "t:words3", "t<missing>"]


def test_the_fitted_table_holds_every_train_word_in_its_bucket_the_most_frequent_first():
    table = pa.table({"name": car_names(300)})
    (column,) = fitted(table).columns
    encoder = column.encoder
    assert column.kind == TEXT and encoder.buckets == TEXT_BUCKETS and encoder.indicator
    held = Counter(
        word
        for name in table.column("name").to_pylist()
        if name
        for word in set(re.findall("[a-z0-9]+", name.lower()))
    )
    assert list(encoder.words) == sorted(held, key=lambda word: (-held[word], word))
    assert list(encoder.words.values()) == buckets_of(list(encoder.words), TEXT_BUCKETS).tolist()
    assert RECORDS[TEXT].deck_vocabulary(encoder) == len(held)


def test_a_row_encodes_alike_alone_and_among_others():
    table = pa.table({"name": car_names(300)})
    encoding = fitted(table)
    together = encoding.transform(table)
    for row in (0, 3, 150):
        np.testing.assert_array_equal(encoding.transform(table.slice(row, 1))[0], together[row])


def test_a_column_proposed_categorical_but_encoded_as_text_keeps_its_proposed_kind_in_the_statistics():
    table = pa.table({"name": car_names(300)})
    stats = batch_stats(propose_kinds(table.schema, sample=table), table)
    assert stats.kinds == {"name": ColumnKind(CATEGORICAL)} and stats.columns["name"].words is not None
    assert kinds_of(stats.fit()) == {"name": TEXT}


def test_preprocessing_reads_names_as_categories_and_writes_them_as_text(tmp_path):
    """The splits are written from the column read as a dictionary (a proposed category): the train
    split holds the standardised counts of the encoding, the test split the names as read."""
    names = car_names(400)
    labels = ["usa" if name and name.split()[0] in ("ford", "chevrolet") else "other" for name in names]
    pq.write_table(pa.table({"name": names, "label": labels}), tmp_path / "cars.parquet")
    prepared = prepare_dataset(str(tmp_path / "cars.parquet"), "label", str(tmp_path / "out"), SplitConfig())
    encoding = prepared.table.fitted_encoding()
    assert kinds_of(encoding) == {"name": TEXT} and prepared.table.feature_names == encoding.encoded_names()
    features, _ = read_split(prepared.paths["train"], prepared.table.feature_names, "label")
    assert features.shape == (prepared.table.rows["train"], TEXT_BUCKETS + 1)
    np.testing.assert_allclose(features.mean(axis=0), 0, atol=1e-6)  # standardised by the statistics' moments
    test = pq.read_table(prepared.paths["test"])
    assert pa.types.is_string(test.schema.field("name").type)
