from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

# Two test workers share the cores with the processes they start (pipelines, DDP workers, pods): one
# OpenMP thread per process keeps their thread pools from spinning against each other, which cost
# about a tenth of the suite's CPU time. Set before torch loads the OpenMP runtime, which reads it once;
# the processes the tests start inherit it.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import pandas as pd
import pytest

from tasks.core.models.plugins import ModelSpec, mlp_spec
from tasks.core.training.config import TrainConfig


@dataclass
class SessionTmpdir:
    root: str
    outer: str | None  # TMPDIR before the session
    failed: bool = False


SESSION_TMPDIR = pytest.StashKey[SessionTmpdir]()

PASSED = (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED)


def pytest_configure(config):
    """One temporary root per session, which every process the tests start inherits through TMPDIR.

    flytekit makes a sandbox folder in the temporary root for each process that imports it and leaves
    the folder behind, as torch elastic does for each launch, and a local workflow run keeps its outputs
    there: a full session left about a thousand folders and gigabytes behind, enough to fill a disk over
    a few runs. The root goes when the session passes and stays, named, for a look when it fails.
    """
    if hasattr(config, "workerinput"):  # a parallel session's worker: its controller set the root
        return
    outer = os.environ.get("TMPDIR")
    root = os.environ["TMPDIR"] = tempfile.mkdtemp(prefix="mixedml-tests-")
    os.environ["MIXEDML_LOCAL_MODELS"] = os.path.join(
        root, "models"
    )  # local runs' bundles (tasks/evaluate.py)
    tempfile.tempdir = None  # read TMPDIR again
    config.stash[SESSION_TMPDIR] = SessionTmpdir(root, outer)


def pytest_sessionfinish(session, exitstatus):
    if SESSION_TMPDIR in session.config.stash:
        session.config.stash[SESSION_TMPDIR].failed = exitstatus not in PASSED


def pytest_unconfigure(config):
    if SESSION_TMPDIR not in config.stash:
        return
    tmpdir = config.stash[SESSION_TMPDIR]
    if tmpdir.failed:
        print(f"\nThe failed session's temporary files are kept in {tmpdir.root}")
    else:
        shutil.rmtree(tmpdir.root, ignore_errors=True)
    if tmpdir.outer is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = tmpdir.outer
    tempfile.tempdir = None


