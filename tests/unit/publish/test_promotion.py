"""The promotion gate: a published version becomes LATEST only when it scores the new run's raw test
rows no worse than the current LATEST does, less a tolerance; where the current one cannot score those
rows it is promoted with a note, where it cannot be loaded it is not; the policy is checked strictly."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tasks.core.bundle.digests import MANIFEST_DIGEST, manifest_digest
from tasks.core.bundle.loading import load_bundle
from tasks.core.bundle.manifest import BundleRecord
from tasks.core.bundle.writing import write_bundle
from tasks.core.data.scaling import ScalerStats
from tasks.core.data.target import REGRESSION, Target
from tasks.core.evaluation.split_metrics import regression_split_metrics, split_metrics, split_numbers
from tasks.core.messages import InputError
from tasks.core.models.plugins import build, input_spec_for, mlp_spec
from tasks.core.publish.promotion import (
    ALWAYS,
    CurrentVersion,
    PromotionPolicy,
    compare,
    current_version,
    decide,
    parse_promotion,
    promotion_of,
)
from tasks.core.publish.versions import LATEST, PUBLISHED, publish_bundle, resolve_bundle
from tasks.core.training.config import TrainConfig
from tasks.core.training.records import Hardware, TrainingRun
from tests.conftest import blobs_frame
from tests.unit.publish.test_publish import (
    CLASSES,
    FEATURES,
    no_exports,
    write_messy_bundle,
    write_unexported_bundle,
)

LABEL = "species"


def raw_split(folder: Path, rows: int = 240) -> str:
    """A test split as preprocessing writes it: the raw feature values and the class codes."""
    frame = blobs_frame(n_rows=rows, n_classes=3, seed=5)
    frame[LABEL] = frame[LABEL].map(CLASSES.index)
    folder.mkdir(parents=True)
    pq.write_table(
        pa.Table.from_pandas(frame[[*FEATURES, LABEL]], preserve_index=False), folder / "part-0.parquet"
    )
    return str(folder)


@pytest.fixture(scope="module")
def split(tmp_path_factory) -> str:
    return raw_split(tmp_path_factory.mktemp("promotion") / "test")


@pytest.fixture(scope="module")
def ranked(tmp_path_factory, split) -> dict[str, str]:
    """Two untrained bundles, "better" and "worse" by macro-F1 on the split, as folders."""
    root = tmp_path_factory.mktemp("promotion-bundles")
    folders = [write_unexported_bundle(root / f"seed-{seed}", seed) for seed in (1, 2)]
    figures = [split_metrics(load_bundle(f), split, LABEL, CLASSES).macro_f1 for f in folders]
    assert figures[0] != figures[1], "the two seeds must score differently for the gate to tell them apart"
    worse, better = sorted(folders, key=lambda folder: figures[folders.index(folder)])
    return {"better": better, "worse": worse}


def macro_f1(folder: str, split: str) -> float:
    return split_metrics(load_bundle(folder), split, LABEL, CLASSES).macro_f1


def current_at(folder: str) -> CurrentVersion:
    """The bundle in `folder` as the version LATEST names."""
    return CurrentVersion(folder, load_bundle(folder))


@pytest.mark.parametrize(
    "new, current, tolerance_in_gaps, promoted",
    [
        ("better", "worse", 0.0, True),
        ("better", "better", 0.0, True),  # equal: not worse
        ("worse", "better", 2.0, True),  # worse, within the tolerance
        ("worse", "better", 1.0, True),  # worse by exactly the tolerance
        ("worse", "better", 0.5, False),  # worse, beyond the tolerance
        ("worse", "better", 0.0, False),
    ],
)
def test_the_gate_promotes_a_version_not_worse_than_latest_by_more_than_the_tolerance(
    ranked, split, new, current, tolerance_in_gaps, promoted
):
    ours, theirs = macro_f1(ranked[new], split), macro_f1(ranked[current], split)
    gap = abs(macro_f1(ranked["better"], split) - macro_f1(ranked["worse"], split))
    policy = PromotionPolicy(tolerance=tolerance_in_gaps * gap)
    decision = decide(load_bundle(ranked[new]), current_at(ranked[current]), split, LABEL, CLASSES, policy)
    assert decision.promote is promoted
    assert (decision.new, decision.current) == (ours, theirs)
    assert decision.reason.startswith("promoted: " if promoted else "not promoted: ")
    assert f"macro-F1 {ours:.4f} against {theirs:.4f}" in decision.reason
    assert ranked[current] in decision.reason and "240 rows" in decision.reason


def test_the_gate_judges_by_the_metric_the_policy_names(ranked, split):
    decision = decide(
        load_bundle(ranked["worse"]),
        current_at(ranked["better"]),
        split,
        LABEL,
        CLASSES,
        PromotionPolicy(metric="accuracy"),
    )
    accuracies = [
        split_metrics(load_bundle(ranked[n]), split, LABEL, CLASSES).accuracy for n in ("worse", "better")
    ]
    assert [decision.new, decision.current] == accuracies
    assert decision.promote is (accuracies[0] >= accuracies[1])
    assert f"accuracy {accuracies[0]:.4f} against {accuracies[1]:.4f}" in decision.reason


def test_a_new_model_without_an_answer_for_more_rows_is_not_promoted_however_it_scores_the_rest(
    ranked, split
):
    measured = split_metrics(load_bundle(ranked["better"]), split, LABEL, CLASSES)
    old = split_metrics(load_bundle(ranked["worse"]), split, LABEL, CLASSES)
    new = replace(measured, n_test=measured.n_test - 3, non_finite_rows=3)
    decision = compare(new, old, "models/LATEST-version", PromotionPolicy(tolerance=1.0))
    assert not decision.promote and (decision.new, decision.current) == (new.macro_f1, old.macro_f1)
    assert "no answer (non-finite outputs) for 3 of them, the current one for 0" in decision.reason
    assert compare(replace(new, non_finite_rows=0, n_test=240), old, "v", PromotionPolicy()).promote


def test_the_first_version_under_a_prefix_is_promoted(ranked, split, tmp_path):
    prefix = str(tmp_path / "models")
    assert current_version(prefix, []) is None
    decision = promotion_of(ranked["worse"], prefix, split, LABEL, CLASSES, PromotionPolicy())
    assert decision.promote and "the first version published under this prefix" in decision.reason
    assert (decision.new, decision.current) == (None, None)


def test_policy_always_promotes_without_loading_either_bundle(tmp_path):
    decision = promotion_of(str(tmp_path / "no-bundle"), str(tmp_path / "models"), "", "", [], ALWAYS)
    assert decision.promote and "'always'" in decision.reason


def test_a_latest_of_other_columns_cannot_compare_and_the_new_version_is_promoted_saying_so(
    ranked, split, tmp_path
):
    with no_exports():
        messy = write_messy_bundle(tmp_path / "messy")
    decision = decide(
        load_bundle(ranked["worse"]), current_at(messy), split, LABEL, CLASSES, PromotionPolicy()
    )
    assert decision.promote and decision.current is None
    assert decision.new == macro_f1(ranked["worse"], split)
    assert (
        f"promoted without a comparison: the current LATEST ({messy}) cannot score this run's"
        in decision.reason
    )
    assert "missing feature" in decision.reason and "'city'" in decision.reason


def test_a_latest_of_other_classes_cannot_compare_and_the_new_version_is_promoted_saying_so(
    ranked, split, tmp_path
):
    other = tmp_path / "other-classes"
    shutil.copytree(ranked["better"], other)
    manifest = {**json.loads((other / "bundle.json").read_text()), "class_labels": ["cat", "dog", "eel"]}
    (other / "bundle.json").write_text(json.dumps({**manifest, MANIFEST_DIGEST: manifest_digest(manifest)}))
    decision = decide(
        load_bundle(ranked["worse"]), current_at(str(other)), split, LABEL, CLASSES, PromotionPolicy()
    )
    assert decision.promote and decision.current is None
    assert "it knows the classes cat, dog, eel, this run setosa, versicolor, virginica" in decision.reason


def test_a_latest_that_cannot_be_loaded_keeps_latest_and_names_the_error(ranked, split, tmp_path):
    prefix = str(tmp_path / "models")
    live = publish_bundle(ranked["better"], prefix)
    (Path(live) / "model.pt").write_bytes(b"not the weights")
    decision = promotion_of(ranked["worse"], prefix, split, LABEL, CLASSES, PromotionPolicy())
    assert not decision.promote
    assert f"not promoted: the current LATEST ({live}) could not be loaded" in decision.reason
    assert "sha256" in decision.reason
    assert resolve_bundle(prefix) == live


# ---- a regression: RMSE on the same raw rows, lower is better --------------------------------------------

TARGET = "price"
PRICES = 100.0  # the split's labels: about this, give or take one


def write_regression_bundle(folder: Path, mean: float, label: str = TARGET, features=FEATURES) -> str:
    """An untrained one-output MLP, the same weights each time, answering around `mean`: a bundle whose
    mean is far from the split's labels has the higher RMSE."""
    spec = mlp_spec([16])
    folder.mkdir(parents=True)
    artifact = str(folder.parent / f"{folder.name}-model.pt")
    import torch

    from tasks.core.models.torch_models import save_torch_artifact

    torch.manual_seed(0)
    model = build(spec, len(features), 1, "pytorch")
    save_torch_artifact(model, spec, input_spec_for(spec, len(features), 1), artifact)
    run = TrainingRun(
        "pytorch", "cpu", "cpu", 1, "gloo", "fp32", "single-process", [], 0.0, 0.0, TrainConfig(model=spec)
    )
    record = BundleRecord(
        framework="pytorch", feature_names=list(features),
        scaler=ScalerStats([0.0] * len(features), [1.0] * len(features)), class_labels=[],
        label_kind="float", label_column=label, source="prices.parquet", data_fingerprint="0" * 32,
        run=run, billed=Hardware("cpu", 1), target=Target(REGRESSION, "asked for", mean=mean, std=1.0),
    )  # fmt: skip
    with no_exports():
        return write_bundle(str(folder), artifact, record)


