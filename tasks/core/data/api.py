"""What the serving stage, and anyone reusing a model bundle, reads rows and the fitted preprocessing with.

The serving modules import from tasks.core.data through this module only, so what they depend on is
the list below, not how preprocessing is built:

- the input's files: where a path or URI lives, its format, its row groups, reading it batch by batch;
- the one error for input that cannot be read as the model needs it, `DatasetError`: a missing or
  unreadable file, a missing column, a value of the wrong type;
- the fitted preprocessing: the encoding of the raw columns (`FittedEncoding` and its parts), the
  column kinds it reads them as (each kind's reading and exports' input: `VALUES`, in `kind_values`,
  the module the MLflow model ships), the standardisation (`ScalerStats`), the label (`Target`, class
  labels as the values the input held) and `PreparedTable`, which holds them all.

It stays light: importing it imports neither the preparing of a dataset (prepare.py) nor any
training framework.
"""

from tasks.core.data import kind_values
from tasks.core.data.column_kinds import (
    ACCEPTS,
    BOOLEAN,
    CATEGORICAL,
    DATE,
    KINDS,
    NUMERIC,
    WHAT,
    Place,
    canonical,
    value_type,
)
from tasks.core.data.columns import at_rows, check_finite, check_numeric
from tasks.core.data.encoders import CategoryEncoding, DateEncoding, NumberEncoding, TextEncoding
from tasks.core.data.encoding import ColumnEncoding, FittedEncoding
from tasks.core.data.files import (
    DatasetError,
    detect_format,
    filesystem_for,
    is_local,
    parquet_format,
    parquet_split,
    remote_errors,
    row_group_fragments,
)
from tasks.core.data.kind_values import TEXT, VALUES
from tasks.core.data.labels import typed_labels
from tasks.core.data.reading import (
    VALUE_ADVICE,
    csv_format_of,
    first_batch,
    header_line,
    iter_batches,
    open_dataset,
    sniff_delimiter,
)
from tasks.core.data.scaling import ScalerStats, check_standardised, standardise
from tasks.core.data.splits import batch_features
from tasks.core.data.table import PreparedTable, numbers_as_read
from tasks.core.data.target import Target
from tasks.core.data.unseen import UnseenCategories, merged_unseen
from tasks.core.data.words import NOT_WORD, WORD

__all__ = [
    # files and reading
    "DatasetError",
    "VALUE_ADVICE",
    "csv_format_of",
    "detect_format",
    "filesystem_for",
    "first_batch",
    "header_line",
    "is_local",
    "iter_batches",
    "open_dataset",
    "parquet_format",
    "parquet_split",
    "remote_errors",
    "row_group_fragments",
    "sniff_delimiter",
    # column kinds and checks
    "ACCEPTS",
    "BOOLEAN",
    "CATEGORICAL",
    "DATE",
    "KINDS",
    "NOT_WORD",
    "NUMERIC",
    "TEXT",
    "WORD",
    "VALUES",
    "kind_values",
    "WHAT",
    "Place",
    "at_rows",
    "canonical",
    "check_finite",
    "check_numeric",
    "value_type",
    # the fitted preprocessing
    "CategoryEncoding",
    "ColumnEncoding",
    "DateEncoding",
    "FittedEncoding",
    "NumberEncoding",
    "TextEncoding",
    "PreparedTable",
    "numbers_as_read",
    "ScalerStats",
    "Target",
    "batch_features",
    "check_standardised",
    "standardise",
    "typed_labels",
    # what scoring rows hold that training did not
    "UnseenCategories",
    "merged_unseen",
]
