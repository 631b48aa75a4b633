"""TF_CONFIG -> Cluster, the communication options and the lost-peer message (no TensorFlow runtime needed)."""
from __future__ import annotations

import json

import pytest

from evenflow.tf.launch.cluster import REPLICAS_ENV, Cluster, cluster_from_env, tf_config
from evenflow.run.config import load_config
from evenflow.tf.strategy import DEFAULT_TIMEOUT_SECONDS, Communication


def _env(cluster: dict, task: dict, **extra) -> dict:
    return {"TF_CONFIG": json.dumps({"cluster": cluster, "task": task}), **extra}


def test_no_tf_config_is_one_worker():
    c = cluster_from_env({})
    assert (c.num_workers, c.index, c.is_multi_worker, c.is_chief, c.replicas_per_worker) == (1, 0, False, True, None)
    assert c.topology(4).replicas == 4 and list(c.replica_ids(4)) == [0, 1, 2, 3]


def test_workers_and_their_global_replicas():
    env = {"TF_CONFIG": tf_config(["a:1", "b:2", "c:3"], 2), REPLICAS_ENV: "2"}
    c = cluster_from_env(env)
    assert c.workers == ("a:1", "b:2", "c:3") and c.index == 2 and c.is_multi_worker and not c.is_chief
    assert c.replicas_per_worker == 2 and c.topology(2).replicas == 6
    assert list(c.replica_ids(2)) == [4, 5]  # worker w holds w*R .. w*R + R - 1
    assert c.task == ("worker", 2) and c.cluster_spec() == {"worker": ["a:1", "b:2", "c:3"]}


def test_a_chief_job_is_worker_zero():
    spec = {"chief": ["a:1"], "worker": ["b:2", "c:3"]}
    chief = cluster_from_env(_env(spec, {"type": "chief", "index": 0}))
    second = cluster_from_env(_env(spec, {"type": "worker", "index": 1}))
    assert chief.is_chief and chief.index == 0 and chief.task == ("chief", 0)
    assert not second.is_chief and second.index == 2 and second.task == ("worker", 1)
    assert second.cluster_spec() == spec


@pytest.mark.parametrize("env, fragment", [
    ({"TF_CONFIG": "{"}, "TF_CONFIG is not valid JSON"),                                 # truncated JSON
    ({"TF_CONFIG": "[1]"}, "must be a JSON object"),                                     # not an object
    (_env({"worker": ["a:1"], "ps": ["b:2"]}, {"type": "worker", "index": 0}), "job 'ps'"),  # parameter servers
    (_env({"worker": ["a:1", "b:2"]}, {"type": "worker", "index": 2}), "must be in [0, 1]"),  # index too large
    (_env({"worker": ["a:1", "b:2"]}, {"type": "chief", "index": 0}), "must be 'worker'"),    # no chief job
    (_env({"worker": ["a:1", "b:2"]}, {"type": "worker", "index": "1"}), "must be an integer"),
    (_env({"worker": ["a:1", "nocolon"]}, {"type": "worker", "index": 0}), "'host:port'"),
    (_env({"chief": ["a:1", "b:2"]}, {"type": "chief", "index": 0}), "at most one chief"),
    ({REPLICAS_ENV: "0"}, f"{REPLICAS_ENV} must be an integer >= 1"),
    ({REPLICAS_ENV: "two"}, f"{REPLICAS_ENV} must be an integer >= 1"),
])
def test_bad_environments_name_the_value_and_the_fix(env, fragment):
    with pytest.raises(ValueError) as e:
        cluster_from_env(env)
    assert fragment in str(e.value)


def test_cluster_values_are_validated():
    with pytest.raises(ValueError, match="index must be at (least 0|most)"):
        Cluster(("a:1", "b:2"), index=5)
    with pytest.raises(ValueError, match="replicas_per_worker"):
        Cluster(replicas_per_worker=0)


