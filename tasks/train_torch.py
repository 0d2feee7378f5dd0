"""GPU training with PyTorch DDP, launched by torch elastic through flytekitplugins-kfpytorch.

One node: a single pod runs one worker per GPU. More nodes: a Kubeflow PyTorchJob. Outside a
PyTorchJob (a laptop, CI) the launch is fitted to the machine: one node, and 2 gloo workers on CPU.
Hardware comes from the profiles in tasks/hardware.py.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import signal
import time
from dataclasses import dataclass, replace

import flytekit
from flytekit import task
from flytekit.core.base_task import IgnoreOutputs
from flytekit.core.task import TaskPlugins
from flytekit.exceptions.user import FlyteUserRuntimeException
from flytekit.types.directory import FlyteDirectory
from flytekitplugins.kfpytorch import CleanPodPolicy, Elastic, RunPolicy
from flytekitplugins.kfpytorch.task import PytorchElasticFunctionTask

from tasks.core.accelerators.rule import on_flyte_cluster
from tasks.core.messages import raise_for
from tasks.core.models.torch_startup import rendezvous_events_named_without_stack_walks
from tasks.core.training.config import TrainConfig
from tasks.core.training.job_completion import wait_for_rank_zero, written_by_rank_zero
from tasks.core.training.launch import (
    DEFAULT_LOCAL_CPU_WORKERS,
    local_cpu_workers,
    plan_launch,
    worker_failure,
)
from tasks.core.training.preemption import DEFAULT_GRACE_S
from tasks.core.training.telemetry import UtilisationSampler
from tasks.core.validation import batch_problems
from tasks.ddp_worker import SetUpRefused, train_with_ddp
from tasks.gpudirect import apply_node_profile
from tasks.hardware import (
    LAUNCHER_EXIT_MARGIN_S,
    TRAIN_GPU,
    TRAIN_GPU_MULTINODE,
    TRIAL_CACHE,
    GpuTrainingProfile,
)
from tasks.plumbing.decks import DECKS, training_deck
from tasks.plumbing.failures import retried_as_recoverable
from tasks.plumbing.preemption_exit import preempted_exit
from tasks.plumbing.storage import flyte_filesystem, require_local_copies
from tasks.types import PreparedData, TrainedModel

log = logging.getLogger(__name__)


@dataclass
class MachineFittedElastic(Elastic):
    """`Elastic` whose launch is fitted to the machine when it runs outside a PyTorchJob."""

    local_cpu_workers: int = DEFAULT_LOCAL_CPU_WORKERS
    preemption_grace_s: int = DEFAULT_GRACE_S
    # How long a PyTorchJob pod without rank 0 waits, once its workers are done, for rank 0's outputs.
    rank_zero_outputs_timeout_s: int = 900
    # Then how long it waits for rank 0's Deck, which flytekit uploads after the outputs.
    rank_zero_deck_timeout_s: int = 60


class NoticeWhileWaiting(Exception):
    """SIGTERM reached a pod waiting for rank 0's outputs."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class MachineFittedElasticTask(PytorchElasticFunctionTask):
    """Launches the workers fitted to the machine. The launcher process, idle while they train,
    samples the node's utilisation and draws the Training Deck from rank 0's result, so no rank
    spends time on charts between its last step and its exit."""

    def execute(self, **kwargs):
        """The plugin's launch, its failures classified for Flyte's retries (tasks/plumbing/failures.py)."""
        with retried_as_recoverable():
            return super().execute(**kwargs)

    def _execute(self, **kwargs):
        if on_flyte_cluster():
            self.require_declared_gpus()
        with UtilisationSampler() as sampler:
            trained = self._launch_fitted(**kwargs)  # only the launcher that holds rank 0 returns
        if isinstance(trained, SetUpRefused):
            from tasks.core.training.torch_ddp import SetUpFailed

            raise SetUpFailed(trained.message)  # a user error: Flyte does not retry it
        training_deck(trained, sampler.samples)
        return trained

    def require_declared_gpus(self) -> None:
        """On a cluster, refuse to start unless the GPUs the task declared are usable: the local CPU
        fallback there would be a silent wrong result."""
        from tasks.core.accelerators.cuda_check import require_cuda

        gpus = self.task_config.nproc_per_node
        device = self.accelerator.to_flyte_idl().device if self.accelerator else "NVIDIA"
        require_cuda(f"{gpus} x {device} GPU (its pod requests nvidia.com/gpu)", gpus)

    def _launch_stopping_on_signal(self, **kwargs):
        """On SIGTERM (the preemption notice) torch elastic passes the signal to the workers, waits for
        them to save, and the plugin turns the agent's `SignalException` into `IgnoreOutputs`: a
        successful exit without outputs. End it as a preempted attempt instead (tasks/plumbing/preemption_exit.py),
        which propeller retries."""
        from torch.distributed.elastic.multiprocessing.api import SignalException
        from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
        from torch.distributed.elastic.rendezvous import RendezvousError

        try:
            return super()._execute(**kwargs)
        except FlyteUserRuntimeException as failed:
            # The plugin's report of a worker that failed without a recoverable error: the first
            # failure's rank and error instead of torch elastic's whole report.
            if isinstance(failed.value, ChildFailedError):
                raise worker_failure(failed.value) from failed.value
            raise
        except RendezvousError as error:
            # A node that never joined: the plugin catches only ChildFailedError and SignalException.
            joined = self.task_config.rdzv_configs.get("join_timeout")
            raise type(error)(
                f"torch elastic rendezvous failed ({error or 'timed out'}): "
                f"{self.min_nodes} node(s) were to join within {joined} s"
            ) from error
        except IgnoreOutputs as ignored:
            if ignored.__context__ is None:  # this node's workers finished, and rank 0 is elsewhere
                self.wait_for_rank_zero_outputs()
                raise
            if isinstance(ignored.__context__, SignalException):
                stop_remaining_workers(ignored.__context__.sigval, self.task_config.preemption_grace_s)
                log.warning("training stopped by %s; a retried attempt resumes from the checkpoint",
                            ignored.__context__.sigval.name)  # fmt: skip
                raise preempted_exit(ignored.__context__.sigval) from ignored.__context__
            raise

    def wait_for_rank_zero_outputs(self) -> None:
        """Keeps this pod from succeeding, and so the PyTorchJob from completing, before rank 0's pod
        has written the task's outputs (tasks/core/training/job_completion.py says why).

        SIGTERM while waiting: once rank 0's result is written, the job is complete and the operator
        deletes this pod (`cleanPodPolicy: Running`), which then exits without writing anything, so no
        error document of its own lands beside rank 0's outputs. Before that, the node is going away
        while rank 0 saves: the attempt ends as a preempted one."""
        prefix = flytekit.current_context().output_metadata_prefix
        if not prefix:
            return
        config = self.task_config
        filesystem = flyte_filesystem(prefix)
        deck_timeout_s = config.rank_zero_deck_timeout_s if self.enable_deck else 0
        try:
            with notice_raised_while_waiting():
                wait_for_rank_zero(filesystem, prefix, config.rank_zero_outputs_timeout_s, deck_timeout_s)
        except NoticeWhileWaiting as notice:
            if written_by_rank_zero(filesystem, prefix) is None:
                raise preempted_exit(notice.signum) from None
            log.info("%s after rank 0 wrote its result: the job is complete", notice)

    def _launch_fitted(self, **kwargs):
        import torch

        # On GPUDirect nodes the pod names the node's NCCL profile; the workers inherit its settings.
        if sourced := apply_node_profile(os.environ):
            log.info("NCCL settings from the node's profile: %s", ", ".join(sorted(sourced)))
        configured = (self.task_config, self.min_nodes, self.max_nodes)
        launch = plan_launch(
            self.min_nodes,
            self.max_nodes,
            self.task_config.nproc_per_node,
            in_pytorch_job="PET_NNODES" in os.environ,
            gpu_count=torch.cuda.device_count(),
            local_cpu_workers=local_cpu_workers(self.task_config.local_cpu_workers, os.environ),
            on_cluster=on_flyte_cluster(),
        )
        for note in launch.notes:
            log.warning(note)
        # A configuration error or a missing input fails every worker the same way: refuse it here,
        # before any worker starts.
        world_size = launch.nproc_per_node * launch.max_nodes
        prepared = kwargs["prepared"]
        raise_for(batch_problems(kwargs["hyperparameters"], world_size, prepared.table.rows["train"]))
        require_local_copies({"train split": prepared.train, "val split": prepared.val})
        # The agent waits this long for the workers' preemption save before it kills them (default 30 s).
        grace = self.task_config.preemption_grace_s + LAUNCHER_EXIT_MARGIN_S
        os.environ.setdefault("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", str(grace))
        self._task_config = replace(self.task_config, nproc_per_node=launch.nproc_per_node)
        self.min_nodes, self.max_nodes = launch.min_nodes, launch.max_nodes
        try:
            with notice_acted_on_once(), rendezvous_events_named_without_stack_walks():
                return self._launch_stopping_on_signal(**kwargs)
        finally:
            self._task_config, self.min_nodes, self.max_nodes = configured


