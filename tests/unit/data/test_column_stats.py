"""column_stats.py: the train rows' per-column statistics, exact in any grouping: the exact sum, and
category counts bounded by a cap that keeps the frequent values and an exact total."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pyarrow as pa
import pytest

from tasks.core.data.column_kinds import CATEGORICAL, Place, canonical, propose_kinds
from tasks.core.data.column_stats import COUNT_CAP, SUM_SCALE_BITS, CategoryStats, exact_sum
from tasks.core.data.encoders import CategoryEncoding
from tasks.core.data.encoding import EncodingStats, batch_stats


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


@pytest.mark.parametrize(
    "values",
    [
        [5e-324, -5e-324, 1e308, -1e308, 0.1, 0.2, 0.3, -2.5e-310, 3.0, 1e-300],
        [3.0, -7.0, 0.0, -0.0, 120.0] * 1000,  # whole numbers, summed as floats
        [2.0**52, 1.0, 1.0],  # whole, but a float sum would round: summed by exponent
        [4503599627370495.0, 4503599627370495.0, -1.0],
        [1e308] * 3,
    ],
)
def test_exact_sum_is_the_exact_rational_sum(values):
    values = np.array(values)
    assert Fraction(exact_sum(values), 2**SUM_SCALE_BITS) == sum(Fraction(v) for v in values)


# --- categories from a dictionary array, as from text ---------------------------------------------------


def category_forms(dictionary: pa.Array, indices: list[int | None]) -> tuple[pa.Array, pa.Array]:
    """A dictionary array and the same values as plain values, each read as categories."""
    keyed = pa.DictionaryArray.from_arrays(pa.array(indices, pa.int32()), dictionary)
    plain = keyed.cast(dictionary.type)
    return canonical(CATEGORICAL, keyed, Place("c")), canonical(CATEGORICAL, plain, Place("c"))


# Blanks ("") are missing, as nulls are; a space is a value. A dictionary may hold a value twice, a blank,
# a null or values no row takes, which a parquet page's does not.
TEXT_DICTIONARIES = {
    "distinct": (pa.array(["red", "green", "blue", " "]), [0, 1, None, 2, 0, 3, 0, None, 1]),
    "repeated, blank and null entries": (
        pa.array(["red", "", "green", "red", " ", None, "blue", "unused", ""]),
        [0, 1, 2, 3, None, 4, 5, 6, 0, 3, 1, 4, 8, 2],
    ),
    "large text": (pa.array(["b", "a", "b", ""], pa.large_string()), [0, 1, 2, 3, None, 0]),
    "only missing values": (pa.array(["", None]), [0, 1, None, 0]),
    "no rows": (pa.array(["a", "b"]), []),
}


@pytest.mark.parametrize("case", sorted(TEXT_DICTIONARIES))
@pytest.mark.parametrize("cap", [COUNT_CAP, 1])
def test_category_stats_of_a_dictionary_array_equal_those_of_its_text(case, cap):
    keyed, plain = category_forms(*TEXT_DICTIONARIES[case])
    assert pa.types.is_dictionary(keyed.type) and not pa.types.is_dictionary(plain.type)
    assert CategoryStats.of(keyed, cap) == CategoryStats.of(plain, cap)


def test_category_stats_of_text_count_blanks_as_missing_and_spaces_as_values():
    keyed, plain = category_forms(*TEXT_DICTIONARIES["repeated, blank and null entries"])
    expected = CategoryStats({"red": 4, "green": 2, " ": 2, "blue": 1}, other=0, missing=5)
    assert CategoryStats.of(keyed) == expected and CategoryStats.of(plain) == expected


@pytest.mark.parametrize("case", sorted(TEXT_DICTIONARIES))
@pytest.mark.parametrize("indicator", [False, True], ids=["no indicator", "indicator"])
def test_category_codes_of_a_dictionary_array_equal_those_of_its_text(case, indicator):
    keyed, plain = category_forms(*TEXT_DICTIONARIES[case])
    encoding = CategoryEncoding(["green", " ", "red", "never seen"], indicator)
    codes = encoding.codes(keyed)
    np.testing.assert_array_equal(codes, encoding.codes(plain))
    assert codes.dtype == encoding.codes(plain).dtype


def test_category_codes_place_other_values_and_missing_ones():
    keyed, plain = category_forms(*TEXT_DICTIONARIES["repeated, blank and null entries"])
    # red, "", green, red, null, " ", null, blue, red, red, "", " ", "", green
    with_indicator = [2, 5, 0, 2, 5, 1, 5, 4, 2, 2, 5, 1, 5, 0]
    for indicator, expected in ((True, with_indicator), (False, [min(code, 4) for code in with_indicator])):
        encoding = CategoryEncoding(["green", " ", "red", "never seen"], indicator)
        assert encoding.codes(keyed).tolist() == expected and encoding.codes(plain).tolist() == expected


def test_a_float_dictionary_gives_the_categories_of_its_floats():
    """-0.0 and 0.0 are one category, NaN is missing, whether the floats come in a dictionary or not."""
    dictionary = pa.array([-0.0, 0.0, float("nan"), 1.5, None, 2.0])
    keyed, plain = category_forms(dictionary, [0, 1, 2, 3, None, 1, 0, 4, 3, 1])
    expected = CategoryStats({"0": 5, "1.5": 2}, other=0, missing=3)
    assert CategoryStats.of(keyed) == expected and CategoryStats.of(plain) == expected
    encoding = CategoryEncoding(["0", "2"], indicator=True)
    np.testing.assert_array_equal(encoding.codes(keyed), encoding.codes(plain))
    assert encoding.codes(keyed).tolist() == [0, 0, 3, 2, 3, 0, 0, 3, 2, 0]


@pytest.mark.parametrize(
    "index_type",
    [
        pa.int8(),
        pa.int16(),
        pa.int64(),
        pa.uint8(),
        pa.uint32(),  # a Polars categorical's: a missing index is -1 only once widened
    ],
    ids=str,
)
def test_categories_of_a_dictionary_with_any_index_type_are_those_of_its_text(index_type):
    dictionary = pa.array(["red", "green", "blue"])
    keyed = pa.DictionaryArray.from_arrays(pa.array([0, 1, None, 2, 0], index_type), dictionary)
    categories = canonical(CATEGORICAL, keyed, Place("c"))
    plain = canonical(CATEGORICAL, keyed.cast(pa.string()), Place("c"))
    assert CategoryStats.of(categories) == CategoryStats.of(plain)
    encoding = CategoryEncoding(["red", "blue"], indicator=True)
    assert encoding.codes(categories).tolist() == encoding.codes(plain).tolist() == [0, 2, 3, 1, 0]
