"""The model card a bundle carries: what it predicts from which columns, its test metrics beside the
majority-class baseline, where it comes from, and the sections left for the model's owner."""

from __future__ import annotations

from dataclasses import replace

from tasks.core.bundle.loading import load_bundle
from tasks.core.bundle.manifest import CodeVersion, DataHash, Provenance, SplitSettings
from tasks.core.bundle.model_card import USER_SECTIONS, render_card, user_sections
from tests.unit.bundle.test_provenance import bundle, code  # noqa: F401 - the fixtures


def card_of(folder) -> str:
    return (folder / "MODEL_CARD.md").read_text()


def test_the_card_names_the_label_the_columns_the_metrics_and_the_baseline(bundle):  # noqa: F811
    card = card_of(bundle)
    metrics = load_bundle(str(bundle)).manifest.record.metrics
    assert card.startswith("# Model card: species classifier")
    assert (
        "The class in column `species` (string values), one of 3: `setosa`, `versicolor`, `virginica`" in card
    )
    for column, kind in [
        ("amount", "numeric"),
        ("city", "categorical"),
        ("member", "boolean"),
        ("joined", "date"),
    ]:
        assert f"| `{column}` | {kind} |" in card
    assert "customer_id" in card.split("Left out:")[1], "the column the encoding left out, and why"
    assert f"| accuracy | {metrics.accuracy:.4f} |" in card
    assert f"| macro-F1 | {metrics.macro_f1:.4f} |" in card
    assert (
        f"| baseline: always the most frequent class (accuracy) | {metrics.majority_accuracy:.4f} |" in card
    )
    assert '"seed": 7' in card and "- split: random (stratified), seed 7; rows train 300" in card
    assert "data content sha256: `" in card and "- code: " in card


def test_the_owners_sections_are_marked_to_fill_in(bundle):  # noqa: F811
    sections = user_sections(card_of(bundle))
    assert sections == USER_SECTIONS
    assert all(text.startswith("_To fill in") for text in sections.values())


def test_a_card_before_evaluation_says_it_has_no_metrics_and_names_where_the_code_is_from(bundle):  # noqa: F811
    manifest = load_bundle(str(bundle)).manifest
    unevaluated = replace(manifest, record=replace(manifest.record, metrics=None))
    assert "Not evaluated: the manifest holds no test metrics." in render_card(unevaluated)
    registered = Provenance(
        SplitSettings(0, {"train": 1}, 0.0, 0.0),
        CodeVersion("ab" * 32, "registered version", registered_version="3f9c2a1b7d0e-dirty-1234abcd"),
        DataHash("fingerprint"),
    )
    card = render_card(replace(manifest, provenance=registered))
    assert "- code: registered version `3f9c2a1b7d0e-dirty-1234abcd`" in card
    assert "no content hash of the data" in card and "- split: method not recorded, seed 0" in card
