# Everything runs inside .venv, created and kept in sync with pyproject.toml + constraints.txt.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
EXTRAS ?= torch,tf-cpu,gpu,serving,bench,dev

# Images: the demo cluster (`flytectl demo start`) serves a registry on localhost:30000.
REGISTRY ?= localhost:30000
# The registration version. flyteadmin refuses a changed entity under a version it already has, so it
# names the tree: the commit's short hash, and with uncommitted changes (tracked, or untracked and not
# ignored) "-dirty-" and a hash of them, so the same changes give the same version and others a new one.
VERSION ?= $(shell commit=$$(git rev-parse --short=12 HEAD 2>/dev/null) && \
	changes=$$({ git diff --no-ext-diff --no-textconv --no-color --binary HEAD; \
	git ls-files --others --exclude-standard; \
	git ls-files -z --others --exclude-standard | xargs -0 -r git hash-object --; }) && \
	echo "$$commit$${changes:+-dirty-$$(printf %s "$$changes" | git hash-object --stdin | cut -c1-8)}")
# Images are tagged by what goes into them, not by the version: a hash of the files the build reads
# (deploy/image-tag.sh), so an edit that stays out of the images (deploy/schedules.yaml) changes the
# version `make register` registers under but not the images it names, which `make push` pushed.
# Computed once, where first used.
TAG ?= $(eval TAG := $$(shell deploy/image-tag.sh))$(TAG)
# One per Dockerfile stage, named once in tasks/images.py.
IMAGES := $(shell $(PYTHON) -m tasks.images)
IMAGE_FLAGS = $(foreach t,$(IMAGES),--image $(t)=$(REGISTRY)/mixedml-$(t):$(TAG))
PACKAGE := dist/mixedml-flyte-package.tgz
# The scheduled launch plans' inputs and failure notifications, read when pyflyte defines the launch
# plans (workflows/schedules.py): a launch plan whose required inputs are unset registers unscheduled.
SCHEDULES ?= deploy/schedules.yaml
SCHEDULES_ENV = MIXEDML_SCHEDULES=$(abspath $(SCHEDULES))

.PHONY: install run test test-heavy test-all test-fast test-cpus lint format clean images images-check push package register browser bench gpu-check gpu-wheels serving-check

install: $(STAMP)

# uv installs and byte-compiles in parallel (pip takes minutes for torch and TensorFlow). It reads no
# pip configuration, so a local wheel folder pip is pointed at (PIP_FIND_LINKS) is passed on.
FIND_LINKS ?= $(PIP_FIND_LINKS)

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	# constraints.txt pins every package (torch==2.13.0 is the CPU build here) so installs are reproducible.
	$(BIN)/python -m pip install --quiet --upgrade -c constraints.txt pip uv
	$(BIN)/uv pip install --quiet --compile-bytecode --python $(BIN)/python \
		$(addprefix --find-links ,$(FIND_LINKS)) -c constraints.txt -e ".[$(EXTRAS)]"
	touch $(STAMP)

