#!/usr/bin/env bash
# The GKE cluster and node pools mixedml's tasks schedule on. Every pool autoscales from zero.
#   PROJECT=my-project deploy/gke-node-pools.sh
#   PROJECT=my-project OPTIONAL="a100-40gb tpu-v6e-1x1" deploy/gke-node-pools.sh   # add optional pools
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
# Pools for planner options the default run does not pick, created only when named here.
OPTIONAL="${OPTIONAL:-}"
# GKE installs the NVIDIA driver. The torch-gpu image's torch 2.13 is PyPI's CUDA 13.0 build, which
# needs driver >= 580.65.06; `default` installs an older branch, `latest` the newest one the node's
# GKE version offers (GKE's "Install NVIDIA GPU device drivers" page maps versions to drivers: use a
# GKE version whose latest is R580 or newer). The training task checks the driver at start and fails
# naming the one it found.
DRIVER=gpu-driver-version=latest

pool() { # pool NAME FLAGS...: on-demand nodes, none until a pod needs one (--num-nodes defaults to 3)
  gcloud container node-pools create "$1" --project "$PROJECT" --cluster "$CLUSTER" --location "$REGION" \
    --node-locations "$ZONE" --num-nodes 0 --enable-autoscaling --min-nodes 0 --max-nodes "$MAX_NODES" "${@:2}"
}

# Interruptible (training) pods run on the tainted spot twin; once their system failures (preemptions,
# lost nodes) use up the budget propeller allows, the last attempt runs on demand (plugins.k8s
# interruptible-* settings in deploy/flyte-binary-values.yaml). On a spot node GKE gives pods 15 s of
# the VM's 30 s notice, which the training tasks' terminationGracePeriodSeconds fits (docs/reliability.md).
training_pool() { # training_pool NAME FLAGS...
  pool "$1" "${@:2}"
  pool "$1-spot" --spot --node-taints cloud.google.com/gke-spot=true:NoSchedule "${@:2}"
}

optional_pool() { # optional_pool NAME FLAGS...: a training pool, only if OPTIONAL names it
  if [[ " $OPTIONAL " == *" $1 "* ]]; then training_pool "$@"; fi
}

# The cluster, if it does not exist yet; its default pool runs flyte-binary and the training operator.
gcloud container clusters describe "$CLUSTER" --project "$PROJECT" --location "$REGION" >/dev/null 2>&1 ||
  gcloud container clusters create "$CLUSTER" --project "$PROJECT" --location "$REGION" \
    --node-locations "$ZONE" --num-nodes 1 --machine-type e2-standard-4 --workload-pool "$PROJECT.svc.id.goog"

# preprocess (2 CPU; when planned up to 4 CPU and this machine's allocatable memory, 27Gi: CPU_NODE in
# tasks/hardware.py, and a table that needs more fails in planning), evaluate, compare,
# dataset_partition and the two planning tasks.
pool cpu --machine-type n2-standard-8

# train_torch, train_tf_gpu (1 x L4); planner option l4.
training_pool l4 --machine-type g2-standard-8 --accelerator "type=nvidia-l4,count=1,$DRIVER"
# train_torch_multinode (2 nodes x 8 H100, a PyTorchJob: MAX_NODES >= 2) runs on the on-demand pool
# only: it is not interruptible, since a reclaimed spot node fails the whole job as a user error, and
# user errors never move a retry off spot. The spot twin serves the planner option h100-80gb.
training_pool h100 --machine-type a3-highgpu-8g --accelerator "type=nvidia-h100-80gb,count=8,$DRIVER"
# train_tf_tpu (v5e 2x2); planner option tpu-v5e-2x2.
training_pool tpu-v5e-2x2 --machine-type ct5lp-hightpu-4t
# Planner option a100-mig-1g.5gb: what the default run picks (plan_resources=True).
training_pool a100-mig-1g-5gb --machine-type a2-highgpu-1g \
  --accelerator "type=nvidia-tesla-a100,count=1,gpu-partition-size=1g.5gb,$DRIVER"

# The other planner options (GPU_CATALOG, TPU_CATALOG in tasks/hardware.py); the pool name says which.
optional_pool a100-mig-2g-10gb --machine-type a2-highgpu-1g \
  --accelerator "type=nvidia-tesla-a100,count=1,gpu-partition-size=2g.10gb,$DRIVER"
optional_pool a100-mig-3g-20gb --machine-type a2-highgpu-1g \
  --accelerator "type=nvidia-tesla-a100,count=1,gpu-partition-size=3g.20gb,$DRIVER"
optional_pool h100-mig-1g-10gb --machine-type a3-highgpu-8g \
  --accelerator "type=nvidia-h100-80gb,count=8,gpu-partition-size=1g.10gb,$DRIVER"
optional_pool h100-mig-2g-20gb --machine-type a3-highgpu-8g \
  --accelerator "type=nvidia-h100-80gb,count=8,gpu-partition-size=2g.20gb,$DRIVER"
optional_pool h100-mig-3g-40gb --machine-type a3-highgpu-8g \
  --accelerator "type=nvidia-h100-80gb,count=8,gpu-partition-size=3g.40gb,$DRIVER"
optional_pool h200-mig-1g-18gb --machine-type a3-ultragpu-8g \
  --accelerator "type=nvidia-h200-141gb,count=8,gpu-partition-size=1g.18gb,$DRIVER"
optional_pool h200-mig-2g-35gb --machine-type a3-ultragpu-8g \
  --accelerator "type=nvidia-h200-141gb,count=8,gpu-partition-size=2g.35gb,$DRIVER"
optional_pool h200-mig-3g-71gb --machine-type a3-ultragpu-8g \
  --accelerator "type=nvidia-h200-141gb,count=8,gpu-partition-size=3g.71gb,$DRIVER"
optional_pool a100-40gb --machine-type a2-highgpu-1g --accelerator "type=nvidia-tesla-a100,count=1,$DRIVER"
optional_pool a100-80gb --machine-type a2-ultragpu-1g --accelerator "type=nvidia-a100-80gb,count=1,$DRIVER"
optional_pool h200-141gb --machine-type a3-ultragpu-8g --accelerator "type=nvidia-h200-141gb,count=8,$DRIVER"
optional_pool tpu-v5e-1x1 --machine-type ct5lp-hightpu-1t
optional_pool tpu-v5e-2x4 --machine-type ct5lp-hightpu-8t
optional_pool tpu-v6e-1x1 --machine-type ct6e-standard-1t
