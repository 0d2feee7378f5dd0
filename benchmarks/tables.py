"""Realistic mixed tables: the pipeline's test accuracy (or a regression's test R²) against scikit-learn's
gradient boosting, and the preprocessing of a large mixed table against pyarrow's read and write of the
same file.

Two seeded tables with a learnable, noisy signal (nothing is downloaded): a customer-churn table (parquet,
2 classes) and a loan-outcome table (CSV, 3 ordered classes). Each has categories with a long tail of rare
values, numbers with gaps, a boolean with gaps and a timestamp, and the signal depends on all of them.

The pipeline side is what a user runs: `prepare_dataset`, the torch training loop (one process, CPU, the
default MLP) and the model bundle scoring the raw test split. `HistGradientBoostingClassifier`, with its
native categorical support, trains on the same train rows (the split `prepare_dataset` made, from the same
functions) and scores the same raw test rows that preprocessing wrote.

Two regression tables, decided as regressions by `problem_type="auto"`: a home-sales table (parquet, the
sale price from the same kinds of mixed columns) and scikit-learn's bundled diabetes table (442 rows, 10
numbers; no download). Their figure is the test R² of the pipeline against `HistGradientBoostingRegressor`
on the same split; the goal is within 0.05 of it.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv
import pyarrow.parquet as pq

from benchmarks.measure import REPO, Figure
from tasks.core.data.assignment import SPLITS, SplitConfig
from tasks.core.data.column_kinds import BOOLEAN, CATEGORICAL, DATE, MICROS_PER_DAY, NUMERIC, Place, canonical
from tasks.core.data.kind_values import MISSING_INSTANT
from tasks.core.data.prepare import PreparedSplits, RowSplit, prepare_dataset
from tasks.core.training.config import TrainConfig

LABEL = "label"
CHUNK_ROWS = 250_000
SPLIT = SplitConfig(seed=0)
START, END = np.datetime64("2019-01-01", "s"), np.datetime64("2026-01-01", "s")
MEASURE_IN_SMALL_PROCESS = (
    "import json, sys; from benchmarks.measure import child_peak_rss_gib; "
    "print(json.dumps(child_peak_rss_gib(*sys.argv[1:])))"
)
HGB_CATEGORIES = 254  # the most frequent train values kept apart; HGB bins at most 255 categories

# The column kinds HistGradientBoosting reads as they are (`hgb_kind`).
HGB_KINDS = (NUMERIC, BOOLEAN, CATEGORICAL, DATE)


def long_tail(rng: np.random.Generator, n: int, size: int, exponent: float) -> np.ndarray:
    """Indices into `size` values, Zipf-distributed: a few common values and many rare ones."""
    weights = 1.0 / np.arange(1, size + 1) ** exponent
    return rng.choice(size, size=n, p=weights / weights.sum())


def gaps(rng: np.random.Generator, n: int, share: float) -> np.ndarray:
    return rng.random(n) < share


def text(names: list[str], indices: np.ndarray, missing: np.ndarray) -> pa.Array:
    return pc.take(pa.array(names), pa.array(indices, mask=missing))


def number(values: np.ndarray, missing: np.ndarray) -> pa.Array:
    return pa.array(np.where(missing, np.nan, values).astype(np.float64))


def flag(values: np.ndarray, missing: np.ndarray) -> pa.Array:
    return pa.array(values, mask=missing)


def instants(rng: np.random.Generator, n: int) -> np.ndarray:
    seconds = rng.integers(0, int((END - START).astype(np.int64)), size=n)
    return START + seconds.astype("timedelta64[s]")


def timestamp(values: np.ndarray, missing: np.ndarray) -> pa.Array:
    return pa.array(values, type=pa.timestamp("s"), mask=missing)


def month_of(values: np.ndarray) -> np.ndarray:
    return values.astype("datetime64[M]").astype(np.int64) % 12 + 1


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


class Churn:
    """Customers of a subscription service: churned or stayed."""

    plans = ["basic", "standard", "premium", "family", "student"]
    contracts = ["month-to-month", "one-year", "two-year"]

    def __init__(self, seed: int):
        world = np.random.default_rng(seed)
        self.regions = [f"region-{i:04d}" for i in range(3000)]
        self.region_effect = world.normal(0.0, 0.6, len(self.regions))

    def chunk(self, rng: np.random.Generator, n: int) -> pa.Table:
        plan = rng.choice(len(self.plans), size=n, p=[0.35, 0.3, 0.15, 0.15, 0.05])
        contract = rng.choice(3, size=n, p=[0.5, 0.3, 0.2])
        region = long_tail(rng, n, len(self.regions), 1.1)
        tenure = np.clip(rng.gamma(2.0, 15.0, n), 0, 120).round()
        charges = 25 + 12 * plan + rng.normal(0, 8, n)
        calls = rng.poisson(1.2, n).astype(np.float64)
        autopay = rng.random(n) < 0.55
        signup = instants(rng, n)
        logit = (
            np.array([0.6, 0.0, -0.5, -0.3, 0.8])[plan]
            + np.array([0.9, -0.4, -1.2])[contract]
            + self.region_effect[region]
            + 1.2 * (tenure < 6)
            - 0.02 * tenure
            + 0.03 * (charges - 50)
            + 0.45 * calls * (1 + (plan == 2))  # premium customers who need help leave
            - 0.8 * autopay
            + 0.7 * np.isin(month_of(signup), [11, 12])  # promotional sign-ups
            - 0.6
        )
        churned = rng.random(n) < sigmoid(logit)
        return pa.table({
            "plan": text(self.plans, plan, gaps(rng, n, 0.03)),
            "contract": text(self.contracts, contract, gaps(rng, n, 0.02)),
            "region": text(self.regions, region, gaps(rng, n, 0.05)),
            "tenure_months": number(tenure, gaps(rng, n, 0.12)),
            "monthly_charges": number(charges.round(2), gaps(rng, n, 0.04)),
            "support_calls": number(calls, gaps(rng, n, 0.08)),
            "autopay": flag(autopay, gaps(rng, n, 0.06)),
            "signed_up": timestamp(signup, gaps(rng, n, 0.04)),
            LABEL: text(["stayed", "churned"], churned.astype(np.int64), np.zeros(n, bool)),
        })  # fmt: skip


class Loans:
    """Personal loans: repaid, late or defaulted, ordered by a latent risk."""

    purposes = ["debt_consolidation", "credit_card", "home_improvement", "car", "medical", "small_business",
                "wedding", "moving", "vacation", "education", "renewable_energy", "other"]  # fmt: skip
    outcomes = ["repaid", "late", "default"]

    def __init__(self, seed: int):
        world = np.random.default_rng(seed + 1)
        self.employers = [f"employer-{i:05d}" for i in range(8000)]
        self.employer_effect = world.normal(0.0, 0.5, len(self.employers))
        self.states = [f"S{i:02d}" for i in range(50)]
        self.state_effect = world.normal(0.0, 0.25, len(self.states))
        self.purpose_effect = world.normal(0.0, 0.4, len(self.purposes))

    def chunk(self, rng: np.random.Generator, n: int) -> pa.Table:
        purpose = long_tail(rng, n, len(self.purposes), 1.0)
        employer = long_tail(rng, n, len(self.employers), 1.05)
        state = long_tail(rng, n, len(self.states), 0.6)
        income = rng.lognormal(10.9, 0.5, n)
        amount = rng.lognormal(9.3, 0.7, n)
        credit = np.clip(rng.normal(690, 60, n), 300, 850).round()
        owner = rng.random(n) < 0.4
        applied = instants(rng, n)
        year = applied.astype("datetime64[Y]").astype(np.int64) + 1970
        risk = (
            1.1 * np.log(amount / income * 10)
            - 0.018 * (credit - 690)
            + self.purpose_effect[purpose]
            + self.employer_effect[employer]
            + self.state_effect[state]
            - 0.5 * owner
            + 0.8 * (year == 2020)  # a bad year to borrow
            + rng.logistic(0.0, 0.8, n)
        )
        outcome = np.digitize(risk, [1.4, 3.1])  # about 60% repaid, 25% late, 15% default
        return pa.table({
            "purpose": text(self.purposes, purpose, gaps(rng, n, 0.02)),
            "employer": text(self.employers, employer, gaps(rng, n, 0.10)),
            "state": text(self.states, state, gaps(rng, n, 0.01)),
            "annual_income": number(income.round(), gaps(rng, n, 0.10)),
            "loan_amount": number(amount.round(), gaps(rng, n, 0.02)),
            "credit_score": number(credit, gaps(rng, n, 0.07)),
            "home_owner": flag(owner, gaps(rng, n, 0.05)),
            "applied_at": timestamp(applied, gaps(rng, n, 0.03)),
            LABEL: text(self.outcomes, outcome, np.zeros(n, bool)),
        })  # fmt: skip


def write_chunks(
    path: str, rows: int, make: Callable[[np.random.Generator, int], pa.Table], seed: int
) -> str:
    """`rows` rows in chunks, as parquet or, where `path` ends in .csv, as CSV."""
    rng = np.random.default_rng(seed)
    writer = None
    try:
        for start in range(0, rows, CHUNK_ROWS):
            chunk = make(rng, min(CHUNK_ROWS, rows - start))
            if writer is None:
                csv = path.endswith(".csv")
                writer = pcsv.CSVWriter(path, chunk.schema) if csv else pq.ParquetWriter(path, chunk.schema)
            writer.write_table(chunk)
    finally:
        if writer is not None:
            writer.close()
    return path


def write_churn(path: str, rows: int, seed: int = 0) -> str:
    return write_chunks(path, rows, Churn(seed).chunk, seed)


def write_loans(path: str, rows: int, seed: int = 0) -> str:
    return write_chunks(path, rows, Loans(seed).chunk, seed)


class Homes:
    """Home sales: the sale price, from the home's kind, neighbourhood, size, age, garden and sale date."""

    kinds = ["flat", "terraced", "semi-detached", "detached", "bungalow"]

    def __init__(self, seed: int):
        world = np.random.default_rng(seed + 2)
        self.neighbourhoods = [f"hood-{i:04d}" for i in range(2000)]
        self.neighbourhood_effect = world.normal(0.0, 0.3, len(self.neighbourhoods))

    def chunk(self, rng: np.random.Generator, n: int) -> pa.Table:
        kind = rng.choice(len(self.kinds), size=n, p=[0.35, 0.25, 0.2, 0.12, 0.08])
        hood = long_tail(rng, n, len(self.neighbourhoods), 1.0)
        area = rng.lognormal(4.4, 0.35, n)  # square metres
        rooms = np.clip((area / 25 + rng.normal(0, 0.8, n)).round(), 1, 12)
        age = np.clip(rng.gamma(2.0, 18.0, n), 0, 150).round()
        garden = rng.random(n) < 0.5
        sold = instants(rng, n)
        years = (sold - START).astype(np.int64) / (365.25 * 86_400)
        log_price = (
            12.0
            + 0.9 * np.log(area / 80)
            + np.array([-0.15, 0.0, 0.1, 0.3, 0.05])[kind]
            + self.neighbourhood_effect[hood]
            + 0.02 * rooms
            - 0.003 * age
            + 0.08 * garden
            + 0.04 * years  # prices rise over the years
            + rng.normal(0.0, 0.12, n)
        )
        return pa.table({
            "kind": text(self.kinds, kind, gaps(rng, n, 0.02)),
            "neighbourhood": text(self.neighbourhoods, hood, gaps(rng, n, 0.05)),
            "area_m2": number(area.round(1), gaps(rng, n, 0.06)),
            "rooms": number(rooms, gaps(rng, n, 0.05)),
            "age_years": number(age, gaps(rng, n, 0.10)),
            "garden": flag(garden, gaps(rng, n, 0.05)),
            "sold_at": timestamp(sold, gaps(rng, n, 0.03)),
            LABEL: pa.array(np.exp(log_price).round(-2)),  # whole hundreds: many distinct whole numbers
        })  # fmt: skip


