"""The promotion gate: whether a newly published version becomes its prefix's LATEST.

Publishing always writes the new version. With the gate, `LATEST` moves to it only when it is not worse
than the version `LATEST` names now, measured on the same rows: the new run's raw test split, scored by
both bundles as evaluation scored it (`split_metrics` for classes, `split_numbers` for a regression).
Classes are judged by the policy's `metric` less `tolerance` (in the metric's units); a regression by
its RMSE, which may exceed the current one's by `rmse_tolerance`, a fraction of the current RMSE.
Otherwise the version stays published beside the others, and the decision's reason gives both figures.

What the gate decides where it cannot measure:
- nothing published under the prefix yet: the new version is promoted (there is nothing to protect);
- the current version cannot score these rows (it reads other columns, reads one as another kind,
  knows other classes, or predicts another column, or classes where the run predicts a number):
  promoted, and the reason says so. The data changed under the model: the current one could not score
  the new partitions either, so keeping it live protects nothing;
- the current version cannot be loaded (unreadable, a mismatch with its manifest, a builder this run
  does not trust): not promoted, and the reason names the error. Nothing says the new one is better,
  and a person should look at what is live.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from tasks.core.bundle.loading import Bundle, load_bundle
from tasks.core.bundle.metric_records import ClassificationMetrics, RegressionMetrics
from tasks.core.bundle.table_input import BundleError
from tasks.core.data.api import DatasetError, filesystem_for, parquet_split, remote_errors
from tasks.core.evaluation.split_metrics import regression_split_metrics, split_metrics, split_numbers
from tasks.core.messages import one_line, preview, raise_for
from tasks.core.publish.versions import LATEST, PromotionDecision, join, resolve_bundle
from tasks.core.strict_json import instantiate, shape_problems

# "gate": LATEST moves only to a version not worse than the current one; "always": to every version.
MODES = ("gate", "always")
# The metrics a version is judged by, as the evaluation report names them. Macro-F1 by default: a model
# that drops a small class loses little accuracy but much macro-F1.
METRICS = {"macro_f1": "macro-F1", "accuracy": "accuracy"}
# A difference this small is rounding, not a worse model: 0.9 against 0.91 passes a tolerance of 0.01.
ROUNDING = 1e-12
EXAMPLE = '{"mode": "gate", "metric": "macro_f1", "tolerance": 0.01, "rmse_tolerance": 0.02}'


@dataclass
class PromotionPolicy:
    """Whether a published version becomes LATEST: "always", or by the "gate": a classifier when its
    `metric` on the run's test rows is at least the current LATEST's less `tolerance` (in the metric's
    units: 0.01 lets it be one point lower); a regression when its RMSE on those rows is at most the
    current LATEST's times 1 + `rmse_tolerance` (a fraction, whatever the label's units: 0.02 lets it be
    2% higher). Any policy given defaults to the gate; training_pipeline's default is `ALWAYS`, the
    scheduled retraining's the gate."""

    mode: str = "gate"
    metric: str = "macro_f1"
    tolerance: float = 0.0
    rmse_tolerance: float = 0.0

    @classmethod
    def from_json(cls, text: str) -> PromotionPolicy:
        """The policy from `--promotion` JSON, checked strictly (pyflyte run's parser calls this)."""
        return parse_promotion(json.loads(text))

    def problems(self) -> dict[str, str]:
        """What is wrong, by field name; empty when the policy can be applied."""
        rules = [
            ("mode", self.mode in MODES, f"not one of {', '.join(MODES)}"),
            ("metric", self.metric in METRICS, f"not one of {', '.join(METRICS)}"),
            ("tolerance", math.isfinite(self.tolerance) and 0 <= self.tolerance <= 1,
             "must be a number from 0 to 1, in the metric's units"),
            ("rmse_tolerance", math.isfinite(self.rmse_tolerance) and 0 <= self.rmse_tolerance <= 1,
             "must be a number from 0 to 1, a fraction of the current RMSE"),
        ]  # fmt: skip
        return {name: rule for name, ok, rule in rules if not ok}

    def figure(self, metrics: ClassificationMetrics) -> float:
        return getattr(metrics, self.metric)


ALWAYS = PromotionPolicy(mode="always")


def promotion_problems(policy: PromotionPolicy) -> list[str]:
    return [
        f"input 'promotion.{name}' = {getattr(policy, name)!r}: {rule}; pass e.g. --promotion '{EXAMPLE}'"
        for name, rule in policy.problems().items()
    ]


