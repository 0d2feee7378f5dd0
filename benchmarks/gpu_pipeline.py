"""The GPU check's pipeline steps: `pyflyte run workflows/pipeline.py training_pipeline --target gpu` on
this machine's GPU, as a user runs it on a workstation, in a process of its own.

The other steps call the project's loop directly; these run the workflow itself, every task in one
local execution: preprocessing, the plan, training in the DDP worker the task starts, evaluation and
the bundle. Each run is judged by what it left:

- the bundle's manifest: the device it trained on (a CUDA device, never the CPU), the backend, the
  precision (bf16 where the GPU has it) and samples/s;
- the bundle itself, loaded onto the GPU and scoring the run's input table with the project's scorer;
- the training task's Deck: its utilisation chart holds the GPU's own series (NVML).

The embedded digits run is a check. The large table's run is a figure: its samples/s against the
project loop called directly, in this process, on the same prepared training split with the same
settings. A GPU machine without flytekit gets it from wheels built elsewhere (benchmarks/gpu_wheels.py).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from functools import cached_property
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import torch

from benchmarks.gpu_figures import GpuFigure, Sizes, expect, require_cuda, require_modules
from benchmarks.measure import REPO
from benchmarks.synthetic import write_table
from tasks.core.data.splits import SplitPaths
from tasks.core.evaluation.metrics import metrics_from_confusion
from tasks.core.models.plugins import mlp_spec
from tasks.core.training import torch_training
from tasks.core.training.config import TrainConfig

FLYTEKIT_HINT = (
    "the pipeline runs through pyflyte; on a machine without it, build the wheels with `make gpu-wheels` "
    "where pip reaches an index, carry .gpu-wheels, and `make gpu-check` installs them offline"
)
PIPELINE_FEATURES = 64  # the large table's width: 4M rows x 64 write and preprocess in under a minute
PIPELINE_EPOCHS = 2
RUN_TIMEOUT_S = 300  # a run that hangs fails its step, and the steps after it still run
MIN_ACCURACY = 0.9
LOCAL_MODELS = "MIXEDML_LOCAL_MODELS"  # where a local run writes its bundle (tasks/evaluate.py)
PLAN_LINE = re.compile(r"resource plan \((\w[\w ]*)\) for target gpu: (.+)")
GPU_SERIES = "GPU 0 %"  # the training Deck's utilisation series from NVML (tasks/plumbing/decks.py)


@dataclass
class PipelineRun:
    """One finished `pyflyte run` of the pipeline, with the folder it ran in."""

    work: Path
    output: str
    seconds: float

    @cached_property
    def bundle(self) -> Path:
        (bundle,) = (self.work / "models").iterdir()
        return bundle

    @cached_property
    def manifest(self) -> dict:
        return json.loads((self.bundle / "bundle.json").read_text())

    def plan(self) -> str:
        found = PLAN_LINE.search(self.output)
        return f"{found.group(2).strip()} ({found.group(1)})" if found else "no plan reported"

    def training_deck(self) -> str:
        """The HTML Deck the training task wrote ('' where none did)."""
        decks = [path.read_text() for path in (self.work / "tmp").rglob("deck.html")]
        return next((deck for deck in decks if "Learning curves" in deck), "")

    def prepared_splits(self) -> SplitPaths:
        """The preprocessing task's training and validation splits, as the training task read them: a
        folder holding a folder of parts per split (one part per piece the input was read in)."""
        prepared = sorted(
            folder.parent for folder in (self.work / "tmp").rglob("train") if (folder.parent / "val").is_dir()
        )
        expect(bool(prepared), f"no prepared splits under {self.work / 'tmp'}")
        train, val = prepared[0] / "train", prepared[0] / "val"
        names = pq.read_schema(min(train.glob("*.parquet"))).names
        label = self.manifest["label_column"]
        n_classes = len(self.manifest["class_labels"])
        return SplitPaths(str(train), str(val), [name for name in names if name != label], label, n_classes)


def pyflyte_run(work: Path, *inputs: str) -> PipelineRun:
    """`pyflyte run` of the training pipeline on the GPU target, its temporary files and bundle under `work`."""
    (work / "tmp").mkdir(parents=True), (work / "models").mkdir()
    command = [sys.executable, "-m", "flytekit.clis.sdk_in_container.pyflyte", "run",
               "workflows/pipeline.py", "training_pipeline", "--target", "gpu", *inputs]  # fmt: skip
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))  # for the DDP workers too
    env = {**os.environ, "PYTHONPATH": path, "TMPDIR": str(work / "tmp"), LOCAL_MODELS: str(work / "models"),
           "FLYTE_SDK_LOGGING_LEVEL": "20"}  # fmt: skip
    start = time.perf_counter()
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    output = done.stdout + done.stderr
    expect(done.returncode == 0, f"pyflyte run exited {done.returncode}:\n{output[-4000:]}")
    return PipelineRun(work, output, time.perf_counter() - start)


def gpu_accuracy(run: PipelineRun, table: str) -> tuple[float, float]:
    """The run's bundle, loaded onto the GPU, scoring `table` with its labels: (accuracy, rows/s)."""
    from tasks.core.scoring.piece import gpu_bundle, score_piece
    from tasks.core.scoring.plan import plan_scoring

    bundle = gpu_bundle(str(run.bundle))
    on_gpu = next(bundle.model.parameters()).is_cuda
    expect(on_gpu or not torch.cuda.is_available(), "the bundle's model did not load onto the GPU")
    plan = plan_scoring(
        str(run.bundle), table, str(run.work / "scored"), run.manifest["label_column"], bundle=bundle
    )
    start = time.perf_counter()
    results = [score_piece(plan.job, piece, bundle) for piece in plan.pieces]
    seconds = time.perf_counter() - start
    confusion = np.sum([np.array(result.confusion, dtype=np.int64) for result in results], axis=0)
    metrics = metrics_from_confusion(confusion, [str(label) for label in bundle.class_labels])
    return metrics.accuracy, sum(result.rows for result in results) / seconds


