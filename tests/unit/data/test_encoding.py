"""Mixed feature columns: kinds, overrides, the exactly merged train statistics, the fitted encoding and
its JSON round trip."""

import json
from datetime import UTC, date, datetime
from decimal import Decimal
from fractions import Fraction

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from tasks.core.data.column_kinds import BOOLEAN, CATEGORICAL, DATE, DROP, NUMERIC, propose_kinds
from tasks.core.data.column_stats import SUM_SCALE_BITS, exact_sum
from tasks.core.data.encoding import EncodingStats, FittedEncoding, batch_stats
from tasks.core.data.files import DatasetError
from tasks.core.data.reading import iter_batches, open_dataset


def fit(table, overrides=None, **fit_args):
    kinds = propose_kinds(table.schema, overrides=overrides, sample=table)
    return batch_stats(kinds, table).fit(**fit_args)


def encoded(fitted, table, **transform_args):
    return dict(zip(fitted.encoded_names(), fitted.transform(table, **transform_args).T, strict=True))


@pytest.mark.parametrize(
    ("values", "kind"),
    [
        (pa.array([1, 2], pa.int64()), NUMERIC),
        (pa.array([1.5, None], pa.float32()), NUMERIC),
        (pa.array([Decimal("1.5"), None]), NUMERIC),
        (pa.nulls(2), NUMERIC),
        (pa.array(["a", "b"]), CATEGORICAL),
        (pa.array(["a", "b"], pa.large_string()), CATEGORICAL),
        (pa.array(["a", "b"]).dictionary_encode(), CATEGORICAL),
        (pa.array([1, 2]).dictionary_encode(), CATEGORICAL),
        (pa.array([True, None]), BOOLEAN),
        (pa.array([date(2024, 1, 1), None]), DATE),
        (pa.array([0, 86_400_000], pa.date64()), DATE),
        *[(pa.array([0, 1], pa.timestamp(unit)), DATE) for unit in ("s", "ms", "us", "ns")],
        (pa.array([0, 1], pa.timestamp("us", tz="Asia/Tokyo")), DATE),
        (pa.array(["2024-01-31", "2024-02-01T10:00:00Z", "2024-02-01 10:00", "", None]), DATE),
        (pa.array(["2024-01-31", "soon"]), CATEGORICAL),
        (pa.array(["", None]), CATEGORICAL),
    ],
)
def test_kinds_are_proposed_from_the_arrow_type_and_iso_text(values, kind):
    table = pa.table({"c": values})
    assert propose_kinds(table.schema, sample=table)["c"].kind == kind


def test_a_pandas_categorical_is_one_hot_encoded():
    frame = pd.DataFrame({"c": pd.Categorical(["x", "y", None, "x"]), "n": [1.0, 2.0, 3.0, 4.0]})
    fitted = fit(pa.Table.from_pandas(frame, preserve_index=False))
    columns = encoded(fitted, pa.table({"c": ["y", "z", None], "n": [1.0, 2.0, 3.0]}))
    assert fitted.encoded_names()[:4] == ["c=x", "c=y", "c=<other>", "c=<missing>"]
    assert columns["c=y"].tolist() == [1, 0, 0] and columns["c=<other>"].tolist() == [0, 1, 0]
    assert columns["c=<missing>"].tolist() == [0, 0, 1]


def test_a_type_no_kind_reads_is_refused_unless_dropped():
    table = pa.table({"blob": pa.array([b"x", b"y"], pa.binary()), "n": [1.0, 2.0]})
    with pytest.raises(DatasetError, match=r"'blob' has type binary.*mark it 'drop'"):
        propose_kinds(table.schema)
    fitted = fit(table, {"blob": DROP})
    assert fitted.encoded_names() == ["n"] and "'blob'" in fitted.left_out["blob"]
    assert fitted.transform(pa.table({"n": [5.0]})).tolist() == [[5.0]]  # a dropped column may be absent


def test_integer_codes_marked_categorical_read_the_same_from_floats_and_text():
    fitted = fit(pa.table({"code": [3, 1, 3, 2]}), {"code": CATEGORICAL})
    assert fitted.encoded_names() == ["code=3", "code=1", "code=2", "code=<other>"]
    csv_like = fitted.transform(pa.table({"code": [3.0, 1.0, -0.0, None]}))
    text = fitted.transform(pa.table({"code": ["3", "1", "0", None]}))
    expected = [[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 0, 1], [0, 0, 0, 1]]  # missing, unseen in train: other
    assert csv_like.tolist() == expected and text.tolist() == expected


