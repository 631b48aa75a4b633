"""Build the ``tf.distribute`` strategy that runs the replicas: one worker or several.

A MirroredStrategy keeps one copy of every variable per device and sums
gradients across them each step. The cross-device reduction is chosen by device
kind: on GPUs TensorFlow's default (NCCL all-reduce where available); on logical
CPU devices, which all live in the same host memory, reducing onto one device
and broadcasting back (``ReductionToOneDevice``) has the least overhead: more
steps/s than the collective all-reduce TensorFlow picks by default.

Several workers (processes, usually machines) run MultiWorkerMirroredStrategy,
TensorFlow's own collective runtime: gRPC between workers, all-reduce over all
replicas of all workers. :func:`make_strategy` picks one or the other from the
:class:`~evenflow.tf.launch.cluster.Cluster` (``TF_CONFIG``). Two things differ from the
stock strategy:

* **Several replicas per worker on a CPU.** Stock MultiWorkerMirroredStrategy
  uses every GPU of a worker, or exactly one CPU device. Here a worker runs R
  replicas: its first R GPUs, or R logical CPU devices (as for MirroredStrategy),
  so that "2 workers x 2 replicas" can be tested on one CPU machine.
* **A timeout on every wait for the others.** A collective waits for all workers; if
  one died or stopped taking part, the others would wait forever. With
  :class:`Communication`'s ``timeout_seconds`` (default 300 s) a call that waits
  longer raises ``DeadlineExceededError`` instead, and a crashed peer is usually
  reported sooner, by TensorFlow's coordination-service heartbeats (~10 s).
  :func:`collective_failure` turns either into a one-line error. The timeout is
  kept by one watchdog thread per process (:mod:`evenflow.tf.collective_watch`),
  not by TensorFlow's own per-collective timer, which starts a thread per collective.

The plan's :class:`~evenflow.plan.topology.Topology` comes from the strategy
(:func:`topology_of`), never the other way round, so plan and strategy cannot
disagree about the number of replicas.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from evenflow.plan import Topology
from evenflow.run.options import COMMUNICATIONS, DEFAULT_COLLECTIVE_TIMEOUT
from evenflow.run.rerun import rerun_advice
from evenflow.tf._lazy import tf as _tf
from evenflow.tf.launch.cluster import Cluster, cluster_from_env
from evenflow.tf.collective_watch import CollectiveWatch
from evenflow.tf.devices import replica_devices

IMPLEMENTATIONS: tuple[str, ...] = COMMUNICATIONS
DEFAULT_TIMEOUT_SECONDS = DEFAULT_COLLECTIVE_TIMEOUT


@dataclass(frozen=True)
class Communication:
    """How the workers' collectives run (``tf.distribute.experimental.CommunicationOptions``).

    Attributes:
        implementation: ``"auto"``, ``"ring"`` (gRPC ring all-reduce, any device) or
            ``"nccl"`` (GPUs only).
        bytes_per_pack: split the gradients into all-reduce packs of about this many
            bytes (several smaller collectives can overlap with the backward pass);
            0 lets TensorFlow decide.
        timeout_seconds: a call that has waited this long for the other workers raises
            ``DeadlineExceededError`` instead of waiting for a dead or stuck peer
            forever; None waits forever (TensorFlow's default). :func:`options` hands it
            to TensorFlow; :func:`multi_worker_strategy` keeps it with a
            :class:`~evenflow.tf.collective_watch.CollectiveWatch` instead.
    """

    implementation: str = "auto"
    bytes_per_pack: int = 0
    timeout_seconds: float | None = DEFAULT_TIMEOUT_SECONDS

    def __post_init__(self):
        if self.implementation not in IMPLEMENTATIONS:
            raise ValueError(f"implementation must be one of {', '.join(IMPLEMENTATIONS)}, "
                             f"got {self.implementation!r}")
        if isinstance(self.bytes_per_pack, bool) or not isinstance(self.bytes_per_pack, int) \
                or self.bytes_per_pack < 0:
            raise ValueError(f"bytes_per_pack must be an int >= 0 (0 = TensorFlow decides), "
                             f"got {self.bytes_per_pack!r}")
        t = self.timeout_seconds
        if t is not None and (isinstance(t, bool) or not isinstance(t, (int, float)) or not t > 0
                              or not math.isfinite(t)):
            raise ValueError(f"timeout_seconds must be None (wait forever) or a finite number > 0, got {t!r}; "
                             f"e.g. {DEFAULT_TIMEOUT_SECONDS:g}")

    def options(self):
        """The equivalent ``tf.distribute.experimental.CommunicationOptions``."""
        tf = _tf()
        impl = tf.distribute.experimental.CommunicationImplementation
        return tf.distribute.experimental.CommunicationOptions(
            bytes_per_pack=self.bytes_per_pack, timeout_seconds=self.timeout_seconds,
            implementation={"auto": impl.AUTO, "ring": impl.RING, "nccl": impl.NCCL}[self.implementation])


def mirrored_strategy(replicas: int, use_gpus: bool = True):
    """A ``tf.distribute.MirroredStrategy`` over ``replicas`` local devices.

    Must be called before TensorFlow initialises its runtime when it has to
    split the CPU into logical devices (see :mod:`evenflow.tf.devices`).

    Args:
        replicas: number of replicas R, >= 1 (GPUs if present, else logical CPUs).
        use_gpus: False forces logical CPU devices even when GPUs exist.

    Returns:
        A MirroredStrategy whose ``num_replicas_in_sync`` is R.
    """
    tf = _tf()
    devices = replica_devices(replicas, use_gpus=use_gpus)
    cross_device_ops = None
    if all(d.startswith("/cpu") for d in devices):
        cross_device_ops = tf.distribute.ReductionToOneDevice(reduce_to_device=devices[0])
    return tf.distribute.MirroredStrategy(devices=devices, cross_device_ops=cross_device_ops)


def check_strategy(strategy, what: str) -> None:
    """``TypeError`` naming ``what`` unless ``strategy`` is a ``tf.distribute.Strategy``."""
    if not isinstance(strategy, _tf().distribute.Strategy):
        raise TypeError(f"{what} needs a tf.distribute.Strategy (evenflow.tf.make_strategy(2), "
                        f"tf.distribute.MirroredStrategy(), ...), got {type(strategy).__name__}")


def topology_of(strategy) -> Topology:
    """The plan topology of ``strategy``: one equal-weight replica per device."""
    check_strategy(strategy, "topology_of")
    return Topology(replicas=int(strategy.num_replicas_in_sync))


def make_strategy(replicas: int, cluster: Cluster | None = None, communication: Communication | None = None,
                  use_gpus: bool = True):
    """The strategy for this process: MirroredStrategy alone, MultiWorkerMirroredStrategy in a cluster.

    Call it first, before anything else starts TensorFlow (it may split the CPU into
    logical devices, and a multi-worker strategy must be created before other ops).

    Args:
        replicas: replicas on this worker, >= 1 (the same on every worker).
        cluster: the workers; default :func:`~evenflow.tf.launch.cluster.cluster_from_env`.
        communication: collective options for several workers (ignored for one).
        use_gpus: False forces logical CPU devices even when GPUs exist.

    Returns:
        A strategy whose ``num_replicas_in_sync`` is ``cluster.num_workers * replicas``.
    """
    cluster = cluster_from_env() if cluster is None else cluster
    if cluster.is_multi_worker:
        return multi_worker_strategy(cluster, replicas, communication, use_gpus=use_gpus)
    return mirrored_strategy(replicas, use_gpus=use_gpus)


def multi_worker_strategy(cluster: Cluster, replicas: int, communication: Communication | None = None,
                          use_gpus: bool = True):
    """A MultiWorkerMirroredStrategy over ``cluster`` with ``replicas`` devices on this worker.

    Blocks until every worker of the cluster has started its strategy.

    Args:
        cluster: a multi-worker :class:`~evenflow.tf.launch.cluster.Cluster`.
        replicas: replicas on this worker (GPUs if present, else logical CPUs), the
            same number on every worker.
        communication: collective options; default :class:`Communication` ``()``.
        use_gpus: False forces logical CPU devices even when GPUs exist.
    """
    if not isinstance(cluster, Cluster) or not cluster.is_multi_worker:
        raise ValueError(f"cluster must be an evenflow Cluster of at least 2 workers, got {cluster!r}; "
                         f"use mirrored_strategy for one worker")
    communication = Communication() if communication is None else communication
    if not isinstance(communication, Communication):
        raise TypeError(f"communication must be an evenflow Communication, got {type(communication).__name__}")
    tf = _tf()
    # Device names first: this may split the CPU into logical devices, which must precede the
    # runtime start that the strategy triggers.
    local = replica_devices(replicas, use_gpus=use_gpus)
    kind = "GPU" if local[0].startswith("/gpu") else "CPU"
    task_type, task_index = cluster.task
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(cluster.cluster_spec()), task_type=task_type, task_id=task_index, rpc_layer="grpc")
    return _multi_worker_class()(resolver, _untimed(communication), kind, len(local),
                                 CollectiveWatch(communication.timeout_seconds))


def _untimed(communication: Communication):
    """TensorFlow's options for ``communication`` without its timeout: evenflow's watchdog keeps that,
    not TensorFlow's timer (a thread per collective op; see :mod:`evenflow.tf.collective_watch`)."""
    return replace(communication, timeout_seconds=None).options()


def collective_watch(strategy) -> CollectiveWatch:
    """The :class:`~evenflow.tf.collective_watch.CollectiveWatch` of a strategy from
    :func:`multi_worker_strategy`; one that never fires for any other strategy."""
    return getattr(strategy, "collective_watch", None) or CollectiveWatch(None)


_CLASS = []


def _multi_worker_class():
    """MultiWorkerMirroredStrategy with R local devices of one kind (built once, on first use).

    The stock strategy asks ``_initialize_local_devices`` for this worker's devices
    and answers "all GPUs, else one CPU"; this subclass answers "the first R GPUs,
    or R logical CPUs". Everything else — collectives, input distribution,
    variables — is TensorFlow's. (Private API of TensorFlow 2.21, the pinned version;
    ``tests/tf/test_multiworker.py`` runs it with 2 workers x 2 replicas.)
    """
    if _CLASS:
        return _CLASS[0]
    tf = _tf()
    from tensorflow.python.distribute import collective_all_reduce_strategy as car
    from tensorflow.python.distribute import distribute_lib

    class _Extended(car.CollectiveAllReduceExtended):
        def __init__(self, container, cluster_resolver, communication_options, kind, count):
            self._evenflow_devices = (kind, count)  # read by _initialize_local_devices during __init__
            super().__init__(container, cluster_resolver=cluster_resolver,
                             communication_options=communication_options)

        def _initialize_local_devices(self, cluster_resolver, worker_device):
            kind, count = self._evenflow_devices
            return tuple(f"{worker_device}/device:{kind}:{i}" for i in range(count)), kind

    class MultiWorkerMirroredStrategy(tf.distribute.MultiWorkerMirroredStrategy):
        """``tf.distribute.MultiWorkerMirroredStrategy`` with a chosen number of local replicas."""

        def __init__(self, cluster_resolver, communication_options, kind: str, count: int, watch: CollectiveWatch):
            # Strategy.__init__ directly: the parent's __init__ builds the stock extended object.
            distribute_lib.Strategy.__init__(
                self, _Extended(self, cluster_resolver, communication_options, kind, count))
            self.collective_watch = watch

    _CLASS.append(MultiWorkerMirroredStrategy)
    return MultiWorkerMirroredStrategy


def local_replicas(strategy) -> int:
    """Replicas of ``strategy`` in this worker process (TensorFlow's default strategy: its one replica)."""
    try:
        return len(strategy.extended.worker_devices)
    except RuntimeError:  # the default strategy has no worker devices of its own
        return int(strategy.num_replicas_in_sync)


def num_workers(strategy) -> int:
    """Worker processes taking part in ``strategy``'s collectives (1 for MirroredStrategy)."""
    return max(int(strategy.num_replicas_in_sync) // local_replicas(strategy), 1)


def on_cpu(strategy) -> bool:
    """True when every replica of ``strategy`` on this worker is a CPU device (logical CPUs included)."""
    return all("CPU" in d.upper() for d in strategy.extended.worker_devices)


def is_chief(strategy) -> bool:
    """True on the worker that writes run outputs; always True for a single worker."""
    return bool(strategy.extended.should_checkpoint)


class CollectiveFailure(RuntimeError):
    """A collective across workers failed: a peer died, stopped taking part, or timed out."""


def collective_failure(error: BaseException, cluster: Cluster, seconds: float | None = None,
                       run_dir=None) -> CollectiveFailure | None:
    """A one-line :class:`CollectiveFailure` for a TensorFlow error raised by a lost peer, else None.

    Args:
        error: the exception a training step raised.
        cluster: this process's cluster (names the worker in the message).
        seconds: how long the failing call waited, if known.
        run_dir: the run directory: the line names its newest checkpoint, which a rerun resumes
            from (:func:`~evenflow.run.rerun.rerun_advice`); None or no checkpoint: it starts over.
    """
    tf = _tf()
    kinds = (tf.errors.UnavailableError, tf.errors.DeadlineExceededError, tf.errors.AbortedError,
             tf.errors.CancelledError)
    if not cluster.is_multi_worker or not isinstance(error, kinds):
        return None
    reason = " ".join(str(getattr(error, "message", error)).split())
    for marker in ("The following tasks are unhealthy", "Collective has timed out", "failed to connect",
                   "Socket closed", "Connection reset"):
        at = reason.find(marker)
        if at >= 0:
            reason = reason[at:]
            break
    for noise in (" Additional GRPC error information", " The error could be from a previous operation",
                  " Check the task logs", " [type.googleapis.com"):
        reason = reason.split(noise)[0]
    waited = f" after {seconds:.1f} s" if seconds is not None else ""
    return CollectiveFailure(
        f"worker {cluster.index} of {cluster.num_workers} lost the other workers{waited} "
        f"({type(error).__name__}: {reason[:200].rstrip('. ')}): a peer died, stopped or is unreachable. "
        f"Check the other workers' output, then {rerun_advice(run_dir, 'rerun the same command on every worker')}")
