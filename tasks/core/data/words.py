"""The words of text values, and each word's bucket: what a column of the text kind is encoded by.

A word is a run of ASCII letters and digits, lowercased; every other character (a space, punctuation,
a letter outside ASCII) separates words, so 'Chevy-Malibu (SW)' holds 'chevy', 'malibu' and 'sw', and
'Ärger' holds 'rger'. The rule is one that every runtime a bundle serves from applies alike: the
bundle's Python (pyarrow's RE2), its ONNX export (onnxruntime's Tokenizer, RE2 too) and its SavedModel
(TensorFlow's RE2), with lowercasing on ASCII alone, which each of them does the same way.

A word's bucket is its CRC-32 modulo the buckets, a hash that is the same in every process (Python's
`hash` of a string is not). The fitted encoding stores each train word's bucket, so the exports look
the word up rather than hash it.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

WORD = "[A-Za-z0-9]+"  # a word, as onnxruntime's Tokenizer finds them
NOT_WORD = "[^A-Za-z0-9]+"  # what separates words, as pyarrow and TensorFlow split on it
TEXT_BUCKETS = 128  # the features of a text column, besides its missing indicator


def value_words(text: pa.Array) -> tuple[pa.Array, np.ndarray]:
    """The words of every value of `text` in order, and for each word the index of its value; a missing
    value holds none."""
    split = pc.split_pattern_regex(pc.ascii_lower(pc.cast(text, pa.string())), NOT_WORD)
    words, at = pc.list_flatten(split), pc.list_parent_indices(split)
    kept = pc.not_equal(words, "")  # before a leading separator, after a trailing one
    return words.filter(kept), at.filter(kept).to_numpy(zero_copy_only=False).astype(np.int64)


def buckets_of(words: list[str], buckets: int) -> np.ndarray:
    """Each word's bucket: the CRC-32 of its UTF-8 bytes modulo `buckets`."""
    encoded = pa.array(words, pa.string()).cast(pa.binary()).to_pylist()
    return np.fromiter(map(zlib.crc32, encoded), dtype=np.int64, count=len(words)) % buckets


@dataclass(frozen=True)
class Occurrences:
    """Every word of some distinct values: `vocabulary` holds the distinct words; each occurrence is
    word `word[i]` of value `at[i]`."""

    vocabulary: list[str]
    word: np.ndarray
    at: np.ndarray
    values: int

    @classmethod
    def of(cls, text: pa.Array) -> Occurrences:
        words, at = value_words(text)
        distinct = pc.dictionary_encode(words)
        word = distinct.indices.to_numpy(zero_copy_only=False).astype(np.int64)
        return cls(distinct.dictionary.to_pylist(), word, at, len(text))

    def rows_by_word(self, rows: np.ndarray) -> dict[str, int]:
        """The rows holding each word, where value i stands for `rows[i]` rows."""
        value, word, _ = pair_counts(self.at, self.word, max(len(self.vocabulary), 1))
        held = np.zeros(len(self.vocabulary), dtype=np.int64)
        np.add.at(held, word, rows[value])
        return dict(zip(self.vocabulary, held.tolist(), strict=True))

    def bucket_sums(self, rows: np.ndarray, buckets: int) -> dict[str, list[int] | None]:
        """Over the rows (value i standing for `rows[i]` rows), each bucket's count of a row's words: its
        sum, the sum of its squares, and its least and largest value (None without rows)."""
        hashed = buckets_of(self.vocabulary, buckets)
        value, bucket, count = pair_counts(self.at, hashed[self.word], buckets)
        weight = rows[value]
        sums, squares, high = (np.zeros(buckets, dtype=np.int64) for _ in range(3))
        np.add.at(sums, bucket, weight * count)
        np.add.at(squares, bucket, weight * count * count)
        np.maximum.at(high, bucket, count)
        fewest = np.full(buckets, np.iinfo(np.int64).max)
        np.minimum.at(fewest, bucket, count)
        in_every_value = np.bincount(bucket, minlength=buckets) == self.values  # else some row counts 0
        empty = not self.values
        return {
            "sums": sums.tolist(),
            "squares": squares.tolist(),
            "low": None if empty else np.where(in_every_value, fewest, 0).tolist(),
            "high": None if empty else high.tolist(),
        }


def pair_counts(
    first: np.ndarray, second: np.ndarray, size: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each distinct pair (first, second), second below `size`, and how often it occurs."""
    pairs, counts = np.unique(first * size + second, return_counts=True)
    return pairs // size, pairs % size, counts


def bucket_counts(text: pa.Array, table: dict[str, int], buckets: int) -> np.ndarray:
    """Each value's count of words in each bucket (rows x buckets, float64), by the words' buckets in
    `table`; a word not in it counts nowhere."""
    words, at = value_words(text)
    found = pc.index_in(words, value_set=pa.array(list(table), pa.string()))
    known = found.is_valid().to_numpy(zero_copy_only=False)
    place = found.fill_null(0).to_numpy(zero_copy_only=False)[known]
    bucket = np.fromiter(table.values(), dtype=np.int64, count=len(table))[place]
    counts = np.bincount(at[known] * buckets + bucket, minlength=len(text) * buckets)
    return counts.reshape(len(text), buckets).astype(np.float64)
