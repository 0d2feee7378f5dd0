#!/usr/bin/env bash
# The GKE cluster and node pools mixedml's tasks schedule on. Every pool autoscales from zero.
#   PROJECT=my-project deploy/gke-node-pools.sh
#   PROJECT=my-project MIXEDML_EXTRA_OPTIONS="a100-40gb tpu-v6e-1x1" deploy/gke-node-pools.sh  # opt-in pools
# The default pools are those of the planner's default catalog (DEFAULT_OPTIONS in tasks/catalog.py)
# and of the declared profiles. MIXEDML_EXTRA_OPTIONS names further planner options (GPU_OPTIONS,
# TPU_OPTIONS there) to create pools for; pass the same value to `pyflyte register --env
# MIXEDML_EXTRA_OPTIONS=...` so that the planner may choose them (docs/planning.md).
# Machine types are the ones tasks/hardware.py sizes each profile for (MACHINE_FOR_GPU, TPU_GENERATIONS).
# Pods find their pool through node labels GKE sets: cloud.google.com/gke-accelerator and
# gke-gpu-partition-size (from --accelerator), gke-tpu-accelerator and gke-tpu-topology (from the TPU
# machine type), gke-spot (from --spot). The TPU pools are single-host slices, where GKE refuses
# --tpu-topology (a flag for multi-host slices) and labels the node with the machine type's own
# topology, which the TPU pod template selects on. Accelerators exist in some zones only
# (`gcloud compute accelerator-types list`, `gcloud compute tpus accelerator-types list`); pick ZONE
# accordingly, and check your GPU/TPU quota, on-demand and spot, for it.
set -euo pipefail

PROJECT="${PROJECT:?set PROJECT to your Google Cloud project}"
CLUSTER="${CLUSTER:-flyte}"
REGION="${REGION:-us-central1}"
ZONE="${ZONE:-us-central1-a}"
MAX_NODES="${MAX_NODES:-4}"
# Planner options beyond the default catalog, by the planner's names, created only when named here.
EXTRA="${MIXEDML_EXTRA_OPTIONS:-}"
PYTHON="${PYTHON:-python3}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# GKE installs the NVIDIA driver. The torch-gpu image's torch 2.13 is PyPI's CUDA 13.0 build, which
# needs driver >= DRIVER_FLOOR. `default` installs an older branch; `latest` installs the driver the
# node's COS release labels LATEST, which depends on the GKE version. So rather than pin a GKE version,
# before each GPU pool gke_driver_floor.py looks up, in the files GKE's GPU page points to, the driver
# `latest` gives on the cluster's version, and stops the script when it is below the floor (a look-up
# that fails only warns; SKIP_DRIVER_CHECK=1 skips it). The cluster is on the regular release channel, whose
# upgrades only move forward; the training task also checks the driver at start and fails naming it.
DRIVER_FLOOR=580.65.06
DRIVER=gpu-driver-version=latest

