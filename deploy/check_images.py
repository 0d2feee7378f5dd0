"""Resolve each image's install set for the images' platform, without installing: `make images-check`.

For every Dockerfile stage, pip's resolver is asked for what that stage installs (pyproject.toml's
dependencies and extras, under constraints.txt, plus the framework build at its constraints.txt
pin) as a linux/x86_64 CPython install on the base image, and reports a conflict or a missing
release, or a package an image must get at exactly its pin (libtpu in the tpu image) that resolved to
another release. It needs the package index, so it is not part of `make test`.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
import textwrap
import tomllib
import urllib.request
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tasks.images import IMAGES as IMAGE_NAMES  # noqa: E402 - the repository on the path first

CONSTRAINTS = REPO / "constraints.txt"
PYTORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
LIBTPU_RELEASES = "https://storage.googleapis.com/libtpu-tf-releases/index.html"
# glibc of the base image's Debian release, which decides the manylinux wheels it accepts.
GLIBC_MINOR = {"bullseye": 31, "bookworm": 36, "trixie": 41}
# NVML bindings: pure Python, no CUDA libraries.
NOT_CUDA = {"nvidia-ml-py"}


@dataclass(frozen=True)
class Image:
    """What a Dockerfile stage installs; `framework` is filled in from constraints.txt's pins."""

    extras: tuple[str, ...] = ()
    framework: str = ""
    # An extra index the framework build comes only from: without it the image is not checked.
    index: str = ""
    # Wheels offered beside the package index: without them the index alone is checked.
    find_links: str = ""
    # Packages that must resolve to exactly their constraints.txt pin, where a dependency's own
    # requirement is looser than the release the framework was tested with.
    exact: tuple[str, ...] = ()


INSTALLS = {
    "cpu": Image(),
    "ml-cpu": Image(
        extras=("torch", "tf-cpu", "serving"), framework="torch=={torch}+cpu", index=PYTORCH_CPU_INDEX
    ),
    "torch-gpu": Image(extras=("torch", "gpu")),
    "tf-gpu": Image(extras=("gpu",), framework="tensorflow[and-cuda]=={tensorflow_cpu}"),
    # tensorflow-tpu 2.20.0 asks `libtpu~=0.0.14`, which any later 0.0.x satisfies.
    "tpu": Image(framework="tensorflow-tpu=={tensorflow_cpu}", find_links=LIBTPU_RELEASES, exact=("libtpu",)),
}


def images() -> dict[str, Image]:
    """Every image of tasks/images.py with its install set; one without is an error naming it."""
    if set(INSTALLS) != set(IMAGE_NAMES):
        raise SystemExit(f"install sets {sorted(INSTALLS)} do not match the images {list(IMAGE_NAMES)}")
    return {name: INSTALLS[name] for name in IMAGE_NAMES}


def pins() -> dict[str, str]:
    """constraints.txt as {name: version}, names as `key` writes them."""
    found = {}
    for line in CONSTRAINTS.read_text().splitlines():
        if "==" in line and not line.startswith("#"):
            name, version = line.split("==", 1)
            found[key(name)] = version.strip()
    return found


def key(name: str) -> str:
    """A package name lower-case with '_' for '-' and '.'."""
    return re.sub(r"[-_.]+", "_", name.strip().lower())


def install_set(image: Image) -> list[str]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    requirements = list(project["dependencies"])
    for extra in image.extras:
        requirements += project["optional-dependencies"][extra]
    if image.framework:
        requirements.append(image.framework.format(**pins()))
    return requirements


def base_platform() -> tuple[str, str]:
    """The base image's Python version (3.11) and Debian release (bookworm), from the Dockerfile."""
    dockerfile = (REPO / "Dockerfile").read_text()
    return re.search(r"ARG PYTHON_IMAGE=python:(\d+\.\d+)\.\d+-slim-(\w+)", dockerfile).groups()


def platform_tags(debian: str) -> list[str]:
    """Every x86_64 platform tag the release's glibc accepts: pip matches each --platform exactly."""
    tags = [f"manylinux_2_{minor}_x86_64" for minor in range(5, GLIBC_MINOR[debian] + 1)]
    return tags + ["manylinux1_x86_64", "manylinux2010_x86_64", "manylinux2014_x86_64", "linux_x86_64"]


