"""CSV columns whose first block pyarrow reads as text, though their values are numbers or ISO dates
but for a few.

pyarrow types a CSV column from the file's first block: one value there that is not a number ('?',
'31/12/2021' among ISO dates) made the whole column text, and so a category of hundreds of values,
while the same value further down fails to convert and is refused naming its line. `retyped` gives
such a column the type its other values have, so that a stray value is refused naming its line
wherever it sits. `comma_numbers` tells a column of numbers written with a decimal comma ('0,123'),
which a file whose numbers are all written so is read with (`reading.csv_guess`).
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv

# More than this share of a column's values in the first block (missing ones aside) are of one type.
MOSTLY = 0.5
# What pyarrow reads as missing in a number or date column, and an empty field.
NULL_TOKENS = pa.array(pa_csv.ConvertOptions().null_values, pa.string())
NUMBER = {
    ".": r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$",
    ",": r"^[+-]?(\d+,?\d*|,\d+)([eE][+-]?\d+)?$",
}
COMMA_FRACTION = r"^[+-]?\d*,\d+([eE][+-]?\d+)?$"
ISO_DATE = r"^\d{4}-\d\d-\d\d$"
ISO_TIME = r"^\d{4}-\d\d-\d\d[T ]\d\d:\d\d(:\d\d(\.\d+)?)?$"
ISO_ZONED = r"^\d{4}-\d\d-\d\d[T ]\d\d:\d\d(:\d\d(\.\d+)?)?(Z|[+-]\d\d(:?\d\d)?)$"


def present(column: pa.Array) -> pa.Array:
    """The values trimmed, without the missing ones (null, empty or one of pyarrow's null tokens)."""
    text = pc.utf8_trim_whitespace(pc.cast(column, pa.string()).drop_null())
    return text.filter(pc.invert(pc.is_in(text, value_set=NULL_TOKENS)))


def matching(text: pa.Array, pattern: str) -> int:
    return pc.sum(pc.match_substring_regex(text, pattern)).as_py() or 0


def retyped(column: pa.Array, decimal_point: str) -> pa.DataType | None:
    """The type a text column of the first block is read as: float64 where most of its values are
    numbers and some are not, a date or timestamp where most are ISO dates or times of one form
    (all dates, or all without a zone offset, or all with one) and some are not; else None (text)."""
    text = present(column)
    if not len(text):
        return None
    numbers = matching(text, NUMBER[decimal_point])
    if numbers < len(text) and numbers > MOSTLY * len(text):
        return pa.float64()
    dates, times, zoned = (matching(text, form) for form in (ISO_DATE, ISO_TIME, ISO_ZONED))
    instants = dates + times + zoned
    if not (instants < len(text) and instants > MOSTLY * len(text)):
        return None
    if dates == instants:
        return pa.date32()
    if not zoned:
        return pa.timestamp("us")
    return pa.timestamp("us", "UTC") if zoned == instants else None  # pyarrow reads no mix of the two


def comma_numbers(column: pa.Array) -> int | None:
    """Where a text column's values are mostly numbers written with a decimal comma, some with a
    fraction: the index of the first with one; else None."""
    text = present(column)
    if matching(text, COMMA_FRACTION) == 0 or matching(text, NUMBER[","]) <= MOSTLY * len(text):
        return None
    trimmed = pc.utf8_trim_whitespace(pc.cast(column, pa.string()))
    return pc.index(pc.fill_null(pc.match_substring_regex(trimmed, COMMA_FRACTION), False), True).as_py()