@contextlib.contextmanager
def notice_raised_while_waiting():
    def raise_notice(signum, frame):
        signal.signal(signum, signal.SIG_IGN)
        raise NoticeWhileWaiting(signum)

    previous = signal.signal(signal.SIGTERM, raise_notice)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def notice_acted_on_once():
    """torch elastic's agent raises `SignalException` from its signal handler on every notice,
    wherever the launcher is: a repeat that lands while it shuts down, or while flytekit formats the
    first one's traceback, cuts that short and can end the launcher by the signal itself. Here the
    first notice is raised as before and the handler then ignores the signal. `PContext.start`
    installs the handler by its module-level name (torch/distributed/elastic/multiprocessing/api.py),
    which is what this replaces for the launch; tests/integration/test_launcher_signal.py pins that."""
    from torch.distributed.elastic.multiprocessing import api

    raise_on_notice = api._terminate_process_handler

    def raise_once(signum, frame):
        signal.signal(signum, signal.SIG_IGN)
        raise_on_notice(signum, frame)

    api._terminate_process_handler = raise_once
    try:
        yield
    finally:
        api._terminate_process_handler = raise_on_notice


def stop_remaining_workers(sigval: signal.Signals, budget_s: float) -> None:
    """Passes the notice on to any worker still running, waits up to `budget_s` for it, then kills it:
    the launcher never leaves a worker behind, whether or not the agent's own shutdown ran its course."""
    # The workers are this process's non-daemon multiprocessing children (MultiprocessContext._start,
    # `mp.start_processes(..., daemon=False)`), and the agent's wait for them is no guarantee: its
    # handler, installed by PContext.start and never removed, raises a new SignalException out of
    # `proc.join` in MultiprocessContext._close on a repeated notice, and `_close` signals and joins
    # nothing when the notice comes before `self._pc` is set (torch/distributed/elastic/
    # multiprocessing/api.py). Ignoring the signal from here on keeps a repeat from cutting this short.
    signal.signal(sigval, signal.SIG_IGN)
    workers = multiprocessing.active_children()  # reaps the exited ones; the resource tracker is no child
    if not workers:
        return
    for worker in workers:
        with contextlib.suppress(ProcessLookupError):
            os.kill(worker.pid, sigval)  # one still saving ignores a repeat; one past its save ends
    started = time.monotonic()
    for worker in workers:
        worker.join(max(0.0, started + budget_s - time.monotonic()))
    killed = [worker.pid for worker in workers if worker.is_alive()]
    for worker in workers:
        if worker.is_alive():
            worker.kill()
            worker.join(5)
    log.warning(
        "%d worker process(es) outlived the agent's shutdown: waited %.1f s for them, killed %s",
        len(workers), time.monotonic() - started, killed or "none",
    )  # fmt: skip


