# syntax=docker/dockerfile:1.7
# One image per hardware target; tasks name theirs (cpu, gpu, tpu) and registration resolves them:
#   docker build --target cpu -t REGISTRY/mixedml-cpu:TAG .
#   pyflyte --config flyte.config.yaml register workflows \
#       --image cpu=REGISTRY/mixedml-cpu:TAG --image gpu=REGISTRY/mixedml-gpu:TAG --image tpu=REGISTRY/mixedml-tpu:TAG

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
RUN pip install --no-deps . && chown -R mixedml /home/mixedml
USER mixedml

# ---- gpu: CUDA PyTorch (wheels bundle CUDA) and TensorFlow for GPU; also runs evaluation -----
FROM base AS gpu
ARG TENSORFLOW_VERSION=2.21.0
RUN pip install -c constraints.txt ".[torch]" \
    && pip install "tensorflow[and-cuda]==${TENSORFLOW_VERSION}"
COPY tasks ./tasks
COPY workflows ./workflows
RUN pip install --no-deps . && chown -R mixedml /home/mixedml
USER mixedml

# ---- tpu: TensorFlow with the TPU runtime (libtpu) --------------------------------------------
FROM base AS tpu
ARG TENSORFLOW_TPU_VERSION=2.20.0
RUN pip install -c constraints.txt . \
    && pip install "tensorflow-tpu==${TENSORFLOW_TPU_VERSION}" \
       -f https://storage.googleapis.com/libtpu-tf-releases/index.html
COPY tasks ./tasks
COPY workflows ./workflows
RUN pip install --no-deps . && chown -R mixedml /home/mixedml
USER mixedml