@pytest.fixture(scope="module")
def price_split(tmp_path_factory) -> str:
    """A regression's test split as preprocessing writes it: the raw features and the label as read."""
    frame = blobs_frame(n_rows=200, n_classes=3, seed=6)[FEATURES]
    frame[TARGET] = PRICES + np.random.default_rng(6).normal(0.0, 1.0, len(frame))
    folder = tmp_path_factory.mktemp("prices") / "test"
    folder.mkdir()
    pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), folder / "part-0.parquet")
    return str(folder)


@pytest.fixture(scope="module")
def priced(tmp_path_factory) -> dict[str, str]:
    """Regression bundles "better" (answering about the labels' mean) and "worse" (10 away), as folders."""
    root = tmp_path_factory.mktemp("price-bundles")
    return {
        "better": write_regression_bundle(root / "better", PRICES),
        "worse": write_regression_bundle(root / "worse", PRICES + 10.0),
    }


def rmse(folder: str, split: str) -> float:
    bundle = load_bundle(folder)
    return regression_split_metrics(bundle, *split_numbers(bundle, split, TARGET)).rmse


@pytest.mark.parametrize(
    "new, current, tolerance_in_gaps, promoted",
    [
        ("better", "worse", 0.0, True),
        ("better", "better", 0.0, True),  # equal: not worse
        ("worse", "better", 2.0, True),  # worse, within the tolerance
        ("worse", "better", 1.0, True),  # worse by exactly the tolerance
        ("worse", "better", 0.99, False),  # worse, just beyond the tolerance
        ("worse", "better", 0.0, False),
    ],
)
def test_the_gate_promotes_a_regression_whose_rmse_is_not_worse_by_more_than_the_tolerance(
    priced, price_split, new, current, tolerance_in_gaps, promoted
):
    ours, theirs = rmse(priced[new], price_split), rmse(priced[current], price_split)
    best, worst = rmse(priced["better"], price_split), rmse(priced["worse"], price_split)
    assert worst > best, "the bundle answering further from the labels scores worse"
    policy = PromotionPolicy(rmse_tolerance=tolerance_in_gaps * (worst - best) / best)  # a fraction of it
    decision = decide(load_bundle(priced[new]), current_at(priced[current]), price_split, TARGET, [], policy)
    assert decision.promote is promoted
    assert (decision.new, decision.current) == (ours, theirs)
    assert decision.reason.startswith("promoted: " if promoted else "not promoted: ")
    assert (
        f"RMSE {ours:.6g} against {theirs:.6g} for the current LATEST ({priced[current]})" in decision.reason
    )
    assert "200 rows" in decision.reason
    if not promoted:
        assert f"{ours - theirs:.4g} higher, more than the tolerance" in decision.reason


