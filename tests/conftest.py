"""Shared helpers: symbolic buffers for schedule verification, small topologies, waits on what the code
shows (not sleeps), leak checks, the session's Ray cluster; and the check that every test has one layer."""
import os
import re
import sys
import threading
import time

import numpy as np
import pytest

import hccl_sim
from hccl_sim.chaos import runners as _chaos_runners

# Ray's driver holds back a line like one it printed in the last few seconds (its log
# deduplication, RAY_DEDUP_LOGS): what a test reads of Ray's output must be every line, when it
# comes. Read once, when ray is first imported, which none of the imports above does.
os.environ.setdefault("RAY_DEDUP_LOGS", "0")


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


# ---- layers: every test carries exactly one (pyproject.toml registers them) -------------------------

LAYERS = ("unit", "local", "ray", "mpi", "torch", "campaign")


@pytest.hookimpl(tryfirst=True)          # before -m deselects: every collected test is checked
def pytest_collection_modifyitems(config, items):
    wrong = []
    for item in items:
        layers = sorted({m.name for m in item.iter_markers() if m.name in LAYERS})
        if len(layers) != 1:
            wrong.append(f"  {item.nodeid}: {', '.join(layers) if layers else 'none'}")
    if wrong:
        raise pytest.UsageError(
            f"{len(wrong)} test(s) without exactly one layer marker ({', '.join(LAYERS)}; see pyproject.toml): "
            f"mark the module (pytestmark = pytest.mark.<layer>) or each test\n" + "\n".join(wrong[:30])
            + (f"\n  ... and {len(wrong) - 30} more" if len(wrong) > 30 else ""))


@pytest.fixture
def fullmesh():
    def make(p, bandwidth=1e9, latency=1e-6, reduce_bandwidth=2e9):
        return hccl_sim.topology("fullmesh", ranks=p, bandwidth=bandwidth, latency=latency,
                                 reduce_bandwidth=reduce_bandwidth)
    return make


# ---- ordering a test's steps by what the code shows, not by sleeping "long enough" ------------------

def ranks_as_threads(p, body, timeout=90.0):
    """body(rank) on a thread per rank; every rank's result. Fails on any rank's error, or on a
    rank still running after `timeout` s."""
    results, errors = [None] * p, []

    def one(rank):
        try:
            results[rank] = body(rank)
        except BaseException as exc:      # noqa: BLE001 - reported below
            errors.append((rank, exc))
    ts = [threading.Thread(target=one, args=(r,)) for r in range(p)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout)
    assert not any(t.is_alive() for t in ts), f"ranks still running after {timeout} s"
    assert not errors, errors
    return results


@pytest.fixture
def no_transport_leaks():
    """No transport thread (hcomm-*) and no /dev/shm segment outlives the test."""
    before = set(os.listdir("/dev/shm"))
    yield
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and [t for t in threading.enumerate() if t.name.startswith("hcomm-")]:
        time.sleep(0.05)
    assert not [t.name for t in threading.enumerate() if t.name.startswith("hcomm-")]
    assert not shm_leaks(before)


class SocketHosts:
    """p socket transports started against each other, each rank's buffers in its own segments;
    `hosts`: the ranks of one host, or a list of such groups (each group's ranks share a host:
    share_host); a rank in no group is alone on its host."""

    def __init__(self, p, hosts, timeout_s=30):
        from hcomm.memory import segments as shm
        from hcomm.memory.segment_provider import SegmentProvider
        from hcomm.transports.socket import SocketTransport
        groups = [list(g) for g in hosts] if hosts and not isinstance(next(iter(hosts)), int) else [list(hosts)]
        self.session = shm.new_session()
        self.memory = [SegmentProvider(self.session, r) for r in range(p)]
        self.tr = [SocketTransport(r, p, timeout_s=timeout_s, connect_timeout_s=30) for r in range(p)]
        peers = {r: t.address for r, t in enumerate(self.tr)}
        for r, t in enumerate(self.tr):
            t.start(peers, eager=False)
            for g in groups:
                if r in g:
                    t.share_host(self.memory[r], g)

    def close(self):
        from hcomm.memory import segments as shm
        for t in self.tr:
            t.close()
        for m in self.memory:
            m.close()
        shm.cleanup(self.session)


def wait_until(condition, what, timeout=30.0, every=0.005):
    """Poll `condition()` until it is true; fail naming `what` once `timeout` s have passed."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"not within {timeout} s: {what}")
        time.sleep(every)


def blocked_in(thread_id, where=("take", "wait_consumed")) -> bool:
    """Whether the thread `thread_id` is parked in a wait (its innermost Python frame is threading's
    Condition.wait, which Event.wait uses too) called from a function named in `where` (a
    transport's take or wait_consumed): it has made its checks and sleeps until woken or polled."""
    frame = sys._current_frames().get(thread_id)
    if frame is None or frame.f_code.co_name != "wait" or frame.f_code.co_filename != threading.__file__:
        return False
    while frame is not None:
        if frame.f_code.co_name in where:
            return True
        frame = frame.f_back
    return False


def waiting_ranks(watch) -> set:
    """The ranks an in-process transport's deadlock watch (hcomm.transports.inprocess.Watch) records
    as waiting: a rank is there from inside its wait loop until the wait ends."""
    return set(watch.waiting_ranks())


# ---- processes and shared memory a test leaves behind ----------------------------------------------

descendants = _chaos_runners.descendants     # live processes below this one, from /proc


def shm_leaks(before):
    """/dev/shm entries new since `before` that this test made. Other developers share the machine:
    entries named for a process (hcomm.shm's segments are) count only when that process is in this
    test's tree, and multiprocessing's named semaphores never (these tests use pipes); MPICH's
    segments only when no live process outside this tree maps them: another developer's mpiexec
    job, or this very process's own MPI (a test calling engine="mpi" without mpiexec initialises
    MPI here, and MPICH keeps its segment mapped until the process exits). A segment left behind
    is mapped by no one. What these transports could leave (Ray's plasma files) has no pid in its
    name and always counts."""
    ours = descendants() | {os.getpid()}
    leaked = []
    for name in set(os.listdir("/dev/shm")) - before:
        pid = re.search(r"-(\d+)-", name)
        if name.startswith("sem.mp-") or (pid and int(pid.group(1)) not in ours):
            continue
        if name.startswith("mpich_shm_") and mapped_outside(name, ours - {os.getpid()}):
            continue
        leaked.append(name)
    return leaked


def mapped_outside(name, ours=frozenset()) -> bool:
    """Whether a live process not in `ours` maps /dev/shm/`name` (a segment of a job that is not
    this test's: a segment left behind is mapped by no one)."""
    path = f"/dev/shm/{name}"
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) in ours:
            continue
        try:
            with open(f"/proc/{pid}/maps") as f:
                if path in f.read():
                    return True
        except OSError:
            continue
    return False


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


@pytest.fixture(scope="session")
def _torch_clusters(ray_cluster):
    """The torch tests' Ray cluster, made when first asked for and again should one close itself
    (a test's time limit ended a run whose ranks would not return): the later tests then get ranks
    of their own, not the closed cluster's error."""
    from topologies import hardware
    made = []

    def live():
        if not made or made[-1].closed:
            made.append(hccl_sim.Cluster(hardware("atlas800t-a2", devices_per_server=[4]), engine="ray"))
        return made[-1]
    yield live
    for cluster in made:
        cluster.close()


@pytest.fixture
def torch_cluster(_torch_clusters):
    """One set of 4 Ray rank actors (one 4-card 910B server) for the torch tests: torch is imported
    once per actor; every test's function initialises and destroys its process group."""
    return _torch_clusters()
