"""Pick the devices that will hold the replicas: one per GPU, or logical slices of the CPU.

On a machine with GPUs each replica gets its own GPU. On a CPU-only machine the
CPU is split into R *logical* devices with
``tf.config.set_logical_device_configuration``, so that a MirroredStrategy with
R replicas runs (and can be tested) on a laptop. Logical devices can only be
configured before the TensorFlow runtime starts, so :func:`replica_devices` must
run before anything creates a tensor; if the runtime has already started with
enough devices it reuses them, otherwise it says to start a new process.
"""
from __future__ import annotations

from evenflow.tf._lazy import tf as _tf
from evenflow.util.validate import check_int

# Logical CPU devices share the same cores and thread pools; past a few dozen they only add
# scheduling overhead, and a typo like --replicas 4000 should not quietly create 4000 devices.
MAX_CPU_REPLICAS = 64


def _check_replicas(replicas) -> int:
    return check_int("replicas", replicas, 1)


def default_replicas(cpu_replicas: int = 4) -> int:
    """One replica per GPU when the machine has GPUs, else ``cpu_replicas`` logical CPUs.

    Lists the physical devices only, which does not start the TensorFlow runtime.
    """
    gpus = _tf().config.list_physical_devices("GPU")
    return len(gpus) if gpus else _check_replicas(cpu_replicas)


def replica_devices(replicas: int, use_gpus: bool = True) -> list[str]:
    """Return one device name per replica, configuring logical CPUs if needed.

    Args:
        replicas: number of data-parallel replicas R, >= 1.
        use_gpus: use the machine's GPUs when it has any (one replica per GPU);
            False always splits the CPU.

    Returns:
        R device names such as ``"/gpu:0"`` or ``"/cpu:3"``, in replica order.

    Raises:
        ValueError: R is larger than the GPUs present, larger than
            :data:`MAX_CPU_REPLICAS`, or TensorFlow already started with fewer
            logical CPUs than R.
    """
    replicas = _check_replicas(replicas)
    tf = _tf()
    gpus = tf.config.list_physical_devices("GPU") if use_gpus else []
    if gpus:
        if replicas > len(gpus):
            raise ValueError(
                f"replicas must be at most the number of GPUs, one replica per GPU: this machine has "
                f"{len(gpus)} GPU(s) and replicas is {replicas}; use --replicas {len(gpus)} or fewer")
        return [f"/gpu:{i}" for i in range(replicas)]
    if replicas > MAX_CPU_REPLICAS:
        raise ValueError(
            f"replicas on a CPU-only machine must be at most {MAX_CPU_REPLICAS} logical devices, got "
            f"{replicas}; use fewer replicas (they share the same cores anyway)")
    cpu = tf.config.list_physical_devices("CPU")[0]
    current = tf.config.get_logical_device_configuration(cpu)
    wanted = [tf.config.LogicalDeviceConfiguration() for _ in range(replicas)]
    if current is None or len(current) != replicas:
        try:
            tf.config.set_logical_device_configuration(cpu, wanted)
        except RuntimeError:
            # The runtime is up; the existing logical devices are all we can have.
            have = len(tf.config.list_logical_devices("CPU"))
            if have < replicas:
                raise ValueError(
                    f"replicas must be at most the {have} logical CPU device(s) TensorFlow was started with "
                    f"in this process, got {replicas}; logical devices can only be set before TensorFlow "
                    f"initialises, so run this in a new process") from None
    return [f"/cpu:{i}" for i in range(replicas)]