TaskPlugins.register_pythontask_plugin(MachineFittedElastic, MachineFittedElasticTask)


def elastic(profile: GpuTrainingProfile) -> MachineFittedElastic:
    timeout = profile.rendezvous_timeout_s
    return MachineFittedElastic(
        nnodes=profile.nnodes,
        nproc_per_node=profile.gpus_per_node,
        local_cpu_workers=profile.local_cpu_workers,
        # c10d rendezvous: the TCPStore read timeout must cover the slowest node's start too.
        rdzv_configs={"timeout": timeout, "join_timeout": timeout, "read_timeout": timeout},
        # 0: a failed worker ends the attempt at once, and Flyte's retry decides (docs/reliability.md).
        max_restarts=profile.max_restarts,
        # How often the agent checks its workers: a dead or failed rank stops the group this fast,
        # and the task returns this soon after the last rank finishes. Polling is cheap; torchrun's default.
        monitor_interval=0.1,
        preemption_grace_s=profile.attempts.preemption_grace_s,
        # Used only by a PyTorchJob (nnodes > 1). The operator ends the job at the attempt's timeout,
        # deleting its pods. Once the job has Succeeded or Failed it deletes the pods still running or
        # pending, which frees their nodes, and keeps the finished ones' logs (training-operator v1.8.1,
        # pkg/controller.v1/common/job.go, `DeletePodsAndServices`); a pod without rank 0 waits for rank
        # 0's outputs and Deck before it exits (docs/reliability.md).
        run_policy=RunPolicy(
            clean_pod_policy=CleanPodPolicy.RUNNING,
            active_deadline_seconds=int(profile.attempts.timeout.total_seconds()),
        ),
    )


