"""`python -m benchmarks.serving_check --serving-venv DIR` (`make serving-check`): a bundle's MLflow model
served by a real `mlflow models serve` on 127.0.0.1, checked, and timed against onnxruntime in-process.

Writes a bundle of a seeded, untrained MLP over a table of numbers, categories, booleans and dates,
each with gaps, and its MLflow model (tasks/core/bundle/mlflow_model.py). `DIR` is a virtual
environment holding mlflow and onnxruntime and neither Flyte nor this project (make serving-check
installs it from deploy/serving-constraints.txt); the server runs from it, in a temporary folder, with
`--env-manager local`. Checks, each printed as passed or FAILED (the exit status is 1 if one fails):
- the serving environment cannot import flytekit nor this project's `tasks`;
- `POST /invocations` with `dataframe_split` rows as a client writes them (JSON null where missing,
  dates as ISO text) answers each row's label and probabilities as the bundle's predict does.
Figures: rows/s of 1-row and 1,024-row requests through the server against onnxruntime running the
bundle's model.onnx in this process on the same rows (its inputs built beforehand): the server's
overhead, HTTP, JSON and pandas included. Requests go to 127.0.0.1 only, a bounded number of them.
Then the bundle is published twice under a prefix (the first version promoted) and the prefix's Triton
repository is loaded by the tritonserver of the nvidia-pytriton wheel (benchmarks/triton_check.py).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections import Counter
from datetime import date, datetime, timedelta
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

from benchmarks.measure import Figure, alternating_best_rates, wait_until_answering
from benchmarks.triton_check import run_triton_checks

CLASSES = ["low", "mid", "high"]
COLUMNS = ["amount", "home city", "member", "joined"]
SIZES = (1, 1024)
FULL = {"requests": {1: 300, 1024: 20}, "rounds": 3}
SMOKE = {"requests": {1: 20, 1024: 2}, "rounds": 1}
START_SECONDS = 180
TRITON_ROWS = 256
ATOL = 1e-5  # float32 probabilities: the bundle's torch model against onnxruntime's kernels


def mixed_table(rows: int, seed: int) -> pa.Table:
    """Numbers, a category, a boolean and a date, each with gaps; the label follows the columns."""
    rng = np.random.default_rng(seed)
    missing = rng.random((4, rows)) < 0.1
    label = rng.integers(0, len(CLASSES), rows)
    cities = np.array(["paris", "oslo", "rome", "lima", "kyiv"])[(label + rng.integers(0, 3, rows)) % 5]
    joined = [date(1968, 6, 1) + timedelta(days=int(day)) for day in rng.integers(0, 20_000, rows)]
    return pa.table({
        "amount": pa.array(rng.normal(label * 3.0, 1.0) * 1e3, mask=missing[0]),
        "home city": pa.array(cities.tolist(), mask=missing[1]),
        "member": pa.array((rng.random(rows) < 0.3 + 0.2 * label).tolist(), mask=missing[2]),
        "joined": pa.array(joined, pa.date32(), mask=missing[3]),
        "label": np.asarray(CLASSES)[label],
    })  # fmt: skip


def write_mixed_bundle(folder: Path, table: pa.Table) -> str:
    """A seeded, untrained MLP over the table's encoded columns, written as a bundle (with its exports)."""
    import torch

    from tasks.core.bundle.manifest import BundleRecord
    from tasks.core.bundle.writing import write_bundle
    from tasks.core.data.column_kinds import propose_kinds
    from tasks.core.data.encoding import batch_stats
    from tasks.core.data.prepare import PreparedTable
    from tasks.core.data.scaling import ScalerStats
    from tasks.core.models.plugins import build, input_spec_for, mlp_spec
    from tasks.core.models.torch_models import save_torch_artifact
    from tasks.core.training.config import TrainConfig
    from tasks.core.training.records import Hardware, TrainingRun

    raw = table.select(COLUMNS)
    encoding = batch_stats(propose_kinds(raw.schema, sample=raw), raw).fit()
    encoded = encoding.transform(raw)
    scale = encoded.std(axis=0)
    counts = Counter(table.column("label").to_pylist())
    prepared = PreparedTable(
        feature_names=encoding.encoded_names(), label_column="label", class_labels=CLASSES,
        class_counts={label: counts[label] for label in CLASSES}, rows={"train": table.num_rows, "val": 0, "test": 0},
        scaler=ScalerStats(encoded.mean(axis=0).tolist(), np.where(scale > 0, scale, 1.0).tolist()),
        source="mixed.parquet", columns=COLUMNS, encoding=json.dumps(encoding.to_dict()),
    )  # fmt: skip
    spec = mlp_spec([64, 64])
    n_features = len(prepared.feature_names)
    torch.manual_seed(3)
    artifact = str(folder.parent / "model.pt")
    model = build(spec, n_features, len(CLASSES), "pytorch")
    save_torch_artifact(model, spec, input_spec_for(spec, n_features, len(CLASSES)), artifact)
    run = TrainingRun(
        "pytorch", "cpu", "cpu", 1, "gloo", "fp32", "single-process", [], 0.0, 0.0, TrainConfig(model=spec)
    )
    record = BundleRecord.of(prepared, run, Hardware("cpu", 1), data_fingerprint="0" * 32)
    return write_bundle(str(folder), artifact, record)


