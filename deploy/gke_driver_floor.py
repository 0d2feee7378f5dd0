"""Refuse a GPU node pool whose nodes would get an NVIDIA driver older than the torch-gpu image needs.

    python3 deploy/gke_driver_floor.py GKE_VERSION ACCELERATOR FLOOR

GKE installs, for `gpu-driver-version=latest`, the driver that the node's Container-Optimized OS
release labels LATEST for the GPU. GKE's "Run GPUs in Standard node pools" page (section "Map the
GKE version and Container-Optimized OS GPU driver version") finds it in two published files: GKE's
version -> COS image map, and that COS build's `gpu_driver_versions.textproto` (a
`GPUDriverVersionInfoList`: per `gpu_device.gpu_type`, `supported_driver_versions` with `version`
and `label`). deploy/gke-node-pools.sh runs this before each GPU pool and stops when the driver is
below the floor. Exit status 1 only when the driver is known and below the floor; a look-up that fails warns.
"""

from __future__ import annotations

import json
import os
import re
import sys
import urllib.request

GKE_TO_COS = os.environ.get("GKE_TO_COS_URL", "https://www.gstatic.com/gke-image-maps/gke-to-cos.json")
COS_DRIVERS = os.environ.get(
    "COS_DRIVERS_URL", "https://storage.googleapis.com/cos-tools/{build}/lakitu/gpu_driver_versions.textproto"
)
# GKE accelerator -> the chip in COS's gpu_type names (NVIDIA_L4, NVIDIA_H100_80GB, ...). Every
# gpu_type naming the chip counts, and the lowest LATEST among them decides.
CHIPS = {
    "nvidia-l4": "L4",
    "nvidia-tesla-a100": "A100",
    "nvidia-a100-80gb": "A100",
    "nvidia-h100-80gb": "H100",
    "nvidia-h100-mega-80gb": "H100",
    "nvidia-h200-141gb": "H200",
}


def cos_build(gke_version: str, gke_to_cos: dict) -> str:
    """The COS build (e.g. 18867.90.4) of a GKE version's node image (e.g. cos-121-18867-90-4)."""
    images = [entry["image"] for entry in gke_to_cos["entries"] if entry["gke_version"] == gke_version]
    if not images:
        raise LookupError(f"GKE version {gke_version} is not in {GKE_TO_COS}")
    return ".".join(images[0].split("-")[-3:])


def parse_textproto(text: str) -> dict[str, list]:
    """Protobuf text format, enough for this file: nested messages and scalar fields, every field a list."""
    tokens = re.findall(r'"(?:[^"\\]|\\.)*"|[{}\[\]]|[\w.]+', re.sub(r"#.*", "", text))
    message, _ = _message(tokens, 0)
    return message


def _message(tokens: list[str], at: int) -> tuple[dict[str, list], int]:
    fields: dict[str, list] = {}
    while at < len(tokens) and tokens[at] != "}":
        name, at = tokens[at], at + 1
        if tokens[at] == "{":
            value, at = _message(tokens, at + 1)
            at += 1
        elif tokens[at] == "[":  # an empty list, as `gpu_driver_version_info: []`
            at += 2
            fields.setdefault(name, [])
            continue
        else:
            value, at = tokens[at].strip('"'), at + 1
        fields.setdefault(name, []).append(value)
    return fields, at


def latest_driver(textproto: str, accelerator: str) -> str | None:
    """The lowest driver labelled LATEST for the accelerator's chip; None when COS lists none."""
    chip = CHIPS[accelerator]
    latest = [
        version["version"][0]
        for info in parse_textproto(textproto).get("gpu_driver_version_info", [])
        for device in info.get("gpu_device", [])
        if chip in device["gpu_type"][0].split("_")
        for version in info.get("supported_driver_versions", [])
        if version.get("label") == ["LATEST"]
    ]
    return min(latest, key=version_key) if latest else None


def version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def fetch(url: str) -> str:
    with urllib.request.urlopen(url, timeout=30) as response:  # noqa: S310 - fixed https (or a test's file) URLs
        return response.read().decode()


def main(gke_version: str, accelerator: str, floor: str) -> int:
    """0 unless the driver `latest` installs is known and below the floor. The published files' layout
    is GKE's to change: a look-up that fails warns and lets the pool be created, since the training
    task's GPU guard refuses a driver below the floor at start, naming it."""
    try:
        build = cos_build(gke_version, json.loads(fetch(GKE_TO_COS)))
        driver = latest_driver(fetch(COS_DRIVERS.format(build=build)), accelerator)
    except Exception as error:  # network, a moved file, a changed layout: none of them is a low driver
        driver, build = None, f"not found: {type(error).__name__}: {error}"
    where = f"GKE {gke_version} (COS {build}) with gpu-driver-version=latest installs"
    if driver is None:
        print(
            f"warning: could not tell which driver {where.split(' installs')[0]} installs on {accelerator}; "
            f"check a node with `nvidia-smi` (at least {floor}, docs/cluster.md)",
            file=sys.stderr,
        )
        return 0
    if version_key(driver) < version_key(floor):
        print(
            f"{where} NVIDIA driver {driver} on {accelerator}, below {floor}, which the torch-gpu image "
            f"needs: upgrade the cluster to a GKE version whose latest driver is at least {floor}",
            file=sys.stderr,
        )
        return 1
    print(f"{where} NVIDIA driver {driver} on {accelerator} (>= {floor})")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
