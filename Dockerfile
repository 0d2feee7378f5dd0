# syntax=docker/dockerfile:1.7
# One image per hardware target and training framework, so a pod pulls only what it runs and a
# CPU pod no CUDA libraries; tasks name theirs (tasks/hardware.py) and registration resolves them:
#   docker build --target torch-gpu -t REGISTRY/mixedml-torch-gpu:TAG .   # `make images` builds all five
#   pyflyte --config flyte.config.yaml register workflows \
#       --image cpu=REGISTRY/mixedml-cpu:TAG --image ml-cpu=REGISTRY/mixedml-ml-cpu:TAG \
#       --image torch-gpu=REGISTRY/mixedml-torch-gpu:TAG --image tf-gpu=REGISTRY/mixedml-tf-gpu:TAG \
#       --image tpu=REGISTRY/mixedml-tpu:TAG
# Versions: constraints.txt, the pin set the tests run against, constrains every install. The
# TensorFlow builds (tensorflow, tensorflow-tpu) and torch's CPU build are named differently from
# its pins (tensorflow_cpu, torch), so their stages read the version out of it with sed: one
# TensorFlow release for every build, and no version number here.

ARG PYTHON_IMAGE=python:3.11.10-slim-bookworm

# ---- shared base: a virtualenv, a non-root user, pinned installs ------------------------------
FROM ${PYTHON_IMAGE} AS base
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH
RUN python -m venv /opt/venv \
    && useradd --create-home --uid 1000 --shell /usr/sbin/nologin mixedml
WORKDIR /home/mixedml/app
# Dependencies first, from an empty package, so code edits do not reinstall them.
COPY pyproject.toml constraints.txt README.md ./
RUN mkdir tasks workflows && touch tasks/__init__.py workflows/__init__.py

# ---- cpu: preprocessing and comparison (flytekit, pandas, pyarrow, scikit-learn) -------------
FROM base AS cpu
RUN pip install -c constraints.txt .
COPY tasks ./tasks
COPY workflows ./workflows
COPY examples ./examples
RUN pip install --no-deps . && chown -R mixedml /home/mixedml
USER mixedml

# ---- ml-cpu: CPU builds of torch and TensorFlow; evaluation and the planner dynamics ----------
# PyPI's Linux torch wheels pull the CUDA libraries; the CPU build comes from PyTorch's own index,
# alone (--no-deps), and the second install finds it there and adds its dependencies from PyPI.
FROM base AS ml-cpu
RUN TORCH=$(sed -n 's/^torch==//p' constraints.txt) \
    && pip install --no-deps --index-url https://download.pytorch.org/whl/cpu "torch==${TORCH:?}+cpu" \
    && pip install -c constraints.txt ".[torch,tf-cpu,serving]"
COPY tasks ./tasks
COPY workflows ./workflows
COPY examples ./examples
RUN pip install --no-deps . && chown -R mixedml /home/mixedml
USER mixedml

# ---- torch-gpu: CUDA PyTorch (PyPI's wheels bundle CUDA) and the PyTorch plugin; no TensorFlow -
FROM base AS torch-gpu
# GKE's device plugin mounts the node's NVIDIA driver at /usr/local/nvidia (lib64, bin) in every GPU
# container and sets no variable for it (GoogleCloudPlatform/container-engine-accelerators:
# cmd/nvidia_gpu/nvidia_gpu.go, the -container-path mount; pkg/gpu/nvidia/manager.go, Envs). Without
# these, CUDA and NVML cannot dlopen libcuda.so.1 / libnvidia-ml.so.1 and no GPU is seen; Google's GPU
# manifests and NVIDIA's CUDA images set the same. Where the NVIDIA container toolkit injects the
# libraries into the linker's own paths instead, the folder is absent and the entry is ignored.
ENV LD_LIBRARY_PATH=/usr/local/nvidia/lib64 \
    PATH=$PATH:/usr/local/nvidia/bin
RUN pip install -c constraints.txt ".[torch,gpu]"
COPY tasks ./tasks
COPY workflows ./workflows
COPY examples ./examples
RUN pip install --no-deps . && chown -R mixedml /home/mixedml
USER mixedml

# ---- tf-gpu: TensorFlow with its CUDA libraries (the and-cuda extra); no torch ----------------
# The and-cuda extra accepts any CUDA 12 release from the one TensorFlow was built and tested with;
# constraints.txt pins the nvidia-*-cu12 wheels to exactly that one (CUDA 12.5, cuDNN 9.3).
FROM base AS tf-gpu
# The node's NVIDIA driver where GKE mounts it, as in torch-gpu.
ENV LD_LIBRARY_PATH=/usr/local/nvidia/lib64 \
    PATH=$PATH:/usr/local/nvidia/bin
RUN TENSORFLOW=$(sed -n 's/^tensorflow[-_]cpu==//p' constraints.txt) \
    && pip install -c constraints.txt ".[gpu]" "tensorflow[and-cuda]==${TENSORFLOW:?}"
COPY tasks ./tasks
COPY workflows ./workflows
COPY examples ./examples
RUN pip install --no-deps . && chown -R mixedml /home/mixedml
USER mixedml

# ---- tpu: TensorFlow with the TPU runtime (libtpu); no torch ----------------------------------
# TensorFlow reaches TPU v5e, v5p and v6e only through libtpu's PJRT plugin, which it loads when it is
# imported and these are set (Cloud TPU, "Run TensorFlow on Cloud TPU VM"; TensorFlow's
# NextPluggableDevice). Without them TensorFlow sees no TPU. The plugin is linked to a fixed path, so
# the variable names no Python version; the build fails if libtpu ships no libtpu.so. libtpu comes at
# constraints.txt's pin: tensorflow-tpu's own requirement admits any later libtpu (docs/tensorflow-tpu.md).
FROM base AS tpu
RUN TENSORFLOW=$(sed -n 's/^tensorflow[-_]cpu==//p' constraints.txt) \
    && pip install -c constraints.txt . "tensorflow-tpu==${TENSORFLOW:?}" \
       -f https://storage.googleapis.com/libtpu-tf-releases/index.html
RUN ln -s "$(find /opt/venv -path '*/site-packages/libtpu/libtpu.so' | head -n 1)" /usr/local/lib/libtpu.so \
    && test -e /usr/local/lib/libtpu.so
ENV PJRT_DEVICE=TPU \
    NEXT_PLUGGABLE_DEVICE_USE_C_API=true \
    TF_PLUGGABLE_DEVICE_LIBRARY_PATH=/usr/local/lib/libtpu.so
# On GKE the TPU pod runs this container as root, the user of GKE's TPU examples, for the TPU devices
# (tasks/hardware.py, TpuSliceProfile.pod_template; docs/tensorflow-tpu.md, "The TPU devices").
COPY tasks ./tasks
COPY workflows ./workflows
COPY examples ./examples
RUN pip install --no-deps . && chown -R mixedml /home/mixedml
USER mixedml