@pytest.mark.parametrize(
    ("values", "kind", "rows"),
    [
        (["yes", "No", " TRUE ", "0", None], BOOLEAN, [[1, 0], [0, 0], [1, 0], [0, 0], [0.5, 1]]),
        ([1, 0, 0, 1, 1], BOOLEAN, [[1], [0], [0], [1], [1]]),
        (["1.5", " 2 ", "", "1e1", None], NUMERIC, [[1.5, 0], [2, 0], [4.5, 1], [10, 0], [4.5, 1]]),
        ([True, False, True, True, False], NUMERIC, [[1], [0], [1], [1], [0]]),
    ],
)
def test_overrides_read_their_kind_from_other_types(values, kind, rows):
    table = pa.table({"c": values})
    assert fit(table, {"c": kind}).transform(table).tolist() == rows


@pytest.mark.parametrize(
    ("values", "kind", "words"),
    [
        (pa.array(["2024-01-01", "soon"]), DATE, ["'c'", "read as date", "'soon' at row 1", "ISO date"]),
        (pa.array(["1.5", "abc"]), NUMERIC, ["'c'", "read as numeric", "'abc' at row 1"]),
        (pa.array([0, 2]), BOOLEAN, ["'c'", "read as boolean", "2 at row 1"]),
        (pa.array(["yes", "maybe"]), BOOLEAN, ["'c'", "'maybe' at row 1"]),
        (pa.array([date(2024, 1, 1)]), NUMERIC, ["'c'", "date32", "cannot be read as numeric"]),
        (pa.array(["a"]), "text", ["'c'", "'text'", "not a kind"]),
    ],
)
def test_an_override_that_cannot_apply_names_the_column_and_value(values, kind, words):
    table = pa.table({"c": values})
    with pytest.raises(DatasetError) as raised:
        propose_kinds(table.schema, overrides={"c": kind}, sample=table)
    for word in words:
        assert word in str(raised.value)


def test_an_override_of_no_feature_column_is_named():
    with pytest.raises(DatasetError, match="'nope'"):
        propose_kinds(pa.schema([("a", pa.int64())]), overrides={"nope": NUMERIC})


def test_a_value_of_a_later_batch_is_named_by_source_and_row():
    fitted = fit(pa.table({"c": ["1", "2"]}), {"c": NUMERIC})
    with pytest.raises(DatasetError, match=r"^data.csv: feature column 'c' .*'x' at row 102"):
        fitted.transform(pa.table({"c": ["3", None, "x"]}), first_row=100, source="data.csv")


def test_iso_text_dates_from_csv_are_dates_in_utc(tmp_path):
    path = tmp_path / "rows.csv"
    path.write_text(
        "label,when,day,code\n"
        "a,2024-03-01T12:00:00+02:00,2024-03-01,1\n"
        "b,2024-03-02 06:00:00,,2\n"
        "a,,2024-03-05,\n"
    )
    dataset = open_dataset(str(path), "label")
    batch = next(iter_batches(dataset, str(path)))
    assert dataset.schema.field("when").type == pa.string()  # zoned and naive: pyarrow leaves it text
    kinds = propose_kinds(dataset.schema, ["when", "day", "code"], sample=batch)
    assert [kinds[name].kind for name in ("when", "day", "code")] == [DATE, DATE, NUMERIC]
    columns = encoded(batch_stats(kinds, batch).fit(), batch)
    # 10:00 UTC, then 06:00 naive taken as UTC 20 hours later; missing: the middle of the range
    np.testing.assert_allclose(columns["when:days"], [0, 20 / 24, 10 / 24])
    assert columns["when<missing>"].tolist() == [0, 0, 1]
    assert columns["day:days"].tolist() == [0, 2, 4] and columns["day:weekday"].tolist() == [4, 6, 1]


def test_missing_numbers_take_the_mean_and_an_indicator_only_where_train_had_them():
    fitted = fit(pa.table({"gap": [1.0, None, np.nan, 4.0], "full": [1, 2, 3, 6]}))
    assert fitted.encoded_names() == ["gap", "gap<missing>", "full"]
    rows = fitted.transform(pa.table({"full": [None, 5], "gap": [np.nan, 7.0]}))
    assert rows.tolist() == [[2.5, 1, 3], [7, 0, 5]]


def test_unseen_and_missing_categories_never_fail():
    fitted = fit(pa.table({"color": ["red", "blue", "red", None]}))
    assert fitted.encoded_names() == ["color=red", "color=blue", "color=<other>", "color=<missing>"]
    rows = fitted.transform(pa.table({"color": ["green", None, "blue", ""]}))
    assert rows.tolist() == [[0, 0, 1, 0], [0, 0, 0, 1], [0, 1, 0, 0], [0, 0, 0, 1]]