def test_communication_options_and_their_config_keys():
    assert Communication().timeout_seconds == DEFAULT_TIMEOUT_SECONDS
    for bad in ({"implementation": "mpi"}, {"bytes_per_pack": -1}, {"timeout_seconds": 0},
                {"timeout_seconds": float("inf")}):
        with pytest.raises(ValueError):
            Communication(**bad)
    cfg = load_config(None, {"dataset": "builtin:digits", "communication": "ring", "bytes_per_pack": 1 << 20,
                             "collective_timeout": 30, "gradient_compression": "fp16", "accumulate_steps": 4})
    compute = cfg.compute
    assert Communication(compute.communication, compute.bytes_per_pack, compute.collective_timeout) == \
        Communication("ring", 1 << 20, 30.0)
    assert (cfg.compute.gradient_compression, cfg.compute.accumulate_steps) == ("fp16", 4)
    for key, value, fragment in (("accumulate_steps", 0, "at least 1"), ("accumulate_steps", 65, "at most 64"),
                                 ("gradient_compression", "int8", "must be one of fp16, none"),
                                 ("collective_timeout", -1, "greater than 0"),
                                 ("communication", "mpi", "must be one of auto, nccl, ring")):
        with pytest.raises(ValueError, match=fragment) as e:
            load_config(None, {"dataset": "builtin:digits", key: value})
        assert str(e.value).startswith(f"--{key.replace('_', '-')}: ")


def test_a_lost_peer_becomes_one_line_naming_the_worker():
    tf = pytest.importorskip("tensorflow")
    from evenflow.tf.strategy import CollectiveFailure, collective_failure

    two = Cluster(("127.0.0.1:1", "127.0.0.1:2"), index=1)
    raw = ("{{function_node __wrapped__CollectiveReduceV2_Nordering_token_1_device_/job:worker/replica:0/task:1/"
           "device:CPU:0}} Collective ops is aborted by: Error reported from /job:worker/task:0: The following "
           "tasks are unhealthy (stopped sending heartbeats):\n/job:worker/replica:0/task:0\nThe tasks have "
           "crashed. Additional GRPC error information from remote target ... [Op:CollectiveReduceV2]")
    failure = collective_failure(tf.errors.UnavailableError(None, None, raw), two)
    assert isinstance(failure, CollectiveFailure)
    text = str(failure)
    assert "\n" not in text and text.startswith("worker 1 of 2 lost the other workers (UnavailableError: "
                                                "The following tasks are unhealthy")
    assert "GRPC" not in text and text.endswith("then rerun the same command on every worker to start over")
    timed_out = collective_failure(tf.errors.DeadlineExceededError(None, None, "Collective has timed out during "
                                                                   "execution. [Op:CollectiveReduceV2]"), two)
    assert "DeadlineExceededError: Collective has timed out during execution" in str(timed_out)
    # Other errors, and any error of a single worker, are not about peers.
    assert collective_failure(ValueError("bad"), two) is None
    assert collective_failure(tf.errors.UnavailableError(None, None, raw), Cluster()) is None


def test_a_lost_peers_line_names_the_checkpoint_the_rerun_resumes_from(tmp_path):
    tf = pytest.importorskip("tensorflow")
    import evenflow as ef
    from evenflow.run import Checkpointer
    from evenflow.tf.strategy import collective_failure
    from tests.run.test_rerun_advice import _State

    two = Cluster(("127.0.0.1:1", "127.0.0.1:2"), index=0)
    lost = tf.errors.UnavailableError(None, None, "Socket closed")
    assert str(collective_failure(lost, two, run_dir=tmp_path)).endswith(
        "then rerun the same command on every worker to start over")
    newest = Checkpointer(tmp_path, _State()).save(ef.Cursor(3, 5))
    assert str(collective_failure(lost, two, run_dir=tmp_path)).endswith(
        f"then rerun the same command on every worker to resume from {newest} (epoch 3 step 5)")


def test_any_cluster_resolver_gives_the_same_cluster_as_tf_config():
    tf = pytest.importorskip("tensorflow")
    spec = tf.train.ClusterSpec({"worker": ["hostA:12345", "hostB:12345"]})
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(spec, task_type="worker", task_id=1)
    from_resolver = Cluster.from_resolver(resolver, replicas_per_worker=4)
    from_env = cluster_from_env({"TF_CONFIG": tf_config(["hostA:12345", "hostB:12345"], 1), REPLICAS_ENV: "4"})
    assert from_resolver == from_env
