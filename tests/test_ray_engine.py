"""The Ray engine: ranks as actors sharing one Ray instance for the whole test session.

Results and simulated times equal the local engine's; failures surface without a hang; no
shared-memory segment is left behind, even when an actor is killed mid-collective."""
import os
import re
import signal
import time

import numpy as np
import pytest

import hccl_sim
from hccl_sim import HcclError
from hcomm.memory import segments as shm

from test_collectives import all_collectives, check

import ray  # noqa: E402 - a declared dependency
pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="session")
def ray_instance(ray_cluster):
    """The session's two-node Ray cluster (conftest.ray_cluster), connected."""
    return ray


@pytest.fixture(scope="session")
def cluster8(ray_instance):
    with hccl_sim.Cluster(hccl_sim.topology("atlas800t-a2"), engine="ray") as cluster:
        yield cluster


def timeline(comm, count):
    x = np.arange(count, dtype=np.float32) + comm.rank
    records = []
    for op in (lambda: comm.all_reduce(x), lambda: comm.all_gather(x), lambda: comm.broadcast(x, root=3),
               lambda: comm.reduce_scatter(np.tile(x, comm.size)), lambda: comm.all_to_all(np.tile(x, comm.size)),
               lambda: comm.scatter(np.tile(x, comm.size), root=5)):
        op()
        records.append((comm.last_op.algo, comm.last_op.start, comm.last_op.end))
    p, r = comm.size, comm.rank                   # AlltoAllV: uneven rows per pair, rank 1 sends none
    C = ((np.arange(p * p).reshape(p, p) * 7 + 3) % 5) * (count // 4 + 1)
    C[1] = 0
    xs = [np.arange(C[i].sum(), dtype=np.float32) + 1000 * i for i in range(p)]
    want = np.concatenate([np.split(xs[i], np.cumsum(C[i])[:-1])[r] for i in range(p)])
    got = comm.all_to_all_v(xs[r], C[r], C[:, r])
    if not np.array_equal(got, want):
        raise AssertionError(f"rank {r}: all_to_all_v's rows differ from numpy's")
    records.append((comm.last_op.algo, comm.last_op.start, comm.last_op.end))
    c = C.sum(axis=1)                             # AllGatherV / ReduceScatterV: rank 1's block is empty
    got = comm.all_gather_v(xs[r], c)
    if not np.array_equal(got, np.concatenate(xs)):
        raise AssertionError(f"rank {r}: all_gather_v's rows differ from numpy's")
    records.append((comm.last_op.algo, comm.last_op.start, comm.last_op.end))
    whole = np.arange(c.sum(), dtype=np.float32) % 1000    # exact in float32 whatever the order
    got = comm.reduce_scatter_v(whole * (r + 1), c)
    if not np.array_equal(got, (whole * (p * (p + 1) // 2))[c[:r].sum():c[:r + 1].sum()]):
        raise AssertionError(f"rank {r}: reduce_scatter_v's rows differ from numpy's")
    records.append((comm.last_op.algo, comm.last_op.start, comm.last_op.end))
    got = comm.batch_send_recv([("send", (r + 1) % p, xs[r]), ("recv", (r - 1) % p, ((c[(r - 1) % p],), np.float32))])
    if not np.array_equal(got[0], xs[(r - 1) % p]):
        raise AssertionError(f"rank {r}: batch_send_recv's rows differ from numpy's")
    records.append((comm.last_op.algo, comm.last_op.start, comm.last_op.end))
    with comm.group():                            # a group: a send, a receive and a collective, one launch
        got = comm.recv((r - 1) % p)
        comm.send(xs[r], (r + 1) % p)
        total = comm.all_reduce(x)
    if not (np.array_equal(got.result, xs[(r - 1) % p]) and np.array_equal(total.result, p * (x - r) + p * (p - 1) // 2)):
        raise AssertionError(f"rank {r}: the group's results differ from numpy's")
    records.append((comm.last_op.algo, comm.last_op.start, comm.last_op.end))
    comm.barrier()
    return records, comm.clock


@pytest.mark.ray
@pytest.mark.parametrize("count", [1, 1000, 300_000])      # inline through the hub, and shared memory
def test_results_correct_and_every_ops_algo_start_end_and_exit_clock_equal_on_ray_and_local(cluster8, count):
    topo = cluster8.topology
    ray_results = cluster8.run(all_collectives, args=(count, np.int32, "sum", None, 5))
    check(ray_results, 8, count, np.int32, "sum", 5)
    assert cluster8.run(timeline, args=(count,)) == hccl_sim.run(timeline, topology=topo, args=(count,))


def in_place_and_bytes(comm, n):
    """A rank's slices its node's peers read in place (by step words or a message of their place),
    over an AllReduce, an in-place one, an AllGather into a given array and one on a device array;
    whether each result is right."""
    transport = comm._group._raw_transport

    def in_place():
        return transport.sent_by_place + transport.host_steps.read_in_place
    before = in_place()
    p, r = comm.size, comm.rank
    x = np.arange(n, dtype=np.int64) * (r + 1)
    want = np.arange(n, dtype=np.int64) * (p * (p + 1) // 2)
    ok = np.array_equal(comm.all_reduce(x), want)
    y = x.copy()
    comm.all_reduce(y, out=y)
    ok &= np.array_equal(y, want)
    out = np.empty(p * n, np.int64)
    comm.all_gather(x, out=out)
    ok &= np.array_equal(out, np.concatenate([np.arange(n, dtype=np.int64) * (j + 1) for j in range(p)]))
    d = comm.device.empty((n,), np.int64)
    d.data[:] = x
    ok &= np.array_equal(comm.all_reduce(d), want)
    comm.device.free(d)
    return in_place() - before, bool(ok)


@pytest.mark.ray
def test_two_servers_on_two_ray_nodes(ray_instance):
    """A server per Ray node (placement group per server, spread): the plane is chosen from Ray's
    node ids, traffic between the nodes is peer to peer (each rank runs its own schedule over direct
    sockets), and results and simulated times equal the local engine's."""
    import topologies
    topo = topologies.hardware("atlas800t-a2", devices_per_server=[4, 4])   # 4-NPU servers: half the actors
    with hccl_sim.Cluster(topo, engine="ray") as cluster:
        nodes = cluster.nodes
        assert cluster.data_plane == "socket" and len(set(nodes)) == 2
        assert len(set(nodes[:4])) == 1 and len(set(nodes[4:])) == 1 and nodes[0] != nodes[4]
        for algo in ("ring", "NHR", "pipeline"):
            results = cluster.run(all_collectives, args=(20_000, np.float32, "max", algo, 5))
            check(results, 8, 20_000, np.float32, "max", 5)
        assert cluster.run(timeline, args=(5000,)) == hccl_sim.run(timeline, topology=topo, args=(5000,))
        # a node's ranks read each other's slices in place; across the nodes, bytes over TCP
        for by_place, moved in cluster.run(in_place_and_bytes, args=(1 << 18,)):
            assert by_place > 0 and moved
    with hccl_sim.Cluster(topo, engine="ray", data_plane="object") as cluster:   # Ray's object store between nodes
        results = cluster.run(all_collectives, args=(3001, np.int32, "sum", "H-D_R", 6))
        check(results, 8, 3001, np.int32, "sum", 6)
        assert cluster.run(timeline, args=(700,)) == hccl_sim.run(timeline, topology=topo, args=(700,))
    with pytest.raises(HcclError, match="needs every rank on one Ray node"):
        hccl_sim.Cluster(topo, engine="ray", data_plane="shm")


@pytest.mark.ray
def test_a3_superpods_on_two_ray_nodes(ray_instance):
    """Two A3 superpods (a 4-die server each) on the two nodes: every rank runs its own schedule,
    the double ring's halves one after another, with the local engine's results and times."""
    import topologies
    topo = topologies.hardware("atlas900-a3", devices_per_server=[4, 4], pod_of_server=[0, 1])
    with hccl_sim.Cluster(topo, engine="ray") as cluster:
        assert cluster.data_plane == "socket"
        results = cluster.run(all_collectives, args=(20_000, np.int32, "sum", None, 6))
        check(results, 8, 20_000, np.int32, "sum", 6)
        got = cluster.run(timeline, args=(5000,))
        assert got == hccl_sim.run(timeline, topology=topo, args=(5000,))
        assert "level0:double_ring;level2:NHR" in {algo for records, _ in got for algo, _, _ in records}


@pytest.mark.ray
def test_op_retry_under_a_link_flap_sums_retries_and_end_clocks_equal_on_ray_and_local(ray_instance):
    """A RoCE link flap past the retransmission budget, retried (HCCL_OP_RETRY_ENABLE L1): every
    rank's result bit-identical, retries and simulated times equal to the local engine's."""
    import topologies
    topo = topologies.hardware("atlas800t-a2", devices_per_server=[4, 4])
    plan = hccl_sim.FaultPlan().link_flap(1, 5, at=0.0, duration=0.01)
    env = {"HCCL_RDMA_TIMEOUT": "5", "HCCL_RDMA_RETRY_CNT": "1", "HCCL_OP_RETRY_ENABLE": "L1:1",
           "HCCL_OP_RETRY_PARAMS": "MaxCnt:1,HoldTime:20,IntervalTime:0"}

    def fn(comm):
        x = (np.arange(30_000, dtype=np.int64) * (comm.rank + 1)) % 997
        y = comm.all_reduce(x)
        return int(y.sum()), comm.last_op.retries, comm.last_op.end
    with hccl_sim.Cluster(topo, engine="ray", faults=plan, env=env) as cluster:
        got = cluster.run(fn)
    assert got == hccl_sim.run(fn, topology=topo, faults=plan, env=env)
    assert {r[1] for r in got} == {1} and min(r[2] for r in got) > 20_000_000


@pytest.mark.ray
def test_point_to_point_streams_and_device_arrays(cluster8):
    def fn(comm):
        d = comm.device.empty((50_000,), np.float64)
        d.data[:] = comm.rank
        s = comm.device.stream()
        work = comm.all_reduce(d, stream=s)           # zero-copy input from shared device memory
        got = work.wait()
        if comm.rank == 0:
            comm.send(np.arange(7), dst=6, tag=3)
        if comm.rank == 6:
            got = comm.recv(0, tag=3)
        comm.device.free(d)
        return got
    results = cluster8.run(fn)
    assert np.all(results[1] == 28.0) and np.array_equal(results[6], np.arange(7))


@pytest.mark.ray
def test_failing_rank_surfaces_and_releases_the_others(cluster8):
    def fn(comm):
        if comm.rank == 4:
            raise ValueError("bad batch")
        comm.all_reduce(np.ones(10))
        comm.all_reduce(np.ones(10))
    t0 = time.monotonic()
    with pytest.raises(HcclError, match="ValueError: bad batch") as info:
        cluster8.run(fn)
    assert info.value.rank == 4 and time.monotonic() - t0 < 60
    # the cluster is still usable afterwards
    assert cluster8.run(lambda comm: float(comm.all_reduce(np.ones(2))[0]))[0] == 8.0


def repeated_small_ops(comm, n=9):
    """A training loop's small ops, each call repeated, so all but the first run on the lean path
    (engines/eager_lane.py): in place and not, on float data (the reduction's order decides the
    bits), with kernels between them that move the ranks' entry clocks apart in a pattern that
    changes from op to op."""
    r = comm.rank
    x = (np.arange(3, dtype=np.float32) + 0.1) * (r + 1) / 7
    y = x.copy()
    got = []
    for k in range(n):
        comm.device.default_stream.compute(flops=((k * r) % 3) * 1e11)
        a = comm.all_reduce(x)
        comm.all_reduce(y, out=y)
        b = comm.all_gather(x)
        c = comm.reduce(x, root=2)
        got.append((a.tobytes(), y.tobytes(), b.tobytes(), None if c is None else c.tobytes(), tuple(comm.last_op)))
    return got


def diverging(comm):
    """Three repeats of one small call, then rank 5 makes another: the lean path hands it on."""
    x = np.ones(2, np.float32)
    for _ in range(3):
        comm.all_reduce(x)
    comm.all_reduce(np.ones(3, np.float32) if comm.rank == 5 else x)


def diverging_same_length(comm):
    """As `diverging`, rank 5's other call with a payload of the repeated call's length (op max for
    sum): every rank reads the round's records, and their heads differ."""
    x = np.ones(2, np.float32)
    for _ in range(3):
        comm.all_reduce(x)
    comm.all_reduce(x, op="max" if comm.rank == 5 else "sum")


@pytest.mark.ray
def test_repeated_small_ops_results_bits_and_records_equal_local(cluster8):
    topo = cluster8.topology
    assert cluster8.run(repeated_small_ops) == hccl_sim.run(repeated_small_ops, topology=topo)


@pytest.mark.ray
def test_mismatch_and_early_return(cluster8):
    with pytest.raises(HcclError, match="mismatched collective calls") as info:
        cluster8.run(lambda comm: comm.all_reduce(np.ones(3, dtype=np.float32 if comm.rank else np.float64)))
    assert info.value.code == "E_PARA"
    for fn in (diverging, diverging_same_length):
        with pytest.raises(HcclError, match="mismatched collective calls"):
            cluster8.run(fn)
    with pytest.raises(HcclError, match="returned without calling all_reduce"):
        cluster8.run(lambda comm: None if comm.rank == 2 else comm.all_reduce(np.ones(3)))


@pytest.mark.ray
def test_no_shared_memory_left_after_runs_and_kills(ray_instance):
    topo = hccl_sim.topology("fullmesh", ranks=4)
    with hccl_sim.Cluster(topo, engine="ray") as cluster:
        session = cluster.session
        cluster.run(lambda comm: comm.all_gather(np.ones(100_000)))
        assert shm.leftovers(session)                     # registered buffers persist across runs
    assert shm.leftovers(session) == []

    cluster = hccl_sim.Cluster(topo, engine="ray", env={"HCCL_EXEC_TIMEOUT": "20"})
    session = cluster.session
    victim = cluster.pids[2]

    def fn(comm):
        comm.all_reduce(np.ones(100_000))
        if comm.rank == 2:
            time.sleep(30)                                # killed while the others wait in the next op
        comm.all_reduce(np.ones(100_000))

    seen_waiting = []

    def kill_once_the_others_wait():
        """Kill rank 2 once every other rank's status (what the driver's stall watch reads) says it
        waits in the second AllReduce (collective #1); at the deadline, kill it anyway."""
        deadline = time.monotonic() + 60
        try:
            while time.monotonic() < deadline:
                others = [w for r, w in enumerate(cluster.waiting()) if r != 2]
                if all(w and "(collective #1)" in w for w in others):
                    seen_waiting.append(others)
                    return
                time.sleep(0.02)
        finally:
            os.kill(victim, signal.SIGKILL)
    import threading
    killer = threading.Thread(target=kill_once_the_others_wait, daemon=True)
    killer.start()
    try:
        with pytest.raises(HcclError) as info:
            cluster.run(fn)
        assert info.value.rank == 2 and ("died" in str(info.value) or "failed" in str(info.value))
    finally:
        killer.join(90)
        cluster.close()
    assert seen_waiting, "the other ranks were not seen waiting in the second AllReduce before the kill"
    assert shm.leftovers(session) == []


@pytest.mark.ray
def test_run_with_engine_ray_and_address(ray_instance):
    results = hccl_sim.run(lambda comm: int(comm.all_reduce(np.array([comm.rank]))[0]),
                           topology=hccl_sim.topology("fullmesh", ranks=3), engine="ray")
    assert results == [3, 3, 3]


def split_abort_shrink(comm):
    """Split by parity, collectives on the halves (eager and not), an abort in one half (its
    pending op fails on the others), shrink without the aborted rank, then collectives again."""
    sub = comm.split(comm.rank % 2, key=-comm.rank)
    big = sub.all_reduce(np.full(100_000, comm.rank, dtype=np.int64))
    small = sub.all_gather(np.full(3, comm.rank, dtype=np.int64))
    timing = [sub.last_op.time]
    if comm.rank == 3:
        sub.abort()
        return "aborted"
    try:
        sub.all_reduce(np.ones(4))
        pending = "ok"
    except HcclError as e:
        pending = e.code
    new = sub.shrink(exclude=[sub.world_ranks.index(3)] if comm.rank % 2 else [])
    y = new.all_reduce(np.arange(50_000, dtype=np.int64) * (comm.rank + 1))
    z = new.reduce_scatter(np.arange(4 * new.size, dtype=np.int64) + comm.rank)
    return pending, int(big[0]), small.tolist(), new.world_ranks, int(y[-1]), z.tolist(), timing, new.last_op.time


def world_abort(comm):
    """The world communicator aborted by rank 5: a collective and a send fail on the others
    (told by the control block or by the abort notice), then the survivors shrink and go on."""
    comm.all_reduce(np.ones(10))
    if comm.rank == 5:
        comm.abort()
        return "aborted"
    codes = []
    for op in (lambda: comm.all_reduce(np.ones(100_000)), lambda: comm.send(np.ones(3), dst=(comm.rank + 1) % 8)):
        try:
            op()
            codes.append("ok")
        except HcclError as e:
            codes.append(e.code)
    new = comm.shrink(exclude=[5])
    y = new.all_reduce(np.full(200_000, comm.rank, dtype=np.int64))
    return codes, int(y[0]), new.last_op.time


@pytest.mark.ray
@pytest.mark.parametrize("plane", [None, "socket", "object"])
def test_split_abort_shrink_results_error_codes_and_op_times_equal_on_ray_and_local(ray_instance, plane):
    """Sub-communicators over the job's transport (each rank's scoped view): results, errors and
    simulated times as on the local engine, on every data plane; an aborted world too."""
    topo = hccl_sim.topology("atlas800t-a2")
    with hccl_sim.Cluster(topo, engine="ray", data_plane=plane) as cluster:
        got = cluster.run(split_abort_shrink)
        world = cluster.run(world_abort)
    assert got == hccl_sim.run(split_abort_shrink, topology=topo)
    assert got[3] == "aborted" and got[1][0] == "E_REMOTE" and got[0][0] == "ok"
    assert world == hccl_sim.run(world_abort, topology=topo)
    assert world[5] == "aborted" and world[0][0] == ["E_REMOTE", "E_REMOTE"]


@pytest.mark.ray
@pytest.mark.parametrize("plane", ["object", "socket"])
def test_data_planes_for_ranks_on_other_hosts(ray_instance, plane):
    """The paths ranks that share no memory take (Ray's object store; the control sockets)."""
    topo = hccl_sim.topology("atlas800t-a2")
    with hccl_sim.Cluster(topo, engine="ray", data_plane=plane) as cluster:
        assert cluster.data_plane == plane
        results = cluster.run(all_collectives, args=(40_000, np.float32, "min", "ring", 2))
        check(results, 8, 40_000, np.float32, "min", 2)
        assert cluster.run(timeline, args=(30_000,)) == hccl_sim.run(timeline, topology=topo, args=(30_000,))


@pytest.mark.local
def test_orphaned_segments_of_dead_drivers_are_swept(tmp_path):
    """A driver killed before it could clean up leaves segments; the next cluster removes them."""
    import subprocess
    import sys
    from multiprocessing import shared_memory
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    host = shm.new_session().split("-")[0]
    name = f"{shm.PREFIX}{host}-{proc.pid}-deadbeef_0_input_1"
    seg = shared_memory.SharedMemory(name=name, create=True, size=4096)
    seg.close()
    try:
        shm.sweep_orphans()
        assert os.path.exists(f"/dev/shm/{name}")          # its driver is alive: kept
        proc.kill()
        proc.wait()
        assert shm.sweep_orphans() >= 1 and not os.path.exists(f"/dev/shm/{name}")
    finally:
        proc.kill()
        if os.path.exists(f"/dev/shm/{name}"):
            os.unlink(f"/dev/shm/{name}")


@pytest.mark.ray
def test_deadlock_is_an_error_not_a_hang(cluster8):
    t0 = time.monotonic()
    with pytest.raises(HcclError, match="deadlock: every rank is waiting"):
        cluster8.run(lambda comm: comm.recv((comm.rank + 1) % comm.size))
    assert time.monotonic() - t0 < 30
    assert cluster8.run(lambda comm: float(comm.all_reduce(np.ones(2))[0]))[0] == 8.0


# ---- a fault plan's rank_crash: the actor's process really exits ------------------------------------

def crash_ops(comm, n=3, count=20_000):
    """n AllReduces of int64 data too large to travel with the call (the data planes move it); each
    error recorded with its clock, and apart from it, how this rank's data plane found the dead one;
    then, if a rank was lost, the survivors shrink and AllReduce on the new communicator."""
    out, causes, shrunk = [], [], None
    for _ in range(n):
        try:
            y = comm.all_reduce(np.arange(count, dtype=np.int64) * (comm.rank + 1))
            out.append(("ok", int(y.sum()), comm.last_op.end))
        except HcclError as e:
            out.append((e.code, str(e), comm.clock))
            if e.__cause__ is not None:
                causes.append((e.__cause__.code, e.__cause__.reason))
    if comm.lost_ranks:
        new = comm.shrink()
        y = new.all_reduce(np.arange(count, dtype=np.int64) * (comm.rank + 1))
        shrunk = (new.rank, new.world_ranks, int(y.sum()), new.last_op.end)
    return out, causes, shrunk


def check_crash_runs(cluster, plan, dead):
    """The crash run equals the local engine's (the dead rank's entry None, every survivor's planned
    E_TIMEOUT at the same simulated clock), each survivor woken by the real death (the cause of its
    error names the dead rank, found by its data plane), the dead actor's segments gone, and the
    cluster usable: a run that stops before the crash, and one that lets the error escape. The
    survivors shrink and go on as on the local engine."""
    topo = cluster.topology
    session = cluster.session
    old_pid = cluster.pids[dead]
    t0 = time.monotonic()
    got = cluster.run(crash_ops)
    assert time.monotonic() - t0 < 60
    want = hccl_sim.run(crash_ops, topology=topo, faults=plan)
    assert got[dead] is None and want[dead] is None
    assert [g and (g[0], g[2]) for g in got] == [w and (w[0], w[2]) for w in want]
    assert all(g[2][1] == tuple(r for r in range(topo.num_ranks) if r != dead) for g in got if g)
    for r, g in enumerate(got):
        if r == dead:
            continue
        assert g[0][1][0] == "E_TIMEOUT" and f"Cluster Exception Location[rank {dead}]" in g[0][1][1]
        (code, reason), = g[1]                       # only the crashing op ran; later ones fail at once
        assert f"rank {dead}" in reason and code in ("E_REMOTE", "E_PARA"), (r, code, reason)
    assert cluster.pids[dead] != old_pid           # replaced by a fresh actor
    assert not [n for n in shm.leftovers(session) if f"_{dead}_" in os.path.basename(n)]
    one = cluster.run(crash_ops, args=(1,))             # the crash is at op 1: this run stops before it
    assert one == hccl_sim.run(crash_ops, topology=topo, args=(1,)) and one[dead][0][0][0] == "ok"
    for count in (300_000, 20_000):                     # the fresh actor's segments are its own (chaos
        big = cluster.run(crash_ops, args=(1, count))   # seed 7: peers' stale mappings of reused names)
        assert big == hccl_sim.run(crash_ops, topology=topo, args=(1, count))

    def escaping(comm):
        for _ in range(2):
            comm.all_reduce(np.ones(20_000, dtype=np.int64))
    with pytest.raises(HcclError, match=rf"Cluster Exception Location\[rank {dead}\]") as info:
        cluster.run(escaping)
    assert info.value.code == "E_TIMEOUT" and info.value.rank != dead
    return session


@pytest.mark.ray
@pytest.mark.parametrize("preset, plan, dead", [
    (("fullmesh", {"ranks": 4}), hccl_sim.FaultPlan().rank_crash(3, at_op=1), 3),
    (("atlas800t-a2", {}), hccl_sim.FaultPlan().rank_crash(0, at_op=1, at_step=2), 0)], ids=["on-entry", "mid-op"])
def test_rank_crash_on_one_node(ray_instance, preset, plan, dead):
    """Shared-memory planes: the dead rank's process exits on entering the op, or mid-op having done
    its share of the data program's first steps (rank 0, which created the control block: its
    successor takes the block over); survivors waiting for it are woken by the control block, which
    sees its process gone."""
    topo = hccl_sim.topology(preset[0], **preset[1])
    before = set(os.listdir("/dev/shm"))
    with hccl_sim.Cluster(topo, engine="ray", faults=plan) as cluster:
        assert cluster.data_plane == "shm"
        session = check_crash_runs(cluster, plan, dead)
    assert shm.leftovers(session) == [] and not [n for n in set(os.listdir("/dev/shm")) - before if session in n]


@pytest.mark.ray
@pytest.mark.parametrize("plane, plan, dead", [
    ("socket", hccl_sim.FaultPlan().rank_crash(2, at_op=1, at_step=1), 2),
    ("socket", hccl_sim.FaultPlan().rank_crash(1, at_op=1), 1),
    ("object", hccl_sim.FaultPlan().rank_crash(3, at_op=1, at_step=2), 3)], ids=["socket-mid-op", "socket-on-entry",
                                                                                  "object-mid-op"])
def test_rank_crash_across_two_ray_nodes(ray_instance, plane, plan, dead):
    """Two servers on two Ray nodes, every rank running its own schedule: the dead rank sends the
    first steps of its schedule (or nothing) and exits; every survivor, whichever peer it waits for,
    is woken by the dead one's closed connections (socket) or its actor's death (object)."""
    import topologies
    topo = topologies.hardware("atlas800t-a2", devices_per_server=[2, 2])
    with hccl_sim.Cluster(topo, engine="ray", faults=plan, data_plane=plane) as cluster:
        assert cluster.data_plane == plane and len(set(cluster.nodes)) == 2
        session = check_crash_runs(cluster, plan, dead)
    assert shm.leftovers(session) == []


def dies_unplanned(comm, who):
    """Rank `who` dies in the user's code, not by the fault plan: its process exits as the others
    enter an op."""
    if comm.rank == who:
        os._exit(3)
    comm.all_reduce(np.ones(20_000, dtype=np.int64))


@pytest.mark.ray
def test_a_planned_crash_prints_nothing_from_ray_an_unplanned_death_still_does(ray_instance, capfd):
    """The fault plan's crash is said once, as the plan's entry: Ray prints nothing of its own
    about that process ("A worker died or was killed ... SYSTEM_ERROR ... OOM killer"). A death
    the plan did not ask for is still the run's error (RANK_DIED), and Ray's line about it still
    shows. Ray's driver prints such a line from a thread of its own, when the raylet's notice
    comes: the test waits for the unplanned death's line, whose notice follows the crash's by a
    run (the conftest turns Ray's deduplication off, so neither line is held back)."""
    from topologies.errors import Cause
    topo = hccl_sim.topology("fullmesh", ranks=4)
    with hccl_sim.Cluster(topo, engine="ray") as cluster:
        crashed = cluster.pids[2]
        got = cluster.run(crash_ops, args=(2,), faults=hccl_sim.FaultPlan().rank_crash(2, at_op=1))
        assert got[2] is None and got[0][0][1][0] == "E_TIMEOUT" and cluster.pids[2] != crashed
        died = cluster.pids[1]
        with pytest.raises(HcclError) as info:
            cluster.run(dies_unplanned, args=(1,))
        assert info.value.rank == 1 and info.value.cause == Cause.RANK_DIED
        seen, deadline = "", time.monotonic() + 60
        while f"Worker PID: {died} " not in seen and time.monotonic() < deadline:
            time.sleep(0.1)
            seen += "".join(capfd.readouterr())
    assert f"Worker PID: {died} " in seen, f"no line from Ray about the unplanned death within 60 s: {seen[-2000:]}"
    noise = [line for line in seen.splitlines() if re.search(r"worker died|SYSTEM_ERROR|OOM", line, re.I)]
    assert not [line for line in noise if f"Worker PID: {crashed} " in line], noise


@pytest.mark.ray
def test_result_pool_stays_bounded_over_many_shapes(cluster8):
    """(Found by `hccl-sim chaos --engine ray`.) Ops of ever new shapes on the shared-memory plane:
    each rank keeps at most RESULT_POOL_SPARE free result segments, the least recently used
    unlinked, instead of one per shape for the cluster's life."""
    from hcomm.memory.segment_provider import RESULT_POOL_SPARE
    stem = f"{shm.PREFIX}{cluster8.session}_0_result_"

    def fn(comm, n):
        comm.all_reduce(np.ones(n, np.int32))
    for k in range(3 * RESULT_POOL_SPARE):
        cluster8.run(fn, args=(20_000 + 16 * k,))             # 80 KB and up: past the inline size
    kept = [n for n in os.listdir("/dev/shm") if n.startswith(stem)]
    assert 1 <= len(kept) <= RESULT_POOL_SPARE + 1, kept


@pytest.mark.ray
def test_chaos_campaign_outcomes_retries_lost_time_and_rank_records_equal_on_ray_and_local(ray_instance):
    """Ten seeded chaos scenarios on one set of actors (two 4-NPU servers on the two Ray nodes),
    each run with its own plan and environment: no WRONG, HANG or LEAK, and every scenario's
    outcome, retries, simulated time lost and every rank's records equal to the local engine's."""
    import topologies
    from hccl_sim.chaos import run_campaign, run_scenario
    from hccl_sim.chaos.runners import LocalRunner
    from hccl_sim.chaos.report import failed
    topo = topologies.hardware("atlas800t-a2", devices_per_server=[4, 4])
    space, results, left = run_campaign(3, 10, topo, engine="ray")
    assert not failed(results, left), ([(sc, r.outcome, r.verdict.detail) for sc, r in results
                                        if r.outcome not in ("recovered", "clean error")], left)
    local = LocalRunner(topo)
    for sc, got in results:
        want = run_scenario(sc, local)
        assert (got.outcome, got.verdict.retries, got.verdict.lost_s) == (want.outcome, want.verdict.retries,
                                                                          want.verdict.lost_s), sc.index
        assert got.faulty == want.faulty and got.twin == want.twin


def _cpus(comm):
    return sorted(os.sched_getaffinity(0))


@pytest.mark.ray
def test_a_nodes_ranks_are_bound_round_robin_to_its_cpus_when_they_outnumber_them(cluster8, monkeypatch):
    """8 ranks on one node: where they outnumber the machine's CPUs, rank i's thread runs on CPU
    i mod n alone (engines/binding.py); with fewer ranks than CPUs, and under HCCL_SIM_BIND=none,
    on every CPU; another HCCL_SIM_BIND is refused."""
    cpus = sorted(os.sched_getaffinity(0))
    got = cluster8.run(_cpus)
    if len(cpus) < 8:
        assert got == [[cpus[i % len(cpus)]] for i in range(8)]
    else:
        assert got == [cpus] * 8
    monkeypatch.setenv("HCCL_SIM_BIND", "none")
    assert cluster8.run(_cpus) == [cpus] * 8          # a run after a bound one unbinds
    monkeypatch.setenv("HCCL_SIM_BIND", "socket")
    with pytest.raises(HcclError, match="HCCL_SIM_BIND='socket' is invalid; expected core or none"):
        cluster8.run(_cpus)