def write_homes(path: str, rows: int, seed: int = 0) -> str:
    return write_chunks(path, rows, Homes(seed).chunk, seed)


def write_diabetes(path: str, rows: int = 0, seed: int = 0) -> str:
    """scikit-learn's bundled diabetes table, whatever `rows` asks: it has 442."""
    from sklearn.datasets import load_diabetes

    frame = load_diabetes(as_frame=True).frame.rename(columns={"target": LABEL})
    pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), path)
    return path


TABLES = {"churn": ("churn.parquet", write_churn), "loans": ("loans.csv", write_loans)}
REGRESSION_TABLES = {
    "homes": ("homes.parquet", write_homes),
    "diabetes": ("diabetes.parquet", write_diabetes),
}


def pipeline_accuracy(prepared: PreparedSplits, work: Path, config: TrainConfig) -> float:
    """Train the torch loop in this process, then score the raw test split through the model bundle."""
    from tasks.core.bundle.loading import load_bundle
    from tasks.core.bundle.manifest import BundleRecord
    from tasks.core.bundle.writing import write_bundle
    from tasks.core.evaluation.metrics import classification_metrics
    from tasks.core.training.records import Hardware
    from tasks.core.training.torch_training import train

    artifact = str(work / "model.pt")
    run = train(config, prepared.split_paths(), artifact).run
    record = BundleRecord.of(prepared.table, run, Hardware("cpu", 1), data_fingerprint="")
    folder = write_bundle(str(work / "bundle"), artifact, record)
    test = pq.read_table(prepared.paths["test"])
    predicted = load_bundle(folder).predict_codes(test)
    labels = prepared.table.class_labels
    return classification_metrics(test.column(LABEL).to_numpy(), predicted, labels).accuracy