def blobs_frame(n_rows: int = 300, n_features: int = 4, n_classes: int = 3, seed: int = 0) -> pd.DataFrame:
    """Well-separated Gaussian blobs: a table any working classifier learns."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, n_classes, size=n_rows)
    centers = rng.normal(scale=6.0, size=(n_classes, n_features))
    features = centers[labels] + rng.normal(size=(n_rows, n_features))
    frame = pd.DataFrame(features, columns=[f"f{i}" for i in range(n_features)])
    frame["species"] = np.array(["setosa", "versicolor", "virginica", "other"])[labels % 4]
    return frame


# Tests that read one shared run stay in one worker of a parallel session (`make test` runs two), so
# that the run happens once: fixture -> the group its users share.
SHARED_RUNS = {
    "comparison_run": "comparison",
    "prepared_by_a_pod": "pods",
    "flyte_package": "pods",  # the pods run the package's tasks; the deploy and package checks read it
    "scheduled_run_on_a_users_csv": "scheduled",
    "two_rank_results": "ddp",
    "default_digits_run": "digits",
    "diabetes_run": "diabetes",
    "scoring_bundle": "scoring",  # the batch scoring tests' bundle: a scorer without flytekit reads it too
    "raw_row_bundles": "raw_rows",  # exports over raw columns: answered alike without flytekit too
    "mlflow_bundle": "mlflow",  # a bundle's MLflow model: answering without the project too
}


# Fixtures that train a model (seconds each): the tests using them are `slow`, so that `make test-fast`
# stays a quick loop over the unit folder.
TRAINING_FIXTURES = {
    "torch_bundle", "keras_bundle", "torch_export", "keras_export", "two_bundles", "bundle_folder", "cpu_profile",
    "bundle",
}  # fmt: skip


# The groups and tests that take longest, longest first: a parallel session hands out work in
# collection order, so these start first and the short tests fill in around them instead of trailing
# one of them.
LONGEST_FIRST = ["readme", "pods", "test_smoke_orchestration_prints_every_figure_with_a_ratio", "digits",
                 "comparison", "test_killed_and_resumed_run_matches_an_uninterrupted_run",
                 "test_smoke_loops_print_every_figure_with_a_ratio",
                 "test_sigterm_saves_the_step_reached_and_the_retry_trains_the_rest",
                 "test_mirrored_strategy_with_two_logical_cpu_devices", "scheduled", "scoring", "raw_rows", "ddp",
                 "imports", "mlflow"]  # fmt: skip


# `make test` proves each path once: the unit folder, one local run of the default pipeline, of a
# scheduled run on a user's CSV and of two DDP ranks, and the package as a cluster reads it. The
# scenarios built on those paths take minutes of CPU between them: `make test-heavy` (and CI, after
# `make test`) runs them. The paths are from the tests folder.
HEAVY_MODULES = {
    "integration/test_readme_commands.py",  # every README command, a real hardware_comparison among them
    "integration/test_benchmarks.py",  # the benchmark groups at smoke sizes
    "integration/test_retries.py",  # pods killed mid-epoch and retried from their checkpoints
    "integration/test_pod_execution.py",  # preprocess, train and evaluate as pods of the package
    "integration/test_tf_accelerator_guard.py",  # TensorFlow pods on nodes without their accelerator
    "integration/test_accelerators.py",  # the torch task as a pod on a node without its GPU
    "integration/test_streaming_ddp.py",  # two DDP ranks streaming against device-resident rows
    "integration/test_checkpoint.py",  # runs killed and resumed, against uninterrupted ones
    "integration/test_tuning.py",  # a 4-trial study end to end: five training runs, evaluation, bundle
    "integration/test_ddp_overlap.py",  # DDP's overlapped reduction: guarded steps, an OOM and its retry
    "integration/test_collective_oom.py",  # one rank's OOM dropped on every rank
    "integration/test_preemption.py",  # a preemption notice on one DDP rank
    "integration/test_tf_preemption.py",  # a SIGTERM during Keras training and the retry
    "integration/test_model_failures.py",  # a user's model failing in a DDP rank
    "integration/test_regression.py",  # regression workflow runs, torch and TensorFlow
    "integration/test_divergence.py",  # a diverging DDP rank, and the training task it fails
    "integration/test_best_epoch_ddp.py",  # early stopping and the best epoch across two DDP ranks
    "integration/test_tf_mirrored.py",  # Keras mirrored over two logical CPU devices
    "unit/benchmarks/test_gpu_check.py",  # the GPU check's logic, on CPU
    "unit/benchmarks/test_gpu_trials.py",  # the GPU check's trials sharing a GPU, worker processes on CPU
    "integration/test_gpu_check.py",  # the GPU check's harness and its DDP steps, in processes of their own
    "integration/test_gpu_pipeline.py",  # the GPU check's pyflyte run of the pipeline, on CPU
}
# Shared runs (`SHARED_RUNS`) whose every reader is heavy: the hardware comparison (a CNN through
# both frameworks) and the Decks it writes.
HEAVY_GROUPS = {"comparison"}
TESTS = Path(__file__).parent


def is_heavy(item: pytest.Item) -> bool:
    path = Path(str(item.fspath))
    in_module = path.is_relative_to(TESTS) and path.relative_to(TESTS).as_posix() in HEAVY_MODULES
    groups = {group for fixture, group in SHARED_RUNS.items() if fixture in getattr(item, "fixturenames", ())}
    return in_module or bool(groups & HEAVY_GROUPS)


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the marks (test_parallel_groups)
def pytest_collection_modifyitems(items):
    for item in items:
        if is_heavy(item):
            item.add_marker(pytest.mark.heavy)
            item.add_marker(pytest.mark.slow)
        groups = [group for fixture, group in SHARED_RUNS.items() if fixture in item.fixturenames]
        if groups:
            item.add_marker(pytest.mark.xdist_group(groups[0]))
        if TRAINING_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
    items.sort(key=start_rank)  # stable: a group's tests, and each module's among them, keep their order


def start_rank(item: pytest.Item) -> int:
    group = item.get_closest_marker("xdist_group")
    name = group.args[0] if group else getattr(item, "originalname", item.name)
    return LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST)


@pytest.fixture(scope="session", autouse=True)
def isolated_local_cache(tmp_path_factory):
    """Local runs cache preprocessing; keep the tests' cache apart from the user's. Where flytekit is
    not installed (a GPU machine running the CUDA tests) there is no local run to isolate."""
    if importlib.util.find_spec("flytekit") is None:
        yield
        return
    from flytekit.core import local_cache

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(local_cache, "CACHE_LOCATION", str(tmp_path_factory.mktemp("flyte-local-cache")))
        patch.setattr(local_cache.LocalTaskCache, "_initialized", False)
        yield
    local_cache.LocalTaskCache._initialized = False


@pytest.fixture
def blobs() -> pd.DataFrame:
    return blobs_frame()


@pytest.fixture
def write_table(tmp_path):
    """Write a DataFrame as parquet or CSV and return its path."""

    def write(frame: pd.DataFrame, name: str = "data.parquet") -> str:
        path = tmp_path / name
        if name.endswith(".csv"):
            frame.to_csv(path, index=False)
        else:
            frame.to_parquet(path, index=False)
        return str(path)

    return write


@pytest.fixture(scope="session")
def blob_splits(tmp_path_factory):
    """Prepared train/val/test parquet splits of `blobs_frame`, as the training loop reads them."""
    from tasks.core.data.assignment import SplitConfig
    from tasks.core.data.prepare import prepare_dataset

    root = tmp_path_factory.mktemp("blobs")
    source = root / "blobs.parquet"
    blobs_frame(n_rows=400).to_parquet(source, index=False)
    prepared = prepare_dataset(str(source), "species", str(root / "prepared"), SplitConfig(seed=0))
    return prepared.split_paths()


@pytest.fixture(scope="session")
def flyte_package(tmp_path_factory):
    """`make package` once per session, parsed back into protobufs."""
    from tests.flyte_package import build_package, read_package

    return read_package(build_package(tmp_path_factory.mktemp("package")))


@pytest.fixture(scope="session")
def comparison_run(tmp_path_factory):
    """One local `hardware_comparison` on the embedded digits, shared by every test that only reads its
    outputs: the comparison itself and the HTML Deck each of its tasks wrote. It trains a small CNN
    rather than the default MLP, so a model other than the default runs through both frameworks."""
    from types import SimpleNamespace

    from flytekit.deck import deck as flyte_deck

    from workflows.comparison import hardware_comparison

    folder = tmp_path_factory.mktemp("decks")
    written = {}

    def capture(task_name, new_user_params):
        path = folder / f"{task_name}.html"
        path.write_text(flyte_deck._get_deck(new_user_params=new_user_params, ignore_jupyter=True))
        written[task_name] = path

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(flyte_deck, "_output_deck", capture)
        patch.setenv("FLYTE_LOCAL_CACHE_ENABLED", "false")  # every task runs, so every task writes its Deck
        outputs = hardware_comparison(hyperparameters=COMPARISON_HYPERPARAMETERS, prices={"cpu": 0.5})
    return SimpleNamespace(
        comparison=outputs.comparison, gpu_model=outputs.gpu_model, tpu_model=outputs.tpu_model, decks=written
    )


# The serialized chain as pods run it, shared by the pod, retry and launcher tests: one preprocessing
# pod and one complete training attempt, which later attempts resume from or are compared with.
COMPARISON_HYPERPARAMETERS = TrainConfig(epochs=5, model=ModelSpec("cnn", "1x8x8", {"channels": "16,32"}))
POD_HYPERPARAMETERS = TrainConfig(epochs=3, batch_size=16, model=mlp_spec([32]), seed=3)


@pytest.fixture(scope="session")
def prepared_by_a_pod(flyte_package, tmp_path_factory):
    """The literal a preprocessing pod wrote for the embedded digits."""
    from tasks.core.data.config import DataConfig
    from tasks.preprocess import preprocess
    from tests.pods import literals, run_like_a_pod

    outputs = run_like_a_pod(
        flyte_package.tasks["tasks.preprocess.preprocess"],
        literals(preprocess, {"data": DataConfig()}),  # the embedded digits, the default split
        tmp_path_factory.mktemp("pods") / "preprocess",
    )  # fmt: skip
    return outputs.literals["o0"]


@pytest.fixture(scope="session")
def train_inputs(prepared_by_a_pod):
    from tasks.train_torch import train_torch
    from tests.pods import literals, merged

    return merged(literals(train_torch, {"hyperparameters": POD_HYPERPARAMETERS}), prepared=prepared_by_a_pod)


@pytest.fixture(scope="session")
def train_spec(flyte_package):
    return flyte_package.tasks["tasks.train_torch.train_torch"]


@pytest.fixture(scope="session")
def completed_attempt(train_spec, train_inputs, tmp_path_factory):
    """A training attempt run to the end as a retry whose previous attempt saved nothing: propeller
    hands attempt 1 attempt 0's checkpoint prefix whether or not anything was written there."""
    from types import SimpleNamespace

    from tasks.types import TrainedModel
    from tests.pods import output, run_like_a_pod

    root = tmp_path_factory.mktemp("completed")
    outputs = run_like_a_pod(
        train_spec, train_inputs, root / "attempt-1", str(root / "attempt-0" / "checkpoint")
    )
    return SimpleNamespace(workdir=root / "attempt-1", outputs=outputs, model=output(outputs, TrainedModel))


