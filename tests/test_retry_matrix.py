"""Op retry across every collective and algorithm family: under a fault that outlasts the RDMA
retransmission budget, each op either recovers (retried from its input: every rank's result is
the fault-free one bit for bit) or is refused because a rank had already left it, and either
way the local engine and payload-free simulate agree on the outcome and the simulated times."""
import numpy as np
import pytest

import hccl_sim
from hccl_sim import FaultPlan, HcclError
from hccl_sim.config.hccl_algo import ALGO_TOKENS
from hccl_sim.algorithms import registry

pytestmark = pytest.mark.local

RETRY = {"HCCL_RDMA_TIMEOUT": "5", "HCCL_RDMA_RETRY_CNT": "1", "HCCL_OP_RETRY_ENABLE": "L0:1,L1:1,L2:1",
         "HCCL_OP_RETRY_PARAMS": "MaxCnt:2,HoldTime:25,IntervalTime:5"}
COUNT = 3 * 5 * 8 * 4          # elements per rank: divisible by every rank count used here
OPS = ("allreduce", "allgather", "reducescatter", "broadcast", "reduce", "alltoall")


def _input(op, rank, p, count):
    x = (np.arange(count, dtype=np.int64) * (rank + 3) + 7 * rank) % 1013
    return x[:count // p] if op == "allgather" else x


def _root(op, p):
    return 0 if op == "broadcast" else p - 1        # broadcast from rank 0, whose links fail


def _call(comm, op, algo, count):
    x = _input(op, comm.rank, comm.size, count)
    root = {"root": _root(op, comm.size)} if op in ("broadcast", "reduce") else {}
    method = hccl_sim.collectives.of(op).method
    try:
        y = getattr(comm, method)(x, algo=algo, **root)
    except HcclError as e:
        return ("error", e.code, e.reason), comm.clock
    rec = comm.last_op
    return ("ok", None if y is None else y.tobytes(), rec.retries), rec.end


def _check(topo, plan, op, algo, count=COUNT):
    clean = hccl_sim.run(_call, topology=topo, args=(op, algo, count), env=RETRY)
    got = hccl_sim.run(_call, topology=topo, args=(op, algo, count), faults=plan, env=RETRY)
    est = None
    try:
        itemsize = 8
        nbytes = hccl_sim.collectives.of(op).op_bytes(count // topo.num_ranks if op == "allgather" else count,
                                                     topo.num_ranks, itemsize)
        est = hccl_sim.simulate(op, nbytes, topology=topo, algo=algo, dtype="int64", faults=plan, env=RETRY,
                                root=_root(op, topo.num_ranks))
    except HcclError as e:
        est = e
    if got[0][0][0] == "ok":
        for (g, _), (c, _) in zip(got, clean):
            assert g[0] == "ok" and g[1] == c[1], "a recovered result must be the fault-free one"
            assert g[2] >= 1
        assert not isinstance(est, HcclError) and est.retries == got[0][0][2]
        assert [end for _, end in got] == [round(t * 1e9) for t in est.times]
        return "recovered"
    for g, _ in got:
        assert g[0] == "error" and g[1] == "E_OPRETRY_FAIL" and "had already left the op" in g[2], g
    assert isinstance(est, HcclError) and est.code == "E_OPRETRY_FAIL" and est.reason == got[0][0][2]
    return "refused"


def _cases(level):
    """Every (collective, algorithm) the registry runs at `level`; at level1 those HCCL_ALGO names."""
    return [(op, algo) for op in OPS for algo in registry.supporting(op, level)
            if level == "flat" or algo in ALGO_TOKENS]


def _rank0_links_down(p, until=0.02):
    plan = FaultPlan(seed=1)
    for peer in range(1, p):
        plan.link_flap(0, peer, at=0.0, duration=until)
    return plan


@pytest.mark.parametrize("op,algo", _cases("flat"))
def test_flat_algorithms_retry_or_refuse(op, algo):
    topo = hccl_sim.topology("fullmesh", ranks=5, bandwidth=1e9, latency=1e-6)
    outcome = _check(topo, _rank0_links_down(5), op, algo)
    if op != "reduce":       # every rank needs rank 0's data, so no rank can have left: all retried
        assert outcome == "recovered"


@pytest.mark.parametrize("op,algo", _cases("level1"))
def test_910b_hierarchy_retries_when_a_nic_flaps(op, algo):
    topo = hccl_sim.topology("atlas800t-a2", servers=3)
    plan = FaultPlan().nic_down(0, at=0.0, duration=0.02)
    token = algo if algo == "pipeline" else f"level0:fullmesh;level1:{algo}"
    assert _check(topo, plan, op, token) in ("recovered", "refused")


@pytest.mark.parametrize("op", ("allreduce", "allgather", "reducescatter", "broadcast"))
def test_a3_double_ring_and_level2_retry(op):
    """Past AllReduceComm's small-data flat NHR (16 KiB x 16 dies across superpods): the three levels."""
    topo = hccl_sim.topology("atlas900-a3", servers=1, superpods=2)
    plan = FaultPlan().nic_down(3, at=0.0, duration=0.02)
    assert _check(topo, plan, op, None, count=32 * 1040) == "recovered"
