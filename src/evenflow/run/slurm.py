"""The tasks of a Slurm job step, read from the variables ``srun`` sets: hosts, this task's rank, the task count.

``srun`` starts the same command once per task and tells each one where it stands::

    SLURM_JOB_ID=4242 SLURM_PROCID=1 SLURM_LOCALID=1 SLURM_STEP_NUM_TASKS=4
    SLURM_STEP_NODELIST=gpu[01-02] SLURM_STEP_TASKS_PER_NODE=2(x2)

(the job's ``SLURM_NTASKS``, ``SLURM_JOB_NODELIST`` and ``SLURM_TASKS_PER_NODE`` stand in for the step's).
:func:`slurm_tasks` reads them into a :class:`SlurmTasks`; TensorFlow turns it into a
``SlurmClusterResolver`` (:mod:`evenflow.tf.launch.cluster_source`), PyTorch into the variables
``torchrun`` would set (:meth:`SlurmTasks.torch_env`). Tasks are laid out in blocks, Slurm's default:
the first host runs ranks ``0 .. n0 - 1``, the next one the following ranks. Every task of a job
listens on ports derived from the job id (:attr:`SlurmTasks.port_base`), so two jobs sharing a
host do not collide. Nothing here imports a framework.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Mapping

# (what the step sets, what the job sets instead when the step's is missing)
_COUNT = ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS")
_NODES = ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST")
_PER_NODE = ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE")
PORT_RANGE = (20000, 30000)  # the first port of a job is in this range, chosen by its job id


@dataclass(frozen=True)
class SlurmTasks:
    """The tasks of one Slurm job step and this process's place among them.

    Attributes:
        job_id: ``SLURM_JOB_ID``.
        hosts: the step's hosts, in node-list order.
        tasks_per_node: tasks on each host, aligned with ``hosts``.
        rank: ``SLURM_PROCID``, in ``[0, count)``.
        local_rank: ``SLURM_LOCALID``: this task among the tasks of its host.
    """

    job_id: str
    hosts: tuple[str, ...]
    tasks_per_node: tuple[int, ...]
    rank: int
    local_rank: int

    @property
    def count(self) -> int:
        return sum(self.tasks_per_node)

    @property
    def port_base(self) -> int:
        """The job's first port: ``20000 + job id mod 10000`` (task ``i`` of a host listens on ``port_base + i``)."""
        digits = re.sub(r"\D", "", self.job_id) or "0"
        return PORT_RANGE[0] + int(digits) % (PORT_RANGE[1] - PORT_RANGE[0])

    def torch_env(self) -> dict[str, str]:
        """The variables ``torchrun`` sets, for this task: rank 0 (the first host) is the rendezvous."""
        return {"RANK": str(self.rank), "WORLD_SIZE": str(self.count), "LOCAL_RANK": str(self.local_rank),
                "LOCAL_WORLD_SIZE": str(self.tasks_per_node[self.hosts.index(self.host)]),
                "MASTER_ADDR": self.hosts[0], "MASTER_PORT": str(self.port_base)}

    @property
    def host(self) -> str:
        """The host this task runs on (block layout: the first host runs the first ranks)."""
        first = 0
        for host, n in zip(self.hosts, self.tasks_per_node):
            if self.rank < first + n:
                return host
            first += n
        return self.hosts[-1]


def in_slurm_step(environ: Mapping[str, str]) -> bool:
    """True inside a Slurm allocation whose tasks are several processes (``srun`` with more than one task)."""
    count = next((environ[k] for k in _COUNT if environ.get(k)), "")
    return bool(environ.get("SLURM_JOB_ID")) and "SLURM_PROCID" in environ and count.isdigit() and int(count) > 1


def slurm_tasks(environ: Mapping[str, str]) -> SlurmTasks:
    """Read :class:`SlurmTasks` from ``environ``; ValueError naming the missing or malformed variables."""
    missing = [k for k in ("SLURM_JOB_ID", "SLURM_PROCID") if not environ.get(k)]
    missing += [" or ".join(keys) for keys in (_COUNT, _NODES) if not any(environ.get(k) for k in keys)]
    if missing:
        raise ValueError(f"--cluster slurm needs the variables srun sets, and {', '.join(missing)} "
                         f"{'is' if len(missing) == 1 else 'are'} not set; run the command with srun inside an "
                         f"allocation (sbatch/salloc), or drop --cluster slurm")
    value = {keys[0]: next(environ[k] for k in keys if environ.get(k)) for keys in (_COUNT, _NODES)}
    count, rank = _integer(value[_COUNT[0]], _COUNT[0]), _integer(environ["SLURM_PROCID"], "SLURM_PROCID")
    hosts = expand_hostlist(value[_NODES[0]])
    raw_per_node = next((environ[k] for k in _PER_NODE if environ.get(k)), "")
    per_node = expand_tasks_per_node(raw_per_node) if raw_per_node else _even(count, len(hosts))
    if len(per_node) != len(hosts) or sum(per_node) != count:
        raise ValueError(f"Slurm's tasks per node {raw_per_node!r} do not add up to {count} tasks on the "
                         f"{len(hosts)} host(s) of {value[_NODES[0]]!r}; run the command with srun")
    if not 0 <= rank < count:
        raise ValueError(f"SLURM_PROCID={rank} is not in [0, {count - 1}] for {count} tasks; run the command with srun")
    local = _integer(environ.get("SLURM_LOCALID", "0") or "0", "SLURM_LOCALID")
    return SlurmTasks(environ["SLURM_JOB_ID"], tuple(hosts), tuple(per_node), rank, local)


def _integer(text: str, name: str) -> int:
    if not text.strip().isdigit():
        raise ValueError(f"{name} must be a whole number, got {text!r}; run the command with srun")
    return int(text)


def _even(count: int, hosts: int) -> list[int]:
    return [count // hosts + (i < count % hosts) for i in range(hosts)]


def expand_hostlist(text: str) -> list[str]:
    """``"gpu[01-02,05],login"`` -> ``["gpu01", "gpu02", "gpu05", "login"]`` (Slurm's compact host list)."""
    hosts = []
    for name in re.findall(r"[^,\[]*(?:\[[^\]]*\][^,\[]*)*", text):
        if name:
            hosts += _expand_one(name)
    return hosts


def _expand_one(name: str) -> list[str]:
    match = re.search(r"\[([^\]]*)\]", name)
    if match is None:
        return [name]
    head, tail = name[:match.start()], name[match.end():]
    out = []
    for part in match.group(1).split(","):
        low, _, high = part.partition("-")
        numbers = range(int(low), int(high or low) + 1)
        out += [f"{head}{str(n).zfill(len(low))}{rest}" for n in numbers for rest in _expand_one(tail)]
    return out


def expand_tasks_per_node(text: str) -> list[int]:
    """``"2(x3),1"`` -> ``[2, 2, 2, 1]`` (Slurm's tasks per node)."""
    out = []
    for part in text.split(","):
        number, _, repeat = part.partition("(x")
        out += [int(number)] * int(repeat.rstrip(")") or 1)
    return out
