"""A bundle's model card, MODEL_CARD.md: what the model predicts, from which columns, how well against
the majority-class baseline, and where it comes from, generated from the bundle's manifest.

The sections "Intended use" and "Limitations" are the user's to fill in: they are generated as marked
placeholders, and `write_model_card` keeps what the card already holds in them. The manifest records
the card's sha256 like every other file's, so a card edited by hand no longer matches it (publishing
refuses it) until `write_model_card` is run again on the folder: it rewrites the generated sections,
keeps the user's, and records the new sha256.
"""

from __future__ import annotations

import json
from dataclasses import asdict, replace
from pathlib import Path

from tasks.core.bundle.digests import content_digest
from tasks.core.bundle.manifest import (
    CONTENT_HASH,
    MODEL_CARD,
    CodeVersion,
    DataHash,
    Manifest,
    read_manifest,
    write_manifest,
)
from tasks.core.data.api import FittedEncoding, filesystem_for
from tasks.core.messages import preview
from tasks.core.models.plugins import describe_spec

TO_FILL = "_To fill in by the model's owner: "
USER_SECTIONS = {
    "Intended use": TO_FILL + "who uses the model's answers, for what decisions, and on which rows._",
    "Limitations": TO_FILL + "the rows it was not trained for, known failure cases, fairness checks._",
}
CLASSES_LISTED = 20


def write_model_card(directory: str) -> str:
    """Write MODEL_CARD.md into the local bundle folder `directory` from its manifest, keeping what an
    earlier card holds in the user's sections, and record it and its sha256 in the manifest. Returns
    the card's path."""
    manifest = read_manifest(*filesystem_for(directory), directory)
    path = Path(directory) / MODEL_CARD
    kept = user_sections(path.read_text(encoding="utf-8")) if path.is_file() else {}
    path.write_text(render_card(manifest, kept), encoding="utf-8")
    files = {**manifest.files, "model_card": MODEL_CARD}
    digests = {**manifest.digests, MODEL_CARD: content_digest(path)}
    write_manifest(directory, replace(manifest, files=files, digests=digests))
    return str(path)


def render_card(manifest: Manifest, user_text: dict[str, str] | None = None) -> str:
    """The card's Markdown; `user_text`: the user's sections by heading, where already filled in."""
    record = manifest.record
    sections = [
        f"# Model card: {record.label_column} classifier",
        "Generated from the bundle's manifest (bundle.json). The sections marked *to fill in* are the "
        "model owner's.",
        *predicts(manifest),
        *inputs(manifest),
        *metrics(manifest),
        *training(manifest),
        *provenance(manifest),
    ]
    for heading, placeholder in USER_SECTIONS.items():
        sections += [f"## {heading}", (user_text or {}).get(heading) or placeholder]
    return "\n\n".join(sections) + "\n"


def user_sections(card: str) -> dict[str, str]:
    """The text under each of the user's headings in `card`, up to the next heading."""
    found = {}
    for heading in USER_SECTIONS:
        marker = f"\n## {heading}\n"
        start = card.find(marker)
        if start < 0:
            continue
        body = card[start + len(marker) :]
        end = body.find("\n## ")
        found[heading] = (body if end < 0 else body[:end]).strip()
    return found


def predicts(manifest: Manifest) -> list[str]:
    record = manifest.record
    if record.target.regression:
        return [
            "## What it predicts",
            f"A number: column `{record.label_column}` ({record.label_kind} values), in its units "
            f"(a regression; {record.target.reason}).",
        ]
    labels = record.class_labels
    shown = ", ".join(f"`{label}`" for label in labels[:CLASSES_LISTED])
    more = f" and {len(labels) - CLASSES_LISTED:,} more" if len(labels) > CLASSES_LISTED else ""
    return [
        "## What it predicts",
        f"The class in column `{record.label_column}` ({record.label_kind} values), one of "
        f"{len(labels):,}: {shown}{more}; with a probability for each class.",
    ]


