"""column_kinds.py: the kind proposed for each feature column from its Arrow type and ISO text, the
user's overrides and drops, and each kind's values read from any type (dates as UTC instants); a value
a kind cannot take, or an infinite number, is refused naming the column and row."""

from __future__ import annotations

from datetime import UTC, date, datetime
from decimal import Decimal

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tasks.core.data import reading
from tasks.core.data.assignment import SplitConfig
from tasks.core.data.column_kinds import BOOLEAN, CATEGORICAL, DATE, DROP, NUMERIC, propose_kinds
from tasks.core.data.encoding import batch_stats
from tasks.core.data.files import DatasetError
from tasks.core.data.kind_values import TEXT
from tasks.core.data.prepare import prepare_dataset
from tasks.core.data.reading import iter_batches, open_dataset
from tests.conftest import blobs_frame
from tests.unit.data.tables import (
    MESSY_ROWS,
    encoded_columns,
    fit,
    messy_frame,
    prepare,
    prepare_in_pieces,
    prepare_unchanged,
    split_features,
)

# --- the kind proposed, and the user's overrides --------------------------------------------------


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


def test_a_type_no_kind_reads_is_refused_unless_dropped():
    table = pa.table({"blob": pa.array([b"x", b"y"], pa.binary()), "n": [1.0, 2.0]})
    with pytest.raises(DatasetError, match=r"'blob' has type binary.*mark it 'drop'"):
        propose_kinds(table.schema)
    fitted = fit(table, {"blob": DROP})
    assert fitted.encoded_names() == ["n"] and "'blob'" in fitted.left_out["blob"]
    assert fitted.transform(pa.table({"n": [5.0]})).tolist() == [[5.0]]  # a dropped column may be absent