def parse_promotion(raw: object) -> PromotionPolicy:
    """The policy from its JSON form: an unknown field, a value of the wrong type or one its rules
    refuse is an InputError naming it."""
    raise_for(shape_problems(raw, PromotionPolicy, "promotion", {PromotionPolicy: EXAMPLE}))
    policy = instantiate(PromotionPolicy, raw)
    raise_for(promotion_problems(policy))
    return policy


@dataclass
class CurrentVersion:
    """The version a prefix's LATEST names: its bundle, or why it could not be loaded."""

    uri: str
    bundle: Bundle | None = None
    problem: str = ""


def promotion_of(
    bundle_dir: str,
    prefix: str,
    test_split: str,
    label_column: str,
    class_labels: list[str],
    policy: PromotionPolicy,
) -> PromotionDecision:
    """`decide` for the run's bundle in the local folder `bundle_dir`, about to be published under
    `prefix`: the bundles are loaded only where the gate compares them. The run's own bundle rebuilds
    the model with the builder this run trained with; the current LATEST is trusted with that one."""
    if policy.mode == "always":
        return promoted_always()
    if not test_split:
        raise ValueError(
            "the promotion gate compares the bundles on the run's test split, and none was given"
        )
    new_bundle = load_bundle(bundle_dir, allow_user_code=True)
    current = current_version(prefix, [new_bundle.manifest.model["model"]["builder"]])
    return decide(new_bundle, current, test_split, label_column, class_labels, policy)


def promoted_always() -> PromotionDecision:
    return PromotionDecision(True, "promoted: the promotion policy is 'always'")


def current_version(prefix: str, trusted_builders: list[str]) -> CurrentVersion | None:
    """The version `<prefix>/LATEST` names, loaded; None where nothing was published there yet."""
    filesystem, path = filesystem_for(prefix)
    with remote_errors(prefix):
        published = filesystem.isfile(join(path, LATEST))
    if not published:
        return None
    try:
        uri = resolve_bundle(prefix)
    except ValueError as error:  # LATEST names no bundle
        return CurrentVersion(join(prefix, LATEST), problem=one_line(error))
    try:
        return CurrentVersion(uri, load_bundle(uri, trusted_builders=trusted_builders))
    except ValueError as error:  # BundleError, DatasetError, ModelError: unreadable, mismatched, untrusted
        return CurrentVersion(uri, problem=one_line(error))


def decide(
    new_bundle: Bundle,
    current: CurrentVersion | None,
    test_split: str,
    label_column: str,
    class_labels: list[str],
    policy: PromotionPolicy,
) -> PromotionDecision:
    """Whether the new version becomes LATEST, by `policy`, measured on the prepared raw test split
    `test_split` (class codes of `class_labels` in `label_column`) where the gate needs figures."""
    if policy.mode == "always":
        return promoted_always()
    if current is None:
        return PromotionDecision(True, "promoted: the first version published under this prefix")
    if current.bundle is None:
        return PromotionDecision(
            False,
            f"not promoted: the current LATEST ({current.uri}) could not be loaded to compare with "
            f"({current.problem}); LATEST is unchanged: look at it, and promote the new version by hand if it should serve",
        )
    if new_bundle.target.regression:
        return decide_numbers(new_bundle, current, test_split, label_column, policy)
    new = split_metrics(new_bundle, test_split, label_column, class_labels)
    try:
        old = comparable_metrics(current.bundle, test_split, label_column, class_labels)
    except Incomparable as error:
        return unmeasured(
            current.uri, error, METRICS[policy.metric], f"{policy.figure(new):.4f}", policy.figure(new)
        )
    return compare(new, old, current.uri, policy)


def decide_numbers(
    new_bundle: Bundle, current: CurrentVersion, test_split: str, label_column: str, policy: PromotionPolicy
) -> PromotionDecision:
    """`decide` for a regression: both bundles' RMSE on the raw test split's labels, in their units."""
    new = regression_split_metrics(new_bundle, *split_numbers(new_bundle, test_split, label_column))
    try:
        old = comparable_numbers(current.bundle, test_split, label_column)
    except Incomparable as error:
        return unmeasured(current.uri, error, "RMSE", f"{new.rmse:.4g}", new.rmse)
    return compare_numbers(new, old, current.uri, policy)


def unmeasured(
    current_uri: str, error: Incomparable, name: str, shown: str, figure: float
) -> PromotionDecision:
    return PromotionDecision(
        True,
        f"promoted without a comparison: the current LATEST ({current_uri}) cannot score this run's test "
        f"rows ({error}), so it could not score the new data either; the new version's {name} is {shown}",
        new=figure,
    )