@task(task_config=elastic(TRAIN_GPU), **TRAIN_GPU.task_options(), **DECKS)
def train_torch(
    prepared: PreparedData, hyperparameters: TrainConfig, resume_from: FlyteDirectory | None = None
) -> TrainedModel:
    """PyTorch DDP on one GPU node (one pod, one worker per GPU); with `resume_from`, continuing the
    run whose checkpoint it is (a promoted tuning trial)."""
    return train_with_ddp(prepared, hyperparameters, TRAIN_GPU, resume_from)


@task(task_config=elastic(TRAIN_GPU_MULTINODE), **TRAIN_GPU_MULTINODE.task_options(), **DECKS)
def train_torch_multinode(
    prepared: PreparedData, hyperparameters: TrainConfig, resume_from: FlyteDirectory | None = None
) -> TrainedModel:
    """PyTorch DDP over several GPU nodes: a Kubeflow PyTorchJob, NCCL between nodes; with
    `resume_from`, continuing the run whose checkpoint it is (a promoted tuning trial)."""
    return train_with_ddp(prepared, hyperparameters, TRAIN_GPU_MULTINODE, resume_from)


@task(task_config=elastic(TRAIN_GPU), **TRAIN_GPU.task_options(), **DECKS, cache=TRIAL_CACHE)
def train_torch_trial(
    prepared: PreparedData, hyperparameters: TrainConfig, resume_from: FlyteDirectory | None = None
) -> TrainedModel:
    """`train_torch`, cached: a tuning trial (tasks/tune.py), which a rerun of its study reuses."""
    return train_with_ddp(prepared, hyperparameters, TRAIN_GPU, resume_from)


@task(
    task_config=elastic(TRAIN_GPU_MULTINODE), **TRAIN_GPU_MULTINODE.task_options(), **DECKS, cache=TRIAL_CACHE
)
def train_torch_multinode_trial(
    prepared: PreparedData, hyperparameters: TrainConfig, resume_from: FlyteDirectory | None = None
) -> TrainedModel:
    """`train_torch_multinode`, cached: a tuning trial, which a rerun of its study reuses."""
    return train_with_ddp(prepared, hyperparameters, TRAIN_GPU_MULTINODE, resume_from)