def test_a_worse_regression_is_published_but_not_promoted_with_the_reason_in_its_record(
    priced, price_split, tmp_path
):
    prefix = str(tmp_path / "models")
    live = publish_bundle(priced["worse"], prefix)
    better = promotion_of(priced["better"], prefix, price_split, TARGET, [], PromotionPolicy())
    promoted = publish_bundle(priced["better"], prefix, promote=better)
    assert better.promote and resolve_bundle(prefix) == promoted != live
    worse = promotion_of(priced["worse"], prefix, price_split, TARGET, [], PromotionPolicy())
    held = publish_bundle(priced["worse"], prefix, promote=worse)
    assert not worse.promote and resolve_bundle(prefix) == promoted
    record = json.loads((Path(held) / PUBLISHED).read_text())["promotion"]
    assert record == {"promote": False, "reason": worse.reason, "new": worse.new, "current": worse.current}
    assert (
        f"RMSE {worse.new:.6g} against {worse.current:.6g} for the current LATEST ({promoted})"
        in (record["reason"])
    )
    assert "LATEST is unchanged" in record["reason"]


def test_a_new_regression_without_an_answer_for_more_rows_is_not_promoted(priced, price_split):
    from tasks.core.publish.promotion import compare_numbers

    bundle = load_bundle(priced["better"])
    old = regression_split_metrics(bundle, *split_numbers(bundle, price_split, TARGET))
    new = replace(old, rmse=old.rmse / 2, n_test=old.n_test - 2, non_finite_rows=2)
    decision = compare_numbers(new, old, "models/v", PromotionPolicy(rmse_tolerance=1.0))
    assert not decision.promote and "no answer (non-finite outputs) for 2 of them" in decision.reason


