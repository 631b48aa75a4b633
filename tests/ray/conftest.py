"""One local Ray cluster (2 CPUs) for the package's tests; skip the package without Ray Train or PyTorch."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

try:
    import ray.train  # noqa: F401
    import torch  # noqa: F401
except ModuleNotFoundError:  # without pip install 'evenflow[ray,torch]' these tests are not collected
    collect_ignore_glob = ["test_*.py"]

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"
# Quiet, reproducible clusters: no dashboard, no usage report, every worker line once.
# The controller polls its workers every 0.5 s (default 2 s): sooner to see a report, and a lost worker.
RAY_ENV = {"RAY_DEDUP_LOGS": "0", "RAY_USAGE_STATS_ENABLED": "0", "RAY_TRAIN_ENABLE_PRINT_PATCH": "0",
           "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.5",
           "PYTHONPATH": f"{SRC}{os.pathsep}{ROOT}", "OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="package")
def ray_cluster():
    """The address of a local Ray cluster of 2 CPUs, its workers importing this checkout (and tests/): started
    once for the tests of tests/ray/ that use it (Ray's start-up is seconds), shut down after the last."""
    import ray

    with pytest.MonkeyPatch.context() as mp:
        for key, value in RAY_ENV.items():
            mp.setenv(key, value)
        for key in ("RAY_ADDRESS", "WORLD_SIZE", "RANK", "MASTER_ADDR", "MASTER_PORT"):
            mp.delenv(key, raising=False)
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="warning")
        try:
            yield ray.get_runtime_context().gcs_address
        finally:
            ray.shutdown()