run: install
	$(BIN)/pyflyte run workflows/pipeline.py training_pipeline

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# Two pytest workers: most slow tests wait on processes they started (workflow runs, DDP workers,
# pods), so two share two cores well. TEST_WORKERS=0 runs the suite in one process.
TEST_WORKERS ?= 2
PYTEST := $(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadgroup

# `make test` proves each path once and leaves out the tests marked `heavy`: the scenarios built on
# those paths (the README's commands, the benchmark smokes, runs killed and resumed, failures in one
# DDP rank; docs/testing.md). `make test-heavy` runs those, `make test-all` both. CI runs `make test`,
# then `make test-heavy`.
test: lint browser
	$(PYTEST) -m "not heavy"

test-heavy: install
	$(PYTEST) -m heavy

test-all: lint browser
	$(PYTEST)

# The unit folder only, without the tests marked `slow` there (those that train a model for seconds).
test-fast: lint
	$(PYTEST) tests/unit -m "not slow"

# The unit folder, slow tests too, three times: on this CPU, then with torch, MKL, oneDNN, numpy and
# OpenBLAS held to AVX2, then to SSE4 (no AVX). A float compared exactly where the kernels differ by
# CPU or batch shape fails here rather than on a user's machine (docs/testing.md). Not in `make test`.
# All three run, whatever one of them gives; the target fails where any did.
CPU_AVX2 := ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2 \
	OPENBLAS_CORETYPE=Haswell NPY_DISABLE_CPU_FEATURES=X86_V4,AVX512_ICL,AVX512_SPR
CPU_SSE4 := ATEN_CPU_CAPABILITY=default MKL_ENABLE_INSTRUCTIONS=SSE4_2 ONEDNN_MAX_CPU_ISA=SSE41 \
	OPENBLAS_CORETYPE=Nehalem NPY_DISABLE_CPU_FEATURES=X86_V3,X86_V4,AVX512_ICL,AVX512_SPR

test-cpus: install
	@failed=; for cpu in "" "$(CPU_AVX2)" "$(CPU_SSE4)"; do \
		echo "make test-cpus: the unit tests with $${cpu:-this CPU as it is}"; \
		env $$cpu $(PYTEST) tests/unit || failed="$$failed\n  $${cpu:-this CPU as it is}"; \
	done; test -z "$$failed" || { printf "make test-cpus: failed with$$failed\n" >&2; exit 1; }

# Full-size benchmarks (minutes); the tests run the same harness with --smoke.
bench: install
	$(BIN)/python -m benchmarks

# On a CUDA machine: the CUDA-only checks and the GPU figures, one summary (GPU_CHECK_ARGS="--smoke"
# for small sizes). It needs only torch, numpy, pandas, pyarrow and scikit-learn, except the steps that
# `pyflyte run` the pipeline: where flytekit is missing, it installs .gpu-wheels (`make gpu-wheels`,
# built elsewhere) offline into .gpu-site first (benchmarks/gpu_wheels.py).
gpu-check:
	$(if $(wildcard $(BIN)/python),$(BIN)/python,python3) -m benchmarks.gpu_check $(GPU_CHECK_ARGS)

# Here, for a GPU machine without Flyte or an index: the wheels `pyflyte run` of the pipeline imports,
# less what its image has, for its Python (GPU_PYTHON_VERSION) and x86-64 Linux, into .gpu-wheels.
GPU_PYTHON_VERSION ?= 3.12
gpu-wheels: install
	$(BIN)/python -m benchmarks.gpu_wheels --python-version $(GPU_PYTHON_VERSION) --dest .gpu-wheels

# A bundle's MLflow model served by a real `mlflow models serve` on 127.0.0.1, checked against the bundle and
# timed against onnxruntime in-process (SERVING_CHECK_ARGS="--smoke" for few requests). mlflow installs
# into an environment of its own, from deploy/serving-constraints.txt: not the project's, nor `make test`'s.
serving-check: install
	test -x .venv-serving/bin/python || $(BIN)/python -m venv .venv-serving
	$(BIN)/uv pip install --quiet --python .venv-serving/bin/python $(addprefix --find-links ,$(FIND_LINKS)) \
		-c deploy/serving-constraints.txt mlflow onnxruntime
# --no-deps: only the wheel's tritonserver and python backend are used (deploy/serving-constraints.txt)
	$(BIN)/uv pip install --quiet --python .venv-serving/bin/python $(addprefix --find-links ,$(FIND_LINKS)) \
		-c deploy/serving-constraints.txt --no-deps nvidia-pytriton
# The python backend's stub needs numpy 1 (benchmarks/triton_check.py): an environment of its own for it
	test -x .venv-serving/triton-stub/bin/python || $(BIN)/python -m venv .venv-serving/triton-stub
	$(BIN)/uv pip install --quiet --python .venv-serving/triton-stub/bin/python $(addprefix --find-links ,$(FIND_LINKS)) \
		--no-deps numpy==1.26.4 onnxruntime==1.32.0 flatbuffers==25.12.19 packaging==26.4 protobuf==7.36.2
	$(BIN)/python -m benchmarks.serving_check --serving-venv .venv-serving $(SERVING_CHECK_ARGS)

# Headless Chromium for the Deck rendering test; without it that one test is skipped, saying why.
browser:
	@command -v chromium >/dev/null 2>&1 || { command -v apt-get >/dev/null 2>&1 && \
		(apt-get update -qq && apt-get install -y -qq chromium >/dev/null) ; } || \
		echo "chromium could not be installed: the browser test will be skipped"

format: install
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

images:
	@test -n "$(TAG)" || { echo "make images: no content hash to tag the images with; pass TAG=..." >&2; exit 1; }
	for target in $(IMAGES); do docker build --target $$target -t $(REGISTRY)/mixedml-$$target:$(TAG) . || exit 1; done

push: images
	for target in $(IMAGES); do docker push $(REGISTRY)/mixedml-$$target:$(TAG) || exit 1; done

# Each image's install set resolved for linux/x86_64 by pip, without building; needs the package index.
images-check: install
	$(BIN)/python deploy/check_images.py

# Settings read where tasks/hardware.py is imported: by pyflyte as it serializes, and in the pods, where
# `--env` puts them in every task's container (flytekit 1.16, core/python_auto_container.py,
# PythonAutoContainerTask._get_container adds SerializationSettings.env):
# - MIXEDML_EXTRA_OPTIONS, the planner's opt-in options (docs/planning.md), read by the planning tasks;
# - MIXEDML_GPUDIRECT, the multi-node pods' GPUDirect networking (deploy/gpudirect/README.md). A dynamic
#   serializes the tasks it launches again in its own pod (core/python_function_task.py,
#   PythonFunctionTask.compile_into_workflow), and what propeller runs is that: without the variable in
#   train_on_target's pod, the multi-node task it launches would run without GPUDirect.
EXTRA_OPTIONS_FLAG = $(if $(MIXEDML_EXTRA_OPTIONS),--env MIXEDML_EXTRA_OPTIONS="$(MIXEDML_EXTRA_OPTIONS)")
GPUDIRECT_FLAG = $(if $(MIXEDML_GPUDIRECT),--env MIXEDML_GPUDIRECT="$(MIXEDML_GPUDIRECT)")
SETTINGS_FLAGS = $(EXTRA_OPTIONS_FLAG) $(GPUDIRECT_FLAG)

# Serialized tasks, workflows and launch plans, as the cluster would receive them.
package: install
	mkdir -p dist
	$(SCHEDULES_ENV) $(BIN)/pyflyte --pkgs workflows package $(IMAGE_FLAGS) $(SETTINGS_FLAGS) \
		--output $(PACKAGE) --force

# --copy none: the images hold the code, tagged by it. pyflyte register uploads the tree by default
# (--copy all) and every pod then unpacks it into --destination-dir, /root unless set, which the images'
# user cannot write: each task would fail before it ran (flytekit clis/sdk_in_container/register.py).
# No --activate-launchplans: it activates every launch plan registered, complete or not. A scheduled
# launch plan with all its inputs is defined with auto_activate, which pyflyte register honours
# (flytekit/remote/remote.py, FlyteRemote.raw_register), so only those are activated.
# The settings above and a schedules file other than the tree's change what registers without changing
# the tree, so a version computed from the tree gets a hash of them too (the images keep their tag).
SETTINGS_CHANGED = $(and $(filter file,$(origin VERSION)),$(or $(MIXEDML_EXTRA_OPTIONS),$(MIXEDML_GPUDIRECT),$(filter-out deploy/schedules.yaml,$(SCHEDULES))))
REGISTER_VERSION = $(VERSION)$(if $(SETTINGS_CHANGED),-settings-$(shell { echo "$(MIXEDML_EXTRA_OPTIONS)"; \
	echo "$(MIXEDML_GPUDIRECT)"; cat "$(SCHEDULES)" 2>/dev/null; } | git hash-object --stdin | cut -c1-8))

register: install
	@test -n "$(VERSION)" || { echo "make register: no git commit to name the version after; pass VERSION=..." >&2; exit 1; }
	$(SCHEDULES_ENV) $(BIN)/pyflyte --config flyte.config.yaml register workflows $(IMAGE_FLAGS) \
		$(SETTINGS_FLAGS) --copy none --version $(REGISTER_VERSION)

clean:
	rm -rf $(VENV) .venv-serving dist .pytest_cache