def test_a_latest_that_cannot_score_the_regression_s_rows_is_replaced_saying_why(
    priced, price_split, ranked, tmp_path
):
    others = {
        "classes": ranked["better"],
        "column": write_regression_bundle(tmp_path / "column", PRICES, label="cost"),
        "features": write_regression_bundle(tmp_path / "features", PRICES, features=["f0", "f1", "g2"]),
    }
    why = {
        "classes": "it predicts the classes setosa, versicolor, virginica, this run a number",
        "column": "it predicts 'cost', this run 'price'",
        "features": "'g2'",
    }
    new = load_bundle(priced["worse"])
    for name, folder in others.items():
        decision = decide(new, current_at(folder), price_split, TARGET, [], PromotionPolicy())
        assert decision.promote and decision.current is None, name
        assert decision.reason.startswith(f"promoted without a comparison: the current LATEST ({folder})")
        assert why[name] in decision.reason, name
        assert f"the new version's RMSE is {rmse(priced['worse'], price_split):.4g}" in decision.reason


@pytest.mark.parametrize(
    "raw, message",
    [
        ({"rmse_tolerance": 1.5}, "input 'promotion.rmse_tolerance' = 1.5: must be a number from 0 to 1"),
        ({"mode": "strict"}, "input 'promotion.mode' = 'strict': not one of gate, always"),
        ({"metric": "f1"}, "input 'promotion.metric' = 'f1': not one of macro_f1, accuracy"),
        ({"tolerance": -0.01}, "input 'promotion.tolerance' = -0.01: must be a number from 0 to 1"),
        ({"tolerance": "1%"}, "input 'promotion.tolerance' = \"1%\": expected a number"),
        ({"tolerence": 0.01}, "input 'promotion.tolerence': unknown field; did you mean 'tolerance'?"),
        ("gate", "input 'promotion' = 'gate': expected an object, e.g. {\"mode\": \"gate\""),
    ],
)
def test_a_bad_policy_is_refused_naming_the_allowed_values(raw, message):
    with pytest.raises(InputError) as refused:
        parse_promotion(raw)
    assert message in str(refused.value)