def inputs(manifest: Manifest) -> list[str]:
    record = manifest.record
    if not record.encoding:
        return [
            "## From which columns",
            f"{len(record.feature_names)} numeric columns, read as they are: {preview(record.feature_names)}.",
        ]
    encoding = FittedEncoding.from_dict(record.encoding)
    rows = [
        f"| {cell(column.name)} | {column.kind} | {column.missing_share:.1%} |" for column in encoding.columns
    ]
    lines = [
        "## From which columns",
        f"{len(encoding.columns)} of the input's columns, encoded into {len(record.feature_names)} features "
        "and standardised:",
        "\n".join(["| column | read as | missing in train rows |", "| --- | --- | --- |", *rows]),
    ]
    if encoding.left_out:
        lines.append("Left out: " + "; ".join(encoding.left_out.values()) + ".")
    return lines


def metrics(manifest: Manifest) -> list[str]:
    if manifest.record.regression_metrics is not None:
        return regression_metrics(manifest.record.regression_metrics)
    scored = manifest.record.metrics
    if scored is None:
        return ["## How well", "Not evaluated: the manifest holds no test metrics."]
    rows = [
        ("accuracy", scored.accuracy),
        ("balanced accuracy", scored.balanced_accuracy),
        ("macro-F1", scored.macro_f1),
        ("baseline: always the most frequent class (accuracy)", scored.majority_accuracy),
    ]
    table = ["| metric | value |", "| --- | --- |", *(f"| {name} | {value:.4f} |" for name, value in rows)]
    return [
        "## How well",
        f"On the held-out test split, {scored.n_test:,} rows, scored through this bundle:",
        "\n".join(table),
        *scored.notes(),
    ]


def training(manifest: Manifest) -> list[str]:
    record = manifest.record
    run = record.run
    lines = [
        f"- model: {describe_spec(run.config.model)} ({record.framework})",
        f"- trained with {run.strategy} on {run.device_name} x{run.world_size}, {run.precision}, "
        f"{len(run.history)} epochs in {run.train_seconds:.1f}s; billed as {record.billed.describe()}",
    ]
    if run.kept_epoch:
        lines.append(f"- kept epoch {run.kept_epoch}: {run.kept_reason}")
    text = "\n".join(lines)
    config = json.dumps(asdict(run.config), indent=2)
    return ["## Training", text, f"Hyperparameters (`run.config` in bundle.json):\n\n```json\n{config}\n```"]


def provenance(manifest: Manifest) -> list[str]:
    record, found = manifest.record, manifest.provenance
    lines = [f"- data: `{record.source}`, fingerprint `{record.data_fingerprint}`"]
    if found is None:
        lines.append("- not recorded: the bundle was written before bundles recorded their provenance")
    else:
        lines += [data_line(found.data), f"- split: {found.split.describe()}", code_line(found.code)]
    packages = ", ".join(f"{name} {version}" for name, version in manifest.packages.items())
    lines.append(f"- written {manifest.created} with {packages}")
    return ["## Provenance", "\n".join(lines)]


def data_line(data: DataHash) -> str:
    if data.kind == CONTENT_HASH:
        return f"- data content sha256: `{data.sha256}`"
    return "- no content hash of the data: its fingerprint hashes the files' sizes and versions"


def code_line(code: CodeVersion) -> str:
    if code.identified_by == "git commit":
        identity = f"git commit `{code.commit}`" + " with uncommitted changes" * bool(code.dirty)
    elif code.identified_by == "registered version":
        identity = f"registered version `{code.registered_version}`"
    else:
        identity = "neither a git commit nor a registered version"
    return f"- code: {identity}; source sha256 `{code.source_sha256}`"


def cell(text: str) -> str:
    """`text` in a Markdown table cell, its pipes escaped."""
    return f"`{text}`".replace("|", "\\|")


def regression_metrics(scored) -> list[str]:
    rows = [
        ("RMSE", scored.rmse, scored.baseline_rmse),
        ("MAE", scored.mae, scored.baseline_mae),
        ("R²", scored.r2, scored.baseline_r2),
    ]
    table = ["| metric | model | baseline: always the train mean |", "| --- | --- | --- |"]
    table += [f"| {name} | {value:.4g} | {baseline:.4g} |" for name, value, baseline in rows]
    return [
        "## How well",
        f"On the held-out test split, {scored.n_test:,} rows, scored through this bundle:",
        "\n".join(table),
        *scored.notes(),
    ]
