"""The project's images, one per Dockerfile stage: the one table of their names.

The Makefile builds, pushes and registers them (`python3 -m tasks.images` prints the names), the
tasks name theirs through `image`, deploy/check_images.py resolves each one's install set, and the
tests hold the Dockerfile's stages to this table. Imports nothing, so the Makefile can read it
before any environment exists.
"""

from __future__ import annotations

# What each image adds to the one before it. One training framework per GPU image, so a pod pulls
# one CUDA stack, and none on CPU pods.
IMAGES = {
    "cpu": "flytekit, pandas, pyarrow, scikit-learn (no torch, no TensorFlow)",
    "ml-cpu": "+ CPU builds of torch and TensorFlow, for evaluation and the planner dynamics (no CUDA)",
    "torch-gpu": "+ CUDA torch and the PyTorch plugin (no TensorFlow)",
    "tf-gpu": "+ TensorFlow with its CUDA libraries (no torch)",
    "tpu": "+ TensorFlow with the TPU runtime (no torch)",
}


def image(name: str) -> str:
    """A named image, resolved at registration: `pyflyte register --image tpu=REGISTRY/mixedml-tpu:TAG`."""
    if name not in IMAGES:
        raise ValueError(f"unknown image {name!r}, not one of {', '.join(IMAGES)} (tasks/images.py)")
    return f"{{{{.image.{name}.fqn}}}}:{{{{.image.{name}.version}}}}"


if __name__ == "__main__":
    print(" ".join(IMAGES))