@pytest.mark.parametrize(
    ("values", "kind", "words"),
    [
        (pa.array(["2024-01-01", "soon"]), DATE, ["'c'", "read as date", "'soon' at row 1", "ISO date"]),
        (pa.array(["1.5", "abc"]), NUMERIC, ["'c'", "read as numeric", "'abc' at row 1"]),
        (pa.array([0, 2]), BOOLEAN, ["'c'", "read as boolean", "2 at row 1"]),
        (pa.array(["yes", "maybe"]), BOOLEAN, ["'c'", "'maybe' at row 1"]),
        (pa.array([date(2024, 1, 1)]), NUMERIC, ["'c'", "date32", "cannot be read as numeric"]),
        (pa.array(["a"]), "words", ["'c'", "'words'", "not a kind"]),
        (pa.array([1, 2]), TEXT, ["'c'", "int64", "cannot be read as text"]),
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


@pytest.mark.parametrize("pieces", [0, 3], ids=["one pod", "3 pieces"])
def test_the_user_forces_a_kind_and_drops_a_column(tmp_path, pieces):
    """A zip code stored as integers is a category, not a number; a column the user drops is left out
    with a note, whatever its kind."""
    frame = messy_frame(csv=False)
    frame["zip"] = np.array([10115, 20095, 80331])[np.arange(MESSY_ROWS) % 3]
    path = str(tmp_path / "zips.parquet")
    frame.to_parquet(path, index=False)
    kinds = {"zip": "categorical", "amount": "drop"}
    if pieces:
        split = SplitConfig(seed=0)
        prepared = prepare_in_pieces(
            path, "species", str(tmp_path / "out"), split, pieces, column_kinds=kinds
        )
    else:
        prepared = prepare_dataset(path, "species", str(tmp_path / "out"), SplitConfig(seed=0), kinds)
    names = prepared.table.feature_names
    assert {"zip=10115", "zip=20095", "zip=80331", "zip=<other>"} <= set(names)
    assert "zip" not in names and not any(name.startswith("amount") for name in names)
    assert any("'amount'" in note for note in prepared.table.notes), prepared.table.notes


def test_a_kind_the_values_cannot_take_is_refused_naming_the_column_and_value(tmp_path):
    frame = messy_frame(csv=False)
    path = str(tmp_path / "messy.parquet")
    frame.to_parquet(path, index=False)
    with pytest.raises(DatasetError, match="colour") as refused:
        prepare_dataset(path, "species", str(tmp_path / "out"), SplitConfig(seed=0), {"colour": "date"})
    assert "red" in str(refused.value) and "messy.parquet" in str(refused.value)


# --- each kind's values, read from any type --------------------------------------------------------


def test_integer_codes_marked_categorical_read_the_same_from_floats_and_text():
    fitted = fit(pa.table({"code": [3, 1, 3, 2]}), {"code": CATEGORICAL})
    assert fitted.encoded_names() == ["code=3", "code=1", "code=2", "code=<other>"]
    csv_like = fitted.transform(pa.table({"code": [3.0, 1.0, -0.0, None]}))
    text = fitted.transform(pa.table({"code": ["3", "1", "0", None]}))
    expected = [[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 0, 1], [0, 0, 0, 1]]  # missing, unseen in train: other
    assert csv_like.tolist() == expected and text.tolist() == expected


def test_long_integer_codes_read_the_same_whether_a_gap_made_them_float():
    """Arrow writes a float of 1e16 or more, and 4006381333905.0, in exponent form: a barcode column
    that a gap made float must still read as its integers, in training and after."""
    codes = [4006381333905, 4006381333912, 10**16]
    as_integers = pa.table({"code": codes})
    with_a_gap = pa.Table.from_pandas(pd.DataFrame({"code": [*codes, None]}))  # pandas: float64
    assert with_a_gap.schema.field("code").type == pa.float64()
    fitted = fit(as_integers, {"code": CATEGORICAL})
    assert set(fitted.encoded_names()) == {*(f"code={code}" for code in codes), "code=<other>"}
    assert fitted.transform(with_a_gap)[:3].tolist() == fitted.transform(as_integers).tolist()
    from_floats = fit(with_a_gap, {"code": CATEGORICAL}).encoded_names()
    assert set(from_floats) - {"code=<missing>"} == set(fitted.encoded_names())
    from tasks.core.data.encoders import CategoryEncoding

    earlier = CategoryEncoding(["4.006381333905e+12", "1e+21"], indicator=False)  # an older bundle's words
    codes = earlier.codes(pa.array(["4006381333905", "1e+21", "4.006381333905e+12"]))
    assert codes.tolist() == [0, 1, 2] and earlier.names("code")[0] == "code=4.006381333905e+12"
    halves = fit(pa.table({"code": [0.5, 2.0]}), {"code": CATEGORICAL})
    assert set(halves.encoded_names()) == {"code=0.5", "code=2", "code=<other>"}


@pytest.mark.parametrize(
    ("values", "kind", "rows"),
    [
        (["yes", "No", " TRUE ", "0", None], BOOLEAN, [[1, 0], [0, 0], [1, 0], [0, 0], [0.5, 1]]),
        (["true", "NA", " null ", "no"], BOOLEAN, [[1, 0], [0.5, 1], [0.5, 1], [0, 0]]),  # CSV null tokens
        (
            ["1.0", "0.0", None, "true", "0"],
            BOOLEAN,
            [[1, 0], [0, 0], [0.5, 1], [1, 0], [0, 0]],
        ),  # pandas' CSV
        ([1, 0, 0, 1, 1], BOOLEAN, [[1], [0], [0], [1], [1]]),
        (["1.5", " 2 ", "", "1e1", None], NUMERIC, [[1.5, 0], [2, 0], [4.5, 1], [10, 0], [4.5, 1]]),
        ([True, False, True, True, False], NUMERIC, [[1], [0], [1], [1], [0]]),
    ],
)
def test_overrides_read_their_kind_from_other_types(values, kind, rows):
    table = pa.table({"c": values})
    assert fit(table, {"c": kind}).transform(table).tolist() == rows


def test_decimal_columns_are_read_as_numbers(tmp_path):
    frame = blobs_frame().round(3)
    as_decimals = frame.assign(f0=[Decimal(f"{value:.3f}") for value in frame["f0"]])
    decimals, floats = tmp_path / "decimals.parquet", tmp_path / "floats.parquet"
    as_decimals.to_parquet(decimals, index=False)
    frame.to_parquet(floats, index=False)
    assert pa.types.is_decimal(pq.read_schema(decimals).field("f0").type)
    prepared = prepare_unchanged(decimals, tmp_path / "d")
    expected = prepare_unchanged(floats, tmp_path / "f")
    np.testing.assert_array_equal(split_features(prepared, "train"), split_features(expected, "train"))


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
    columns = encoded_columns(batch_stats(kinds, batch).fit(), batch)
    # 10:00 UTC, then 06:00 naive taken as UTC 20 hours later; missing: the middle of the range
    np.testing.assert_allclose(columns["when:days"], [0, 20 / 24, 10 / 24])
    assert columns["when<missing>"].tolist() == [0, 0, 1]
    assert columns["day:days"].tolist() == [0, 2, 4] and columns["day:weekday"].tolist() == [4, 6, 1]


@pytest.mark.parametrize(
    "same_instant",
    [
        pa.array([datetime(2024, 1, 1, tzinfo=UTC)], pa.timestamp("s", tz="UTC")),
        pa.array([datetime(2024, 1, 1)], pa.timestamp("ns")),  # naive: taken as UTC
        pa.array([datetime(2024, 1, 1, tzinfo=UTC)], pa.timestamp("ms", tz="Europe/Paris")),
        pa.array(["2024-01-01T01:00:00+01:00"]),
        pa.array(["2024-01-01 00:00:00"]),
        pa.array(["2024-01-01T00:00:00.000000999Z"]),  # nanoseconds, as Go writes them: cut, as typed
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


# --- a value its kind cannot take, named by column and row ----------------------------------------


def test_a_value_of_a_later_batch_is_named_by_source_and_row():
    fitted = fit(pa.table({"c": ["1", "2"]}), {"c": NUMERIC})
    with pytest.raises(DatasetError, match=r"^data.csv: feature column 'c' .*'x' at row 102"):
        fitted.transform(pa.table({"c": ["3", None, "x"]}), first_row=100, source="data.csv")


def test_a_value_past_the_first_batch_not_of_its_column_kind_is_refused_by_row(blobs, tmp_path, monkeypatch):
    """The first batch makes text of ISO dates a date column: a later value that is none is refused."""
    monkeypatch.setattr(reading, "BATCH_ROWS", 50)
    days = [f"2024-01-{day % 28 + 1:02d}" for day in range(len(blobs))]
    days[120] = "soon"
    path = tmp_path / "data.parquet"
    blobs.assign(day=days).to_parquet(path, index=False)
    with pytest.raises(DatasetError) as error:
        prepare(str(path), tmp_path)
    message = str(error.value)
    assert message.startswith(f"{path}: feature column 'day' is read as date but holds 'soon' at row 120")


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