class Incomparable(ValueError):
    """The current version cannot score the new run's test rows; the message says why."""


def comparable_metrics(
    bundle: Bundle, test_split: str, label_column: str, class_labels: list[str]
) -> ClassificationMetrics:
    """The current bundle's metrics on the split; Incomparable where it cannot score it as the new run
    does: other classes (the split's class codes would mean other labels), or columns it cannot read."""
    known = [str(label) for label in bundle.manifest.record.class_labels]
    if known != [str(label) for label in class_labels]:
        raise Incomparable(f"it knows the classes {preview(known)}, this run {preview(class_labels)}")
    try:
        bundle.check_columns(parquet_split(test_split).schema, "the test split")
        return split_metrics(bundle, test_split, label_column, class_labels)
    except (BundleError, DatasetError) as error:  # a missing column, another kind, a value it cannot read
        raise Incomparable(one_line(error)) from error


def comparable_numbers(bundle: Bundle, test_split: str, label_column: str) -> RegressionMetrics:
    """The current bundle's regression figures on the split; Incomparable where it predicts classes or
    another column, or cannot read the split's columns."""
    if not bundle.target.regression:
        known = preview([str(label) for label in bundle.manifest.record.class_labels])
        raise Incomparable(f"it predicts the classes {known}, this run a number")
    if bundle.label_column != label_column:
        raise Incomparable(f"it predicts {bundle.label_column!r}, this run {label_column!r}")
    try:
        bundle.check_columns(parquet_split(test_split).schema, "the test split")
        return regression_split_metrics(bundle, *split_numbers(bundle, test_split, label_column))
    except (BundleError, DatasetError) as error:  # a missing column, another kind, a value it cannot read
        raise Incomparable(one_line(error)) from error


def fewer_answers(
    new: ClassificationMetrics | RegressionMetrics,
    old: ClassificationMetrics | RegressionMetrics,
    figures: str,
) -> str:
    """Why the new model is not promoted where it has no answer for more rows than the current one."""
    if new.non_finite_rows <= old.non_finite_rows:
        return ""
    return (
        f"not promoted: {figures}, but the new model has no answer (non-finite outputs) for "
        f"{new.non_finite_rows:,} of them, the current one for {old.non_finite_rows:,}; LATEST is unchanged"
    )


def compare_numbers(
    new: RegressionMetrics, old: RegressionMetrics, current_uri: str, policy: PromotionPolicy
) -> PromotionDecision:
    """Lower is better: promoted where the new RMSE is at most the current one's plus `rmse_tolerance`
    of it."""
    ours, theirs, rows = new.rmse, old.rmse, new.n_test + new.non_finite_rows
    figures = (
        f"RMSE {ours:.6g} against {theirs:.6g} for the current LATEST ({current_uri}) on the {rows:,} rows "
        f"of this run's test split"
    )
    if refused := fewer_answers(new, old, figures):
        return PromotionDecision(False, refused, ours, theirs)
    allowed = theirs * policy.rmse_tolerance
    within = f"the tolerance {policy.rmse_tolerance:g} of the current RMSE ({allowed:.4g})"
    if ours > (theirs + allowed) * (1 + ROUNDING):
        return PromotionDecision(
            False,
            f"not promoted: {figures}: {ours - theirs:.4g} higher, more than {within}; LATEST is unchanged",
            ours,
            theirs,
        )
    return PromotionDecision(True, f"promoted: {figures}: not worse by more than {within}", ours, theirs)


def compare(
    new: ClassificationMetrics, old: ClassificationMetrics, current_uri: str, policy: PromotionPolicy
) -> PromotionDecision:
    name, ours, theirs = METRICS[policy.metric], policy.figure(new), policy.figure(old)
    rows = new.n_test + new.non_finite_rows
    figures = (
        f"{name} {ours:.4f} against {theirs:.4f} for the current LATEST ({current_uri}) on the {rows:,} rows "
        f"of this run's test split"
    )
    if refused := fewer_answers(new, old, figures):
        return PromotionDecision(False, refused, ours, theirs)
    if ours < theirs - policy.tolerance - ROUNDING:
        return PromotionDecision(
            False,
            f"not promoted: {figures}: {theirs - ours:.4f} lower, more than the tolerance "
            f"{policy.tolerance:g}; LATEST is unchanged",
            ours,
            theirs,
        )
    return PromotionDecision(
        True, f"promoted: {figures}: not worse by more than the tolerance {policy.tolerance:g}", ours, theirs
    )