def request_rows(frame: pd.DataFrame) -> dict:
    """`dataframe_split` as a client writes it from plain values: null where missing, dates as ISO text."""

    def plain(value):
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return None
        if isinstance(value, date | datetime):
            return value.isoformat() if isinstance(value, datetime) else f"{value.isoformat()}T00:00:00"
        return value.item() if isinstance(value, np.generic) else value

    data = [[plain(value) for value in row] for row in frame.astype(object).itertuples(index=False)]
    return {"dataframe_split": {"columns": list(frame.columns), "data": data}}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Server:
    """`mlflow models serve` of `model` from the environment `venv`, on 127.0.0.1, in `folder`."""

    def __init__(self, venv: Path, model: Path, folder: Path):
        self.url = f"http://127.0.0.1:{free_port()}"
        port = self.url.rsplit(":", 1)[1]
        command = [str(venv / "bin" / "mlflow"), "models", "serve", "-m", str(model), "--env-manager", "local",
                   "-h", "127.0.0.1", "-p", port, "-w", "1"]  # fmt: skip
        self.log = (folder / "server.log").open("w")
        self.process = subprocess.Popen(
            command,
            cwd=folder,
            env=serving_environment(venv),
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def wait_ready(self) -> None:
        wait_until_answering(self.process, f"{self.url}/ping", START_SECONDS, "the server", self.tail)

    def invoke(self, body: bytes) -> dict:
        request = urllib.request.Request(
            f"{self.url}/invocations", data=body, headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=60) as answer:
                return json.loads(answer.read())
        except urllib.error.HTTPError as error:
            raise RuntimeError(f"HTTP {error.code}: {error.read().decode(errors='replace')[:2000]}") from None

    def tail(self) -> str:
        self.log.flush()
        return (Path(self.log.name).read_text(errors="replace"))[-3000:]

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)  # the server and its workers: a group of its own
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        self.log.close()


def serving_environment(venv: Path) -> dict[str, str]:
    """As an activated `venv`: the server starts uvicorn by name. No PYTHONPATH to this project."""
    environment = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    environment["PATH"] = f"{venv / 'bin'}{os.pathsep}{environment.get('PATH', '')}"
    environment["VIRTUAL_ENV"] = str(venv)
    return environment


