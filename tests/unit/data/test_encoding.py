"""encoding.py: the encoding fitted on the train rows' statistics (one-hot categories with <other> and
<missing>, imputed numbers with an indicator, the columns left out and why), merged exactly from pieces,
applied to columns in any order, and its JSON round trip."""

from __future__ import annotations

import json
from datetime import date
from fractions import Fraction

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from tasks.core.data.column_kinds import CATEGORICAL, DROP, propose_kinds
from tasks.core.data.encoding import EncodingStats, FittedEncoding, batch_stats
from tasks.core.data.files import DatasetError
from tests.unit.data.tables import encoded_columns, fit


def test_a_pandas_categorical_is_one_hot_encoded():
    frame = pd.DataFrame({"c": pd.Categorical(["x", "y", None, "x"]), "n": [1.0, 2.0, 3.0, 4.0]})
    fitted = fit(pa.Table.from_pandas(frame, preserve_index=False))
    columns = encoded_columns(fitted, pa.table({"c": ["y", "z", None], "n": [1.0, 2.0, 3.0]}))
    assert fitted.encoded_names()[:4] == ["c=x", "c=y", "c=<other>", "c=<missing>"]
    assert columns["c=y"].tolist() == [1, 0, 0] and columns["c=<other>"].tolist() == [0, 1, 0]
    assert columns["c=<missing>"].tolist() == [0, 0, 1]


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
    exact, rounded = split_m2(total.to_dict())
    assert exact == split_m2(whole.to_dict())[0]  # every count, sum, bound and vocabulary
    for name, m2 in split_m2(whole.to_dict())[1].items():  # Chan's merge rounds as the pieces fall
        assert rounded[name] == pytest.approx(m2, rel=1e-12), name
    assert total.fit().to_dict() == whole.fit().to_dict()
    np.testing.assert_array_equal(total.fit().transform(table), whole.fit().transform(table))
    train = table.column("x").to_numpy()[keep]
    present = train[~np.isnan(train)]
    assert total.columns["x"].mean == float(sum(map(Fraction, present)) / len(present))


def split_m2(saved: dict) -> tuple[dict, dict[str, float]]:
    """Saved statistics without their squared deviations, and those by column."""
    columns = {name: dict(stats) for name, stats in saved["columns"].items()}
    m2 = {name: stats.pop("m2") for name, stats in columns.items() if "m2" in stats}
    as_float = {name: float.fromhex(v) if isinstance(v, str) else v for name, v in m2.items()}  # numbers' hex
    return {**saved, "columns": columns}, as_float


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
