"""Batch scoring without Flyte: a table streamed through a model bundle into parquet parts.

`plan_scoring` checks every input before anything is scored (the bundle and its format version, the
dataset's URI, every column the model reads, the first rows' values; `open_dataset` refuses parts whose
columns or kinds of types differ) and cuts the input into pieces: the files of a folder, and large
parquet files by row groups. `score_piece` streams one piece in record batches into its own part of the
output folder; `summarise` adds the pieces' label counts into a report. `score_dataset` runs the three
in one process; the scoring workflow maps `score_piece` over pods.
`split_metrics` (tasks/core/evaluation/split_metrics.py) streams a prepared split through the bundle the
same way, for the evaluation's report.

The model reads the raw columns its bundle's encoding reads (text, booleans, dates, missing values), or
a bundle's numeric features where it has no encoding, by the rules `Bundle.predict` applies to any table;
they alone are read by training's rules. The other columns pass through as they were read: a CSV's as
text, a parquet column as its parts hold it (integer widths that differ between parts widened).

Memory stays bounded by a record batch: a part holds the input's columns the model does not read as they
are (ids, the label), the predicted class label in `prediction`, and one probability column per class;
a row whose model outputs are not finite gets nulls there, and the metrics leave it out.

The plan marks the output folder as unfinished (`UNFINISHED`) and the report clears the mark: a rerun
into a folder that holds only an unfinished scoring's parts replaces them, and `score_dataset` removes
what it wrote when it fails.
"""