@pytest.mark.parametrize(
    "same_instant",
    [
        pa.array([datetime(2024, 1, 1, tzinfo=UTC)], pa.timestamp("s", tz="UTC")),
        pa.array([datetime(2024, 1, 1)], pa.timestamp("ns")),  # naive: taken as UTC
        pa.array([datetime(2024, 1, 1, tzinfo=UTC)], pa.timestamp("ms", tz="Europe/Paris")),
        pa.array(["2024-01-01T01:00:00+01:00"]),
        pa.array(["2024-01-01 00:00:00"]),
        pa.array([date(2024, 1, 1)]),
    ],
)
def test_dates_of_any_type_and_zone_are_encoded_as_utc_instants(same_instant):
    train = pa.array(
        [datetime(2023, 12, 1, tzinfo=UTC), datetime(2024, 2, 1, tzinfo=UTC)], pa.timestamp("us", tz="UTC")
    )
    fitted = fit(pa.table({"signup": train}))
    assert fitted.encoded_names() == ["signup:days", "signup:month", "signup:weekday"]
    assert fitted.transform(pa.table({"signup": same_instant})).tolist() == [[31, 1, 0]]  # a Monday


def test_a_zoned_wall_clock_differs_from_the_same_naive_one():
    fitted = fit(pa.table({"t": pa.array([0, 10**6], pa.timestamp("s"))}))
    naive = pa.array([datetime(2024, 1, 1)], pa.timestamp("s"))
    paris = pa.array([pd.Timestamp("2024-01-01", tz="Europe/Paris")], pa.timestamp("s", tz="Europe/Paris"))
    days = fitted.transform(pa.table({"t": naive}))[0, 0] - fitted.transform(pa.table({"t": paris}))[0, 0]
    assert days == pytest.approx(1 / 24)


@pytest.mark.parametrize(
    ("values", "overrides", "why"),
    [
        ([f"id-{i}" for i in range(60)], {}, "a different value in each of the 60 train rows"),
        (["north"] * 60, {}, "the same value in every train row (constant)"),
        (pa.array([date(2024, 1, 1)] * 60), {}, "(constant)"),
        (pa.nulls(60, pa.float64()), {}, "no value in the train rows (all missing)"),
        (pa.nulls(60, pa.string()), {}, "(all missing)"),
        ([None] * 60, {"c": DROP}, "marked 'drop'"),
    ],
)
def test_columns_left_out_have_a_note_naming_them_and_why(values, overrides, why):
    fitted = fit(pa.table({"c": values, "n": np.arange(60.0)}), overrides)
    assert fitted.encoded_names() == ["n"]
    assert "'c'" in fitted.left_out["c"] and why in fitted.left_out["c"]


@pytest.mark.parametrize(
    ("values", "overrides"),
    [
        ([f"id-{i}" for i in range(10)], {}),  # too few rows to call it an identifier
        ([f"id-{i}" for i in range(60)][:10] * 6, {}),  # values repeat
        ([f"id-{i}" for i in range(60)], {"c": CATEGORICAL}),  # the user says it is a category
        ([7.0] * 59 + [None], {}),  # constant but for a missing value: the indicator says something
        (["north"] * 59 + [None], {}),
        ([7.0] * 60, {}),  # a constant number or boolean stays in place, standardised to 0 later
        ([True] * 60, {}),
    ],
)
def test_columns_kept(values, overrides):
    fitted = fit(pa.table({"c": values, "n": np.arange(float(len(values)))}), overrides)
    assert not fitted.left_out and fitted.encoded_names()[-1] == "n"


def test_no_column_left_is_refused_naming_why():
    with pytest.raises(DatasetError, match=r"no feature column is left to encode: column 'c' .*\(constant\)"):
        fit(pa.table({"c": ["a", "a"]}))


def test_the_vocabulary_keeps_the_most_frequent_values_ties_by_value():
    values = ["d"] + ["c"] * 3 + ["a"] * 5 + ["b"] * 3
    fitted = fit(pa.table({"c": values}), vocabulary_cap=2)
    assert fitted.encoded_names() == ["c=a", "c=b", "c=<other>"]
    assert fitted.transform(pa.table({"c": ["c", "d", "b"]})).tolist() == [[0, 0, 1], [0, 0, 1], [0, 1, 0]]


def test_counting_beyond_the_cap_keeps_frequent_values_and_an_exact_total():
    kinds = propose_kinds(pa.schema([("c", pa.string()), ("id", pa.string())]))
    stats = EncodingStats.empty(kinds, count_cap=3)
    for batch in range(20):
        rare = [f"rare-{batch}-{i}" for i in range(5)]
        table = pa.table({"c": ["hot"] * 3 + rare, "id": [f"id-{batch}-{i}" for i in range(8)]})
        stats = stats.merge(batch_stats(kinds, table, first_row=8 * batch, count_cap=3))
    hot = stats.columns["c"]
    assert hot.overflowed and hot.count == 160 and list(hot.counts) == ["hot"]
    fitted = stats.fit()
    assert fitted.encoded_names() == ["c=hot", "c=<other>"]
    assert "more than 3 distinct values, none frequent" in fitted.left_out["id"]