# Bundles that a unit module's tests and a test in a process of its own (tests/integration/) both read:
# built once per session, their readers kept in one worker by `SHARED_RUNS`.
@pytest.fixture(scope="session")
def scoring_bundle(tmp_path_factory) -> str:
    """The batch scoring tests' bundle (tests/unit/scoring/test_scoring.py)."""
    from tests.unit.publish.test_publish import write_test_bundle

    return write_test_bundle(tmp_path_factory.mktemp("scoring") / "bundle", seed=3)


@pytest.fixture(scope="session")
def scoring_parts(tmp_path_factory) -> str:
    """The batch scoring tests' folder of a user's parts."""
    from tests.unit.scoring.test_scoring import users_table, write_parts

    return write_parts(tmp_path_factory.mktemp("scoring-parts") / "users.parquet", users_table())


@pytest.fixture(scope="session")
def raw_row_bundles(tmp_path_factory) -> dict[str, str]:
    """A bundle over raw columns of every kind per framework, with its exports (seconds each:
    tests/unit/bundle/test_raw_row_exports.py)."""
    from tests.unit.bundle.test_raw_row_exports import WEIGHTS, prepared_table, train_table, write_raw_bundle

    root, prepared = tmp_path_factory.mktemp("raw-row-bundles"), prepared_table(train_table())
    return {framework: write_raw_bundle(root / framework, framework, prepared) for framework in WEIGHTS}


@pytest.fixture(scope="session")
def mlflow_bundle(tmp_path_factory) -> str:
    """A torch bundle over raw columns of every kind (writing it exports the ONNX file: seconds), for
    its MLflow model (tests/unit/bundle/test_mlflow_model.py)."""
    from tests.unit.bundle.test_raw_row_exports import prepared_table, train_table, write_raw_bundle

    return write_raw_bundle(
        tmp_path_factory.mktemp("mlflow") / "bundle", "pytorch", prepared_table(train_table())
    )


@pytest.fixture(scope="session")
def mlflow_model_dir(mlflow_bundle) -> Path:
    from tasks.core.bundle.mlflow_model import write_mlflow_model

    out = Path(mlflow_bundle) / "mlflow"
    assert write_mlflow_model(mlflow_bundle, str(out)) is None
    return out


@pytest.fixture
def single_process(monkeypatch):
    """No torchrun environment: the loop trains as one process, whatever the shell running the tests set."""
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
