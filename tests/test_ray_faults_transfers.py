"""Corrupted transfers and point-to-point faults on the Ray engine: every rank plans for itself, its
sends on a counted pair travel in its rendezvous payload, and the receiver's error reaches the
sender in its acknowledgement; outcomes and simulated times equal the local engine's. So do a slow
peer's, a stalled rank's and an HBM pressure's (whose starved link setup a rank's payload tells)."""
import numpy as np
import pytest

import hccl_sim
from hccl_sim import HcclError

pytestmark = [pytest.mark.ray, pytest.mark.timeout(300)]
DELTA = round(4.096e-6 * 2 ** 5 * 1e9)
FAST = {"HCCL_RDMA_TIMEOUT": "5", "HCCL_RDMA_RETRY_CNT": "1"}
# two 4-NPU servers (half the actors of two full servers): rank r's peer across is r + 4


def _job(comm):
    """A send 2 -> 6 while rank 6's NIC is down (both ends fail), a send 1 -> 5 (the pair's
    transfer 0), two AllReduces (the pair's level-1 transfers after it), another send 1 -> 5."""
    out = []

    def p2p(src, dst, n):
        try:
            if comm.rank == src:
                comm.send(np.arange(n, dtype=np.int64), dst=dst)
            elif comm.rank == dst:
                out.append(int(comm.recv(src).sum()))
            else:
                return
            out.append(("p2p", comm.last_op.start, comm.last_op.end))
        except HcclError as e:
            out.append((e.code, str(e), comm.clock))
    p2p(2, 6, 1000)
    comm.barrier()                 # the late ranks 2 and 6 caught up: what follows starts alike in every run
    p2p(1, 5, 5000)
    for _ in range(2):
        y = comm.all_reduce((np.arange(40_000, dtype=np.int64) * (comm.rank + 1)) % 997)
        out.append((int(y.sum()), comm.last_op.start, comm.last_op.end, comm.last_op.retries))
    p2p(1, 5, 5000)
    return out


def _pair_transfers(topo, sig, itemsize):
    from hccl_sim.config.env import Config
    from hccl_sim.plan.planner import make_plan, op_transfers
    plan = make_plan(sig, topo, Config(), [0] * topo.num_ranks, itemsize)
    return op_transfers(sig, plan.loops, plan.programs, topo.num_ranks, [(1, 5)])[(1, 5)]


def test_corrupt_and_p2p_faults_results_errors_and_op_clocks_equal_on_ray_and_local(ray_cluster):
    """Pair 1 -> 5: the barrier's transfers come first (b of them), then the send, each AllReduce's
    two (level-1 ring), the last send; corrupting the send, the second op's first and the last
    send costs each one interval. Rank 6's NIC is down for both of the send 2 -> 6's attempts,
    and back before anything else."""
    from hccl_sim.plan.planner import Signature
    import topologies
    topo = topologies.hardware("atlas800t-a2", devices_per_server=[4, 4])
    b = _pair_transfers(topo, Signature("barrier", (), "uint8", None, None, None), 1)
    assert _pair_transfers(topo, Signature("allreduce", (40_000,), "int64", "sum", None, None), 8) == 2
    plan = (hccl_sim.FaultPlan().nic_down(6, at=0.0, duration=2 * DELTA / 1e9)
            .corrupt(1, 5, nth=b).corrupt(1, 5, nth=b + 3).corrupt(1, 5, nth=b + 5))
    local = hccl_sim.run(_job, topology=topo, faults=plan, env=FAST)
    clean = hccl_sim.run(_job, topology=topo, env=FAST)
    assert local[2][0][0] == local[6][0][0] == "E_REMOTE" and "no op retry for send/recv" in local[6][0][1]
    took = [[e[2] - e[1] for e in out if e[0] == "p2p" or isinstance(e[0], int) and len(e) == 4]
            for out in (local[1], clean[1])]
    assert [a - b for a, b in zip(*took)] == [DELTA, 0, DELTA, DELTA]
    with hccl_sim.Cluster(topo, engine="ray", faults=plan, env=FAST) as cluster:
        assert cluster.data_plane == "socket"
        assert cluster.run(_job) == local