def unreachable(url: str) -> str:
    """Why `url` cannot be fetched from here, or '' when it can."""
    try:
        with urllib.request.urlopen(url, timeout=20):
            return ""
    except OSError as error:
        return str(getattr(error, "reason", error))


def pip_command(image: Image, target: str, find_links: bool) -> list[str]:
    python, debian = base_platform()
    # --isolated: this machine's pip configuration (mirrors, local wheels) is not the image build's.
    command = [sys.executable, "-m", "pip", "--isolated", "install", "--dry-run", "--quiet", "--report", "-"]
    command += ["--ignore-installed", "--only-binary=:all:", "--python-version", python]
    command += ["--implementation", "cp", "--target", target, "-c", str(CONSTRAINTS)]
    command += [flag for tag in platform_tags(debian) for flag in ("--platform", tag)]
    if image.index:
        command += ["--extra-index-url", image.index]
    if image.find_links and find_links:
        command += ["--find-links", image.find_links]
    return command + install_set(image)


def cuda_packages(installs: list[dict]) -> list[str]:
    names = [(item["metadata"]["name"], item["metadata"]["version"]) for item in installs]
    return sorted(
        f"{name} {version}"
        for name, version in names
        if name.lower().startswith(("nvidia-", "cuda-")) and name.lower() not in NOT_CUDA
    )


def pin_mismatches(image: Image, installs: list[dict], pinned: dict[str, str]) -> list[str]:
    """Each of the image's `exact` packages that did not resolve to its pin in `pinned`, in words."""
    resolved = {key(item["metadata"]["name"]): item["metadata"]["version"] for item in installs}
    problems = []
    for package in image.exact:
        wanted, got = pinned.get(key(package)), resolved.get(key(package))
        if wanted is None:
            problems.append(f"{package} has no pin in constraints.txt")
        elif got != wanted:
            problems.append(f"{package} resolved to {got or 'nothing'}, not its pin {wanted}")
    return problems


def check(name: str, image: Image) -> str:
    """Print one image's result and return it: OK, FAILED or NOT CHECKED."""
    if image.index and (reason := unreachable(image.index)):
        print(f"{name:10} NOT CHECKED: {image.index} unreachable ({reason}); no pin loosened")
        return "NOT CHECKED"
    note = ""
    if image.find_links and (reason := unreachable(image.find_links)):
        note = f"{image.find_links} unreachable ({reason}): checked on the package index alone"
    with tempfile.TemporaryDirectory() as target:
        command = pip_command(image, target, find_links=not note)
        result = subprocess.run(command, capture_output=True, text=True, cwd=REPO)
    if result.returncode != 0:
        errors = [line for line in result.stderr.splitlines() if not line.startswith("WARNING")]
        print(f"{name:10} FAILED", *(indented(line) for line in errors), sep="\n")
        return "FAILED"
    installs = json.loads(result.stdout)["install"]
    if problems := pin_mismatches(image, installs, pins()):
        print(f"{name:10} FAILED", *(indented(problem) for problem in problems), sep="\n")
        return "FAILED"
    cuda = cuda_packages(installs)
    print(f"{name:10} OK: {len(installs)} packages")
    print(indented(f"CUDA packages ({len(cuda)}): {', '.join(cuda) or 'none'}"))
    if image.exact:
        print(indented(f"at their pins: {', '.join(f'{p} {pins()[key(p)]}' for p in image.exact)}"))
    if note:
        print(indented(note))
    return "OK"


def indented(text: str) -> str:
    return textwrap.fill(
        text, width=110, initial_indent=" " * 11, subsequent_indent=" " * 13, break_on_hyphens=False
    )


def main() -> int:
    python, debian = base_platform()
    glibc = f"2.{GLIBC_MINOR[debian]}"
    print(
        f"Resolving for CPython {python}, x86_64, Debian {debian} (glibc {glibc}): manylinux up to {glibc}, linux"
    )
    results = {name: check(name, image) for name, image in images().items()}
    for status in ("OK", "FAILED", "NOT CHECKED"):
        if names := [name for name, result in results.items() if result == status]:
            print(f"{status}: {', '.join(names)}")
    return 0 if set(results.values()) == {"OK"} else 1


if __name__ == "__main__":
    sys.exit(main())