accelerator_type() { # the type= of the --accelerator flag among the arguments; none for a CPU or TPU pool
  while (($#)); do
    if [[ $1 == --accelerator ]]; then
      local spec="${2#type=}"
      echo "${spec%%,*}"
    fi
    shift
  done
}

require_driver_floor() { # require_driver_floor ACCELERATOR: stop unless `latest` meets DRIVER_FLOOR
  if [[ ${SKIP_DRIVER_CHECK:-} == 1 ]]; then return; fi
  "$PYTHON" "$HERE/gke_driver_floor.py" "$GKE_VERSION" "$1" "$DRIVER_FLOOR"
}

pool() { # pool NAME FLAGS...: on-demand nodes, none until a pod needs one (--num-nodes defaults to 3)
  local gpu
  gpu="$(accelerator_type "${@:2}")"
  if [[ -n $gpu ]]; then require_driver_floor "$gpu"; fi
  gcloud container node-pools create "$1" --project "$PROJECT" --cluster "$CLUSTER" --location "$REGION" \
    --node-locations "$ZONE" --num-nodes 0 --enable-autoscaling --min-nodes 0 --max-nodes "$MAX_NODES" "${@:2}"
}

# Interruptible (training) pods run on the tainted spot twin. Their first attempt must run there; once
# it fails (a preemption, or no spot capacity: Pending past pod-pending-timeout), the later attempts
# run on demand (propeller's node-config and plugins.k8s interruptible-* settings in
# deploy/flyte-binary-values.yaml). So every training pool has both. On a spot node GKE gives pods 15 s
# of the VM's 30 s notice, which the training tasks' terminationGracePeriodSeconds fits
# (docs/reliability.md).
training_pool() { # training_pool NAME FLAGS...
  pool "$1" "${@:2}"
  pool "$1-spot" --spot --node-taints cloud.google.com/gke-spot=true:NoSchedule "${@:2}"
}

optional_pool() { # optional_pool OPTION FLAGS...: a training pool for a planner option EXTRA names
  # Pool names take no dots: a100-mig-2g.10gb -> a100-mig-2g-10gb.
  if [[ " ${EXTRA//,/ } " == *" $1 "* ]]; then training_pool "${1//./-}" "${@:2}"; fi
}

# The cluster, if it does not exist yet; its default pool runs flyte-binary and the training operator.
gcloud container clusters describe "$CLUSTER" --project "$PROJECT" --location "$REGION" >/dev/null 2>&1 ||
  gcloud container clusters create "$CLUSTER" --project "$PROJECT" --location "$REGION" \
    --node-locations "$ZONE" --num-nodes 1 --machine-type e2-standard-4 --workload-pool "$PROJECT.svc.id.goog" \
    --release-channel regular
# New node pools get the control plane's version.
GKE_VERSION="$(gcloud container clusters describe "$CLUSTER" --project "$PROJECT" --location "$REGION" \
  --format 'value(currentMasterVersion)')"

# preprocess (2 CPU; when planned up to 4 CPU and this machine's allocatable memory, 27Gi: CPU_NODE in
# tasks/hardware.py, and a table that needs more fails in planning), evaluate, compare,
# dataset_partition and the two planning tasks.
pool cpu --machine-type n2-standard-8

# train_torch, train_tf_gpu (1 x L4); planner option l4.
training_pool l4 --machine-type g2-standard-8 --accelerator "type=nvidia-l4,count=1,$DRIVER"
# train_torch_multinode (2 nodes x 8 H100, a PyTorchJob: MAX_NODES >= 2), on demand (docs/reliability.md);
# planner option h100-80gb, spot first.
training_pool h100 --machine-type a3-highgpu-8g --accelerator "type=nvidia-h100-80gb,count=8,$DRIVER"
# train_tf_tpu as declared (v5e 2x2); planner option tpu-v5e-2x2.
training_pool tpu-v5e-2x2 --machine-type ct5lp-hightpu-4t
# Planner option tpu-v5e-1x1: what the default run of the tpu target picks (plan_resources=True).
training_pool tpu-v5e-1x1 --machine-type ct5lp-hightpu-1t
# Planner option a100-mig-1g.5gb: what the default run of the gpu and gpu-tf targets picks.
training_pool a100-mig-1g-5gb --machine-type a2-highgpu-1g \
  --accelerator "type=nvidia-tesla-a100,count=1,gpu-partition-size=1g.5gb,$DRIVER"

# The other planner options (GPU_OPTIONS, TPU_OPTIONS in tasks/catalog.py), by the planner's names.
optional_pool a100-mig-2g.10gb --machine-type a2-highgpu-1g \
  --accelerator "type=nvidia-tesla-a100,count=1,gpu-partition-size=2g.10gb,$DRIVER"
optional_pool a100-mig-3g.20gb --machine-type a2-highgpu-1g \
  --accelerator "type=nvidia-tesla-a100,count=1,gpu-partition-size=3g.20gb,$DRIVER"
optional_pool h100-mig-1g.10gb --machine-type a3-highgpu-8g \
  --accelerator "type=nvidia-h100-80gb,count=8,gpu-partition-size=1g.10gb,$DRIVER"
optional_pool h100-mig-2g.20gb --machine-type a3-highgpu-8g \
  --accelerator "type=nvidia-h100-80gb,count=8,gpu-partition-size=2g.20gb,$DRIVER"
optional_pool h100-mig-3g.40gb --machine-type a3-highgpu-8g \
  --accelerator "type=nvidia-h100-80gb,count=8,gpu-partition-size=3g.40gb,$DRIVER"
optional_pool h200-mig-1g.18gb --machine-type a3-ultragpu-8g \
  --accelerator "type=nvidia-h200-141gb,count=8,gpu-partition-size=1g.18gb,$DRIVER"
optional_pool h200-mig-2g.35gb --machine-type a3-ultragpu-8g \
  --accelerator "type=nvidia-h200-141gb,count=8,gpu-partition-size=2g.35gb,$DRIVER"
optional_pool h200-mig-3g.71gb --machine-type a3-ultragpu-8g \
  --accelerator "type=nvidia-h200-141gb,count=8,gpu-partition-size=3g.71gb,$DRIVER"
optional_pool a100-40gb --machine-type a2-highgpu-1g --accelerator "type=nvidia-tesla-a100,count=1,$DRIVER"
optional_pool a100-80gb --machine-type a2-ultragpu-1g --accelerator "type=nvidia-a100-80gb,count=1,$DRIVER"
optional_pool h200-141gb --machine-type a3-ultragpu-8g --accelerator "type=nvidia-h200-141gb,count=8,$DRIVER"
optional_pool tpu-v5e-2x4 --machine-type ct5lp-hightpu-8t
optional_pool tpu-v6e-1x1 --machine-type ct6e-standard-1t