def test_exact_sum_is_the_exact_rational_sum():
    values = np.array([5e-324, -5e-324, 1e308, -1e308, 0.1, 0.2, 0.3, -2.5e-310, 3.0, 1e-300])
    assert Fraction(exact_sum(values), 2**SUM_SCALE_BITS) == sum(Fraction(v) for v in values)


def mixed_table(rows: int) -> pa.Table:
    rng = np.random.default_rng(7)
    numbers = rng.normal(0, 1, rows) * 10.0 ** rng.integers(-8, 8, rows)
    numbers[rng.random(rows) < 0.1] = np.nan
    stamps = rng.integers(0, 10**9, rows).astype("datetime64[s]")
    return pa.table(
        {
            "x": pa.array(numbers, from_pandas=False),
            "color": pa.array(rng.choice(["red", "green", "blue", "grey", None], rows)),
            "flag": pa.array([None if r < 0.1 else r < 0.6 for r in rng.random(rows)]),
            "t": pa.array(stamps, pa.timestamp("s")).cast(pa.timestamp("s", tz="Asia/Tokyo")),
            "day": pa.array([None if i % 13 == 0 else str(d)[:10] for i, d in enumerate(stamps)]),
            "code": pa.array(rng.integers(0, 5, rows)),
        }
    )


@pytest.mark.parametrize("pieces", [1, 3, 7])
def test_merged_pieces_fit_and_encode_exactly_as_one_pass(pieces):
    table = mixed_table(700)
    keep = np.random.default_rng(1).random(len(table)) < 0.7
    kinds = propose_kinds(table.schema, overrides={"code": CATEGORICAL}, sample=table.slice(0, 100))
    whole = batch_stats(kinds, table, keep=keep)
    cuts = np.sort(np.random.default_rng(pieces).choice(np.arange(1, len(table)), pieces - 1, replace=False))
    parts = []
    for start, stop in zip([0, *cuts], [*cuts, len(table)], strict=True):
        part = EncodingStats.empty(kinds)
        for first in range(start, stop, 50):  # each piece streams batches of its rows
            rows = slice(first, min(first + 50, stop))
            batch = table.slice(first, rows.stop - first).to_batches()[0]
            part = part.merge(batch_stats(kinds, batch, first_row=first, keep=keep[rows]))
        parts.append(part)
    total = parts[0]
    for part in parts[1:]:
        total = total.merge(part)
    assert total.to_dict() == whole.to_dict()
    assert total.fit().to_dict() == whole.fit().to_dict()
    np.testing.assert_array_equal(total.fit().transform(table), whole.fit().transform(table))
    train = table.column("x").to_numpy()[keep]
    present = train[~np.isnan(train)]
    assert total.columns["x"].mean == float(sum(map(Fraction, present)) / len(present))


def test_the_fitted_encoding_and_the_statistics_round_trip_through_json():
    table = mixed_table(200)
    kinds = propose_kinds(table.schema, overrides={"code": CATEGORICAL}, sample=table)
    stats = batch_stats(kinds, table)
    assert EncodingStats.from_dict(json.loads(json.dumps(stats.to_dict()))) == stats
    fitted = stats.fit()
    saved = json.loads(json.dumps(fitted.to_dict()))
    assert saved["version"] == 1
    again = FittedEncoding.from_dict(saved)
    assert again == fitted
    np.testing.assert_array_equal(again.transform(table), fitted.transform(table))
    with pytest.raises(ValueError, match="version 2"):
        FittedEncoding.from_dict({**saved, "version": 2})


def test_columns_in_any_order_with_extras_and_a_missing_one_named():
    table = mixed_table(50)
    fitted = fit(table)
    reordered = table.select(list(reversed(table.column_names))).append_column("extra", pa.array(["z"] * 50))
    np.testing.assert_array_equal(fitted.transform(reordered), fitted.transform(table))
    assert fitted.transform(table.slice(0, 0)).shape == (0, len(fitted.encoded_names()))
    with pytest.raises(DatasetError, match=r"scores.parquet: feature column 'color' is missing"):
        fitted.transform(table.drop_columns(["color"]), source="scores.parquet")


def test_infinite_numbers_are_refused_by_column_and_row():
    table = pa.table({"x": [1.0, 2.0, np.inf, -np.inf]})
    kinds = propose_kinds(table.schema)
    with pytest.raises(
        DatasetError, match=r"^in.csv: feature column 'x' has infinite values \(inf\) at rows 12, 13"
    ):
        batch_stats(kinds, table, first_row=10, source="in.csv")
    fitted = fit(table.slice(0, 2))
    with pytest.raises(DatasetError, match="'x' has an infinite value .* at row 0"):
        fitted.transform(pa.table({"x": [-np.inf]}))