def test_a_policy_given_defaults_to_the_gate_and_reads_from_json():
    assert PromotionPolicy.from_json('{"tolerance": 0.01}') == PromotionPolicy("gate", "macro_f1", 0.01)
    assert PromotionPolicy.from_json('{"rmse_tolerance": 0.02}') == PromotionPolicy(rmse_tolerance=0.02)
    assert PromotionPolicy.from_json('{"mode": "always"}') == ALWAYS
    with pytest.raises(InputError, match="not one of macro_f1, accuracy"):
        PromotionPolicy.from_json('{"metric": "recall"}')


# ---- the publish task -----------------------------------------------------------------------------------


def prepared_data(test_split: str):
    """What the workflow hands the publish task: the gate reads only the test split and the table."""
    from flytekit.types.structured import StructuredDataset

    from tasks.core.data.prepare import PreparedTable
    from tasks.core.data.scaling import ScalerStats
    from tasks.types import PreparedData

    table = PreparedTable(
        feature_names=FEATURES,
        label_column=LABEL,
        class_labels=CLASSES,
        class_counts=dict.fromkeys(CLASSES, 80),
        rows={"train": 0, "val": 0, "test": 240},
        scaler=ScalerStats([0.0] * len(FEATURES), [1.0] * len(FEATURES)),
    )
    splits = [StructuredDataset(uri=test_split) for _ in range(3)]
    return PreparedData(*splits, table=table)


@pytest.mark.slow  # runs the Flyte task locally: its inputs and outputs go through flytekit's type engine
def test_the_publish_task_publishes_a_worse_model_but_latest_stays_naming_both_figures(
    ranked, split, tmp_path, capsys
):
    from flytekit.types.directory import FlyteDirectory

    from tasks.publish import publish_model

    prefix = str(tmp_path / "models")
    live = publish_model(bundle=FlyteDirectory(ranked["better"]), prefix=prefix)
    published = publish_model(
        bundle=FlyteDirectory(ranked["worse"]),
        prefix=prefix,
        prepared=prepared_data(split),
        promotion=PromotionPolicy(),
    )
    assert published != live and Path(published, "bundle.json").is_file(), "the version is published"
    assert resolve_bundle(prefix) == live and (Path(prefix) / LATEST).read_text() == Path(live).name
    printed = capsys.readouterr().out
    ours, theirs = macro_f1(ranked["worse"], split), macro_f1(ranked["better"], split)
    assert (
        f"published the model bundle as {published}; not promoted: macro-F1 {ours:.4f} against {theirs:.4f}"
        in printed
    )
    assert f"for the current LATEST ({live})" in printed and "LATEST is unchanged" in printed
    recorded = json.loads((Path(published) / PUBLISHED).read_text())["promotion"]
    assert not recorded["promote"] and recorded["reason"] in printed


def test_the_publish_task_refuses_a_bad_policy_before_publishing(ranked, tmp_path):
    from flytekit.types.directory import FlyteDirectory

    from tasks.publish import publish_model

    with pytest.raises(InputError, match="input 'promotion.metric' = 'f1'"):
        publish_model.execute(
            bundle=FlyteDirectory(ranked["better"]), prefix=str(tmp_path / "models"),
            promotion=PromotionPolicy(metric="f1"),
        )  # fmt: skip
    assert not (tmp_path / "models").exists()