def pipeline_r2(prepared: PreparedSplits, work: Path, config: TrainConfig) -> float:
    """`pipeline_accuracy` for a regression: the test R² of the bundle's numbers on the raw test split."""
    from sklearn.metrics import r2_score

    from tasks.core.bundle.loading import load_bundle
    from tasks.core.bundle.manifest import BundleRecord
    from tasks.core.bundle.writing import write_bundle
    from tasks.core.training.records import Hardware
    from tasks.core.training.torch_training import train

    artifact = str(work / "model.pt")
    run = train(config, prepared.split_paths(), artifact).run
    record = BundleRecord.of(prepared.table, run, Hardware("cpu", 1), data_fingerprint="")
    folder = write_bundle(str(work / "bundle"), artifact, record)
    test = pq.read_table(prepared.paths["test"])
    return float(r2_score(test.column(LABEL).to_numpy(), load_bundle(folder).predict_numbers(test)))


def hgb_features(columns: dict[str, str], table: pa.Table, vocabularies: dict[str, list[str]]):
    """The columns as HGB reads them: numbers and booleans with NaN gaps, categories as codes of the
    train vocabulary (rarer values share one code, a gap is NaN), dates as days, month and weekday."""
    blocks, categorical = [], []
    for name, kind in columns.items():
        values = canonical(kind, table.column(name), Place(name))
        if kind == CATEGORICAL:
            blocks.append(category_codes(values, vocabularies[name])[:, None])
            categorical.append(True)
        elif kind == DATE:
            blocks.append(date_parts(values))
            categorical += [False] * 3
        else:
            blocks.append(np.asarray(values, np.float64)[:, None])
            categorical.append(False)
    return np.column_stack(blocks), np.array(categorical)