def test_a_slow_peer_past_hccl_exec_timeout_fails_alike_on_ray_and_local(ray_cluster):
    """A straggler entering 12 s late under HCCL_EXEC_TIMEOUT=10: every rank's E_TIMEOUT, its time
    and fields, and every clock, as on the local engine (the Ray ranks plan from cached relative
    clocks: the timeout is found at the real ones)."""
    from test_faults import _slow_peer
    import topologies
    topo = topologies.hardware("atlas800t-a2", devices_per_server=[4, 4])
    plan = hccl_sim.FaultPlan().straggler(6, 12.0, ops=[1])
    env = {"HCCL_EXEC_TIMEOUT": "10"}
    local = hccl_sim.run(_slow_peer, topology=topo, env=env, faults=plan)
    assert local[0][0] == "E_TIMEOUT" and local[0][2] == (6,)
    assert hccl_sim.run(_slow_peer, topology=topo, env=env, faults=plan, engine="ray") == local


def test_a_stalled_rank_is_found_alike_on_ray_and_local_and_its_actor_lives_on(ray_cluster):
    """A rank the plan stalls before op 1: its peers' E_TIMEOUT and clocks as on the local engine;
    its result None, and its actor (alive: a stall is no crash) runs the cluster's next run."""
    from test_faults import _stalled_peer
    import topologies
    topo = topologies.hardware("atlas800t-a2", devices_per_server=[4, 4])
    plan = hccl_sim.FaultPlan().rank_stall(6, at_op=1)
    env = {"HCCL_EXEC_TIMEOUT": "10"}
    local = hccl_sim.run(_stalled_peer, topology=topo, env=env, faults=plan)
    with hccl_sim.Cluster(topo, engine="ray") as cluster:
        pids = cluster.pids
        assert cluster.run(_stalled_peer, env=env, faults=plan) == local and local[6] is None
        assert cluster.run(lambda comm: comm.rank) == list(range(8)) and cluster.pids == pids


def test_an_hbm_pressure_fails_alike_on_ray_and_local(ray_cluster):
    """Rank 6's free HBM held from op 0 for 10 us: its first AllReduce's link setup fails (E_MEMORY at
    once, its peers' E_TIMEOUT 140 s later); its second, entered after the tenant left, sets up. From
    op 3 on rank 3's is held: the split's new CCL buffer fails there (E_MEMORY; the odd ranks' init
    times out), the even ranks' split goes on; an AllGather then fails its link setup (E_MEMORY on 3,
    E_TIMEOUT on the others). Every error, its fields and every clock as on the local engine."""
    from test_faults_hbm import split_between
    import topologies
    topo = topologies.hardware("atlas800t-a2", devices_per_server=[4, 4])

    def job(comm):
        return split_between(comm, ("allreduce", "allreduce", "empty"), ("allgather",))
    plan = hccl_sim.FaultPlan().hbm_pressure(6, at=0.0, duration=1e-5).hbm_pressure(3, at_op=3)
    local = hccl_sim.run(job, topology=topo, faults=plan)
    assert local[6][0][0] == "E_MEMORY" and local[0][0][:3] == ("E_TIMEOUT", "TIMEOUT", (6,))
    assert [out[1][0] for out in local] == ["ok"] * 8
    assert local[3][3][0] == "E_MEMORY" and [local[r][3][0] for r in (1, 5, 7)] == ["E_TIMEOUT"] * 3
    assert [local[r][3][0] for r in (0, 2, 4, 6)] == ["split"] * 4
    assert local[3][4][0] == "E_MEMORY" and local[0][4][2] == (3,)
    with hccl_sim.Cluster(topo, engine="ray") as cluster:
        assert cluster.run(job, faults=plan) == local
