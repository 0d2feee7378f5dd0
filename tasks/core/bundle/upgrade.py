"""Manifests written by earlier versions of this code, upgraded as they are read to the shape the code
writes now, so that nothing past `parse_manifest` asks which version wrote a bundle.

- Format 1, written before encodings existed, has no raw columns nor encoding: its features are the
  input's numeric columns, as they are. Its record gets them as it is built (`BundleRecord`,
  `numbers_as_read`).
- A run recorded before `device_type` named its device `device`, and before it kept its
  hyperparameters, its network as `model` alone (now `config.model`).

The format version stays as written: the digest checks (`check_sealed`) read it.
"""

from __future__ import annotations

from typing import Any


def upgrade_manifest(data: dict[str, Any]) -> dict[str, Any]:
    """`data`, a parsed manifest of any format this code reads, in the current shape; `data` itself
    unchanged, as its digest covers it."""
    run = data.get("run")
    if not isinstance(run, dict):
        return data
    return {**data, "run": upgrade_run(run, data.get("framework"))}


def upgrade_run(run: dict[str, Any], framework: object) -> dict[str, Any]:
    run = dict(run)
    if "device" in run:
        run["device_name"] = run.pop("device")
        run.setdefault("device_type", device_type_of(run["device_name"], framework))
    model = run.pop("model", None)
    if run.get("config") is None and model is not None:
        run["config"] = {"model": model}  # the other hyperparameters were not recorded
    return run


def device_type_of(device_name: object, framework: object) -> str:
    """The family of an old run's device, from the name it recorded: "cpu", a TPU's "TPU (...)", else
    the framework's GPUs."""
    name = str(device_name)
    if name == "cpu":
        return "cpu"
    if name.startswith("TPU"):
        return "tpu"
    return "cuda" if framework == "pytorch" else "gpu"