def check_isolated(venv: Path, folder: Path) -> str:
    """The serving environment, run where the server runs, finds neither flytekit nor `tasks`."""
    probe = "import importlib.util as u; print([m for m in ('flytekit', 'tasks') if u.find_spec(m)])"
    found = subprocess.run([str(venv / "bin" / "python"), "-c", probe], cwd=folder, env=serving_environment(venv),
                           capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    if found != "[]":
        raise AssertionError(f"the serving environment imports {found}")
    return "the serving environment has neither flytekit nor this project's code"


def check_answers(server: Server, bundle, frame: pd.DataFrame) -> str:
    answer = server.invoke(json.dumps(request_rows(frame)).encode())
    served = pd.DataFrame(answer["predictions"])
    expected = bundle.predict_proba(frame)
    columns = [f"probability_{label}" for label in bundle.class_labels]
    if list(served.columns) != ["prediction", *columns]:
        raise AssertionError(f"the server answered the columns {list(served.columns)}")
    labels = bundle.labels(expected.argmax(axis=1))
    if served["prediction"].tolist() != labels.tolist():
        raise AssertionError("the served labels differ from the bundle's predict")
    difference = float(np.abs(served[columns].to_numpy(np.float32) - expected).max())
    if difference > ATOL:
        raise AssertionError(f"the served probabilities differ from the bundle's by {difference:.2e}")
    return (
        f"{len(frame):,} rows through POST /invocations: labels equal, probabilities within {difference:.1e} "
        f"of the bundle's ({Counter(labels.tolist())})"
    )


def throughput(
    server: Server, model_onnx: Path, encoding, frame: pd.DataFrame, settings: dict
) -> list[Figure]:
    import onnxruntime

    from tasks.core.bundle.raw_inputs import raw_feeds

    session = onnxruntime.InferenceSession(str(model_onnx), providers=["CPUExecutionProvider"])
    figures = []
    for rows in SIZES:
        part = frame.iloc[:rows]
        body = json.dumps(request_rows(part)).encode()
        feeds = raw_feeds(part, encoding)
        count = settings["requests"][rows]

        def served(body=body, count=count, rows=rows) -> float:
            start = time.perf_counter()
            for _ in range(count):
                server.invoke(body)
            return rows * count / (time.perf_counter() - start)

        def in_process(feeds=feeds, count=count, rows=rows) -> float:
            start = time.perf_counter()
            for _ in range(count):
                session.run(["probabilities"], feeds)
            return rows * count / (time.perf_counter() - start)

        server_rate, local_rate = alternating_best_rates(served, in_process, settings["rounds"])
        figures.append(
            Figure(
                f"mlflow serve: rows/s of {rows:,}-row requests, server vs onnxruntime in-process",
                server_rate,
                local_rate,
                "rows/s",
            )  # fmt: skip
        )
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--serving-venv", type=Path, default=Path(".venv-serving"))
    parser.add_argument("--smoke", action="store_true", help="few requests: exercises the harness")
    parser.add_argument("--keep", type=Path, help="write the bundle and its MLflow model here, and keep them")
    arguments = parser.parse_args()
    settings = SMOKE if arguments.smoke else FULL
    with tempfile.TemporaryDirectory(prefix="mixedml-serving-") as scratch:
        work = arguments.keep or Path(scratch)
        sys.exit(run_checks(arguments.serving_venv.resolve(), work, settings))


def run_checks(venv: Path, work: Path, settings: dict) -> int:
    from tasks.core.bundle.loading import load_bundle
    from tasks.core.bundle.mlflow_model import MLFLOW_FOLDER, write_mlflow_model

    work.mkdir(parents=True, exist_ok=True)
    bundle_dir = write_mixed_bundle(work / "bundle", mixed_table(2000, seed=0))
    note = write_mlflow_model(bundle_dir, str(work / MLFLOW_FOLDER))
    if note:
        print(f"FAILED: {note}")
        return 1
    bundle = load_bundle(bundle_dir)
    rows = mixed_table(1024, seed=1).drop_columns(["label"]).to_pandas()
    results, figures = [], []
    server = Server(venv, work / MLFLOW_FOLDER, work)
    try:
        started = time.perf_counter()
        server.wait_ready()
        results.append(("server start", f"answered /ping after {time.perf_counter() - started:.1f} s"))
        for name, check in (
            ("isolation", lambda: check_isolated(venv, work)),
            ("answers", lambda: check_answers(server, bundle, rows)),
        ):
            try:
                results.append((name, check()))
            except (AssertionError, RuntimeError) as error:
                results.append((name, f"FAILED: {error}"))
        figures = throughput(server, Path(bundle_dir) / "model.onnx", bundle.encoding, rows, settings)
    except RuntimeError as error:
        results.append(("server", f"FAILED: {error}"))
    finally:
        server.stop()
    results.extend(run_triton_checks(venv, work, bundle_dir, bundle, rows.iloc[:TRITON_ROWS], free_port))
    for name, detail in results:
        print(f"{name}: {detail if detail.startswith('FAILED') else 'passed: ' + detail}")
    for figure in figures:
        print(figure.line())
    return int(any(detail.startswith("FAILED") for _, detail in results))


if __name__ == "__main__":
    main()