def category_codes(values: pa.Array, vocabulary: list[str]) -> np.ndarray:
    found = pc.index_in(values, value_set=pa.array(vocabulary, pa.string()))
    codes = found.fill_null(len(vocabulary)).to_numpy(zero_copy_only=False).astype(np.float64)
    codes[values.is_null().to_numpy(zero_copy_only=False)] = np.nan
    return codes


def date_parts(micros: np.ndarray) -> np.ndarray:
    missing = micros == MISSING_INSTANT
    days = np.where(missing, np.nan, micros / MICROS_PER_DAY)
    month = month_of(np.where(missing, 0, micros).astype("datetime64[us]")).astype(np.float64)
    weekday = ((micros // MICROS_PER_DAY + 3) % 7).astype(np.float64)  # 1970-01-01 was a Thursday
    return np.column_stack([days, np.where(missing, np.nan, month), np.where(missing, np.nan, weekday)])


def train_vocabularies(columns: dict[str, str], train: pa.Table) -> dict[str, list[str]]:
    vocabularies = {}
    for name, kind in columns.items():
        if kind == CATEGORICAL:
            counts = pc.value_counts(canonical(kind, train.column(name), Place(name))).to_pylist()
            ranked = sorted(
                (c for c in counts if c["values"] is not None), key=lambda c: (-c["counts"], c["values"])
            )
            vocabularies[name] = [c["values"] for c in ranked[:HGB_CATEGORIES]]
    return vocabularies


def train_rows(data: str, prepared: PreparedSplits, label: str = LABEL) -> tuple[pa.Table, np.ndarray]:
    """The raw train rows and their class codes (a regression's values): the split `prepare_dataset`
    made, by its own functions."""
    import pyarrow.dataset as ds

    from tasks.core.data.labels import clean_labels, scan_labels
    from tasks.core.data.reading import open_dataset

    dataset = open_dataset(data, label)
    from_csv = isinstance(dataset.format, ds.CsvFileFormat)
    labels = clean_labels(scan_labels(dataset, data, label), data, label, from_csv)
    rows = RowSplit.of(labels, data, label, prepared.table.split or SPLIT)
    train = rows.assignment == SPLITS.index("train")
    if rows.class_labels != prepared.table.class_labels or train.sum() != prepared.table.rows["train"]:
        raise AssertionError("the split made here is not the one preprocessing made")
    return dataset.to_table(columns=prepared.table.columns).filter(pa.array(train)), rows.codes[train]


def hgb_score(data: str, prepared: PreparedSplits, label: str = LABEL) -> float:
    """HistGradientBoosting (native categories) on the raw train rows of `prepared`'s split, scored on
    its raw test rows: accuracy for classes, R² for numbers."""
    from sklearn.ensemble import HistGradientBoostingClassifier, HistGradientBoostingRegressor

    columns = {c.name: hgb_kind(c.kind) for c in prepared.table.fitted_encoding().columns}
    train, targets = train_rows(data, prepared, label)
    vocabularies = train_vocabularies(columns, train)
    features, categorical = hgb_features(columns, train, vocabularies)
    regression = prepared.table.target.regression
    kind = HistGradientBoostingRegressor if regression else HistGradientBoostingClassifier
    model = kind(categorical_features=categorical, random_state=0).fit(features, targets)
    test = pq.read_table(prepared.paths["test"])
    return float(model.score(hgb_features(columns, test, vocabularies)[0], test.column(label).to_numpy()))


def hgb_kind(kind: str) -> str:
    """The kind HistGradientBoosting reads a column as: its own where it reads it (HGB_KINDS), else
    categories of its most frequent values (free text), so a kind the pipeline learns to read needs no
    change here."""
    return kind if kind in HGB_KINDS else CATEGORICAL


def r2_figure(work: Path, name: str, rows: int, config: TrainConfig) -> Figure:
    file, write = REGRESSION_TABLES[name]
    folder = work / f"table-{name}"
    folder.mkdir()
    data = write(str(folder / file), rows)
    prepared = prepare_dataset(data, LABEL, str(folder / "prepared"), SPLIT)
    if not prepared.table.target.regression:
        raise AssertionError(f"{name}: problem_type auto did not decide a regression")
    ours = pipeline_r2(prepared, folder, config)
    table_rows = sum(prepared.table.rows.values())
    return Figure(f"tables: {name} ({file}, {table_rows:,} rows) test R², pipeline MLP ({config.epochs} epochs) "
                  "vs HistGradientBoostingRegressor (native categories), same split", ours, hgb_score(data, prepared),
                  "R²", "within 0.05 of the baseline")  # fmt: skip


def accuracy_figure(work: Path, name: str, rows: int, config: TrainConfig) -> Figure:
    file, write = TABLES[name]
    folder = work / f"table-{name}"
    folder.mkdir()
    data = write(str(folder / file), rows)
    prepared = prepare_dataset(data, LABEL, str(folder / "prepared"), SPLIT)
    ours = pipeline_accuracy(prepared, folder, config)
    return Figure(f"tables: {name} ({file}, {rows:,} rows) test accuracy, pipeline MLP ({config.epochs} epochs) "
                  "vs HistGradientBoosting (native categories), same split", ours, hgb_score(data, prepared),
                  "", "ratio >= 0.95")  # fmt: skip


def throughput_figures(work: Path, sizes: tuple[int, int]) -> list[Figure]:
    """Preprocessing the churn table (text, timestamp, numbers with gaps) against pyarrow's read and write."""
    results = {}
    for rows in sizes:
        data = write_churn(str(work / f"mixed-{rows}.parquet"), rows)
        for mode in ("ours", "floor"):
            results[rows, mode] = child_run(data, mode, str(work / f"mixed-{mode}-{rows}"))
    small, large = sizes
    growth = {mode: results[large, mode]["peak_rss_gib"] / results[small, mode]["peak_rss_gib"]
              for mode in ("ours", "floor")}  # fmt: skip
    ours, floor = results[large, "ours"], results[large, "floor"]
    return [
        Figure(f"tables: preprocess throughput, mixed table at {large:,} rows", large / ours["seconds"],
               large / floor["seconds"], "rows/s", "ratio >= 0.5 of pyarrow read+write"),
        Figure(f"tables: preprocess rows per CPU second (whole child process), mixed table at {large:,} rows",
               large / ours["cpu_seconds"], large / floor["cpu_seconds"], "rows/s"),
        Figure(f"tables: preprocess peak RSS growth, mixed table {small:,} -> {large:,} rows "
               f"({large // small}x data), vs pyarrow read+write", growth["ours"], growth["floor"], "x",
               "preprocessing's growth <= 1.5x"),
        Figure(f"tables: preprocess peak RSS, mixed table at {large:,} rows", ours["peak_rss_gib"],
               floor["peak_rss_gib"], "GiB"),
    ]  # fmt: skip


def child_run(data: str, mode: str, out: str) -> dict:
    """`preprocess_bench`'s result in a child process, with its peak RSS and its CPU seconds (imports
    included: other jobs on a shared machine stretch the wall far more than the CPU a run needs).

    The child is started from a small process of its own: Linux carries a process's peak RSS over into
    the program it execs, so a child of this process (torch loaded, models trained) would report at
    least this process's peak."""
    before = children_cpu_seconds()
    run = subprocess.run([sys.executable, "-c", MEASURE_IN_SMALL_PROCESS, "benchmarks.preprocess_bench", data,
                          mode, out], cwd=REPO, capture_output=True, text=True, check=True)  # fmt: skip
    return json.loads(run.stdout.strip().splitlines()[-1]) | {"cpu_seconds": children_cpu_seconds() - before}


def children_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def tables(work: Path, rows: int, config: TrainConfig, sizes: tuple[int, int]) -> list[Figure]:
    return accuracy_figures(work, rows, config) + throughput_figures(work, sizes)


def accuracy_figures(work: Path, rows: int, config: TrainConfig) -> list[Figure]:
    """Both models train on one thread: on a busy machine two threads each spin against other jobs
    (100 times slower here), and accuracy does not depend on the thread count."""
    import torch
    from threadpoolctl import threadpool_limits

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with threadpool_limits(1):
            classes = [accuracy_figure(work, name, rows, config) for name in TABLES]
            return classes + [r2_figure(work, name, rows, config) for name in REGRESSION_TABLES]
    finally:
        torch.set_num_threads(threads)
