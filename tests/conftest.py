"""Shared helpers: symbolic buffers for schedule verification and small topologies."""
import os
import re
import time

import numpy as np
import pytest

import hccl_sim
from hccl_sim.chaos import runners as _chaos_runners


def add(a, b, out):
    np.add(a, b, out=out)


def onehot_input(rank, p, rows, cols, index_of):
    """Symbolic buffer: per element a count per source rank and, per source, the element's index + 1.

    After any correct collective, every output element holds count 1 for exactly the right
    sources and the right index: a lost, duplicated or misplaced contribution shows up.
    """
    x = np.zeros((rows, cols, 2 * p))
    x[:, :, rank] = 1
    x[:, :, p + rank] = index_of(np.arange(rows)[:, None], np.arange(cols)[None, :])
    return x


@pytest.fixture
def fullmesh():
    def make(p, bandwidth=1e9, latency=1e-6, reduce_bandwidth=2e9):
        return hccl_sim.topology("fullmesh", ranks=p, bandwidth=bandwidth, latency=latency,
                                 reduce_bandwidth=reduce_bandwidth)
    return make


# ---- processes and shared memory a test leaves behind ----------------------------------------------

descendants = _chaos_runners.descendants     # live processes below this one, from /proc


def shm_leaks(before):
    """/dev/shm entries new since `before` that this test made. Other developers share the machine:
    entries named for a process (hcomm.shm's segments are) count only when that process is in this
    test's tree, and multiprocessing's named semaphores never (these tests use pipes). What these
    transports could leave (Ray's plasma files) has no pid in its name and always counts."""
    ours = descendants() | {os.getpid()}
    leaked = []
    for name in set(os.listdir("/dev/shm")) - before:
        pid = re.search(r"-(\d+)-", name)
        if name.startswith("sem.mp-") or (pid and int(pid.group(1)) not in ours):
            continue
        leaked.append(name)
    return leaked


def cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode()[:200]
    except OSError:
        return "?"


# ---- the test session's one Ray instance: a two-node cluster on this machine ------------------------

@pytest.fixture(scope="session")
def ray_cluster():
    """Two Ray nodes on this machine (ray.cluster_utils), so traffic between ranks placed on
    different nodes really crosses Ray nodes. Node k has 1 CPU and the custom resource node{k}."""
    import ray
    from ray.cluster_utils import Cluster
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if ray.is_initialized():
        ray.shutdown()
    before = set(os.listdir("/dev/shm"))
    cluster = Cluster()
    # rank actors unpickle functions defined in these test modules by reference
    here = os.path.dirname(os.path.abspath(__file__))
    path = os.environ.get("PYTHONPATH", "")
    try:
        for k in range(2):
            cluster.add_node(num_cpus=1, resources={f"node{k}": 64}, object_store_memory=256 << 20,
                             include_dashboard=False)
        ray.init(address=cluster.address, log_to_driver=False,
                 runtime_env={"env_vars": {"PYTHONPATH": here + (os.pathsep + path if path else "")}})
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()
    deadline = time.monotonic() + 60           # Ray's idle workers can take a while to exit on a busy machine
    while len(descendants()) > 1 and time.monotonic() < deadline:
        time.sleep(0.2)
    # multiprocessing's resource tracker lives as long as this process, by design: not a leak
    left = {pid: cmd for pid in descendants() if "resource_tracker" not in (cmd := cmdline(pid))}
    assert not left, left
    assert not shm_leaks(before)