def judged(run: PipelineRun) -> dict:
    """What the run must show: it trained on the GPU, in bf16 where the GPU has it, and charted the GPU."""
    trained = run.manifest["run"]
    expect(trained["device_type"] == "cuda", f"the run trained on {trained['device_name']}, not the GPU")
    if torch.cuda.is_bf16_supported(including_emulation=False):
        expect(trained["precision"] == "bfloat16", f"the run trained in {trained['precision']}, not bfloat16")
    deck = run.training_deck()
    expect(bool(deck), "the training task wrote no Deck")
    expect(GPU_SERIES in deck, f"the training Deck has no '{GPU_SERIES}' series (NVML telemetry)")
    accuracy = run.manifest["metrics"]["accuracy"]
    expect(accuracy >= MIN_ACCURACY, f"test accuracy {accuracy:.3f} < {MIN_ACCURACY}")
    return trained


def described(run: PipelineRun, trained: dict) -> str:
    config = trained["config"]
    return (
        f"plan {run.plan()}; trained on {trained['device_name']} x{trained['world_size']} "
        f"({trained['backend']}, {trained['precision']}, batch {config['batch_size']} in "
        f"{config['grad_accum_steps']} accumulation step(s), rows {config['data_placement']}) at "
        f"{trained['samples_per_second']:,.0f} samples/s; test accuracy {run.manifest['metrics']['accuracy']:.3f}; "
        f"Deck charts '{GPU_SERIES}'; run {run.seconds:.0f} s"
    )


def embedded_digits(root: Path) -> str:
    """The pipeline's default run (the embedded digits) on the GPU: a check."""
    require_cuda()
    require_modules(("flytekit", FLYTEKIT_HINT))
    from tasks.core.data.prepare import write_embedded_digits

    run = pyflyte_run(root / "pipeline-digits")
    trained = judged(run)
    accuracy, rate = gpu_accuracy(run, write_embedded_digits(str(root / "pipeline-digits")))
    expect(
        accuracy >= MIN_ACCURACY, f"the bundle scored on the GPU: accuracy {accuracy:.3f} < {MIN_ACCURACY}"
    )
    return (
        f"{described(run, trained)}; bundle scored on the GPU: accuracy {accuracy:.3f} at {rate:,.0f} rows/s"
    )


def large_table_config(sizes: Sizes) -> TrainConfig:
    """The loop figure's model, batch and precision, for a few epochs."""
    hidden = list(sizes.hidden)
    return TrainConfig(
        epochs=PIPELINE_EPOCHS, batch_size=sizes.batch, model=mlp_spec(hidden), precision="bf16"
    )


def large_table(root: Path, sizes: Sizes) -> list[GpuFigure]:
    """The pipeline on `sizes.pipeline_rows` rows: samples/s against the project loop on the same split."""
    require_cuda()
    require_modules(("flytekit", FLYTEKIT_HINT))
    table = write_table(str(root / "pipeline-table.parquet"), sizes.pipeline_rows, PIPELINE_FEATURES)
    config = large_table_config(sizes)
    data = json.dumps({"dataset": table, "label_column": "label"})
    run = pyflyte_run(
        root / "pipeline-large", "--data", data, "--hyperparameters", json.dumps(asdict(config))
    )
    trained = judged(run)
    direct = torch_training.train(config, run.prepared_splits()).run
    accuracy, rate = gpu_accuracy(run, table)
    name = f"pyflyte run, {sizes.pipeline_rows:,} x {PIPELINE_FEATURES}: {described(run, trained)}"
    return [
        GpuFigure(f"{name}: samples/s vs the project loop called directly on its training split",
                  trained["samples_per_second"], direct.samples_per_second, "samples/s", low=0.9),
        GpuFigure(f"{name}: its bundle scoring the whole table on the GPU ({rate:,.0f} rows/s), accuracy "
                  "vs the run's test accuracy", accuracy, run.manifest["metrics"]["accuracy"], "", low=0.99),
    ]  # fmt: skip
