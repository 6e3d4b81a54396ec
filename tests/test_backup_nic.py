"""A3's backup NIC (docs/references.md §10.5): an L2 op retry that meets a die's NIC down for good
borrows its package partner's NIC (both directions, over SIO, half bandwidth for both dies), once
per NPU; elsewhere the error stands and says why. The borrowed routes priced alike by the
vectorised and the event-driven timing engines."""
import numpy as np
import pytest

import hccl_sim
from hccl_sim import FaultPlan, HcclError, collectives
from hccl_sim.algorithms.common import side_by_side
from hccl_sim.config.env import Config
from hccl_sim.plan.planner import Signature, choose
from hccl_sim.plan.loop_programs import build_parts
from hcomm.vtiming import program_times
from topologies.presets import with_backup_nics

from test_schedules import des_times

FAST = {"HCCL_RDMA_TIMEOUT": "5", "HCCL_RDMA_RETRY_CNT": "1"}
RETRY = {**FAST, "HCCL_OP_RETRY_ENABLE": "L2:1", "HCCL_OP_RETRY_PARAMS": "MaxCnt:1,HoldTime:1,IntervalTime:0"}
PAIRS = {3: 19, 2: 18, 5: 21}       # die 3 of superpod 0 (its partner: die 2) and die 5, each to its twin in superpod 1


def a3():
    return hccl_sim.topology("atlas900-a3", superpods=2, servers=1)     # 32 dies: 16 per superpod


@pytest.mark.unit
def test_borrowed_routes_cross_sio_to_the_partner_nic_at_half_bandwidth():
    topo = a3()
    borrowed = with_backup_nics(topo, [3])
    r = borrowed.route(3, 19)
    assert r.hops == (3, 2, "roce", 19) and r.kinds == ("SIO", "RoCE", "RoCE")
    assert r.bandwidth == topo.route(3, 19).bandwidth / 2 and r.latency_ns == topo.route(3, 19).latency_ns + topo.route(3, 2).latency_ns
    assert borrowed.route(19, 3).hops == (19, "roce", 2, 3)                  # its peers send to the backup NIC
    assert borrowed.route(2, 18).bandwidth == topo.route(2, 18).bandwidth / 2 and borrowed.route(2, 18).hops == (2, "roce", 18)   # shared
    assert borrowed.route(5, 21) == topo.route(5, 21) and borrowed.route(3, 4) == topo.route(3, 4)
    assert with_backup_nics(topo, [3]) is borrowed and with_backup_nics(topo, []) is topo
    with pytest.raises(HcclError, match="a backup NIC is an A3 SuperPoD") as e:
        with_backup_nics(hccl_sim.topology("atlas800t-a2", servers=2), [3])
    assert e.value.code == "E_NOT_SUPPORT"


@pytest.mark.unit
@pytest.mark.parametrize("servers", [1, [2, 1]], ids=str)
def test_vectorised_timing_equals_the_event_driven_reference_on_borrowed_routes(servers):
    topo = with_backup_nics(hccl_sim.topology("atlas900-a3", superpods=2, servers=servers), (3, 16, 21))
    p = topo.num_ranks
    rng = np.random.default_rng(p)
    for coll in collectives.DATA_COLLECTIVES:
        for algo in (None, "level0:NA;level1:ring;level2:ring"):
            sig = Signature(coll, (p * 40,), "float32", "sum" if coll in ("allreduce", "reducescatter", "reduce")
                            else None, 5 if coll in ("broadcast", "reduce") else None, algo)
            choice = choose(sig, topo, Config(), 4)
            length = 40 if coll in collectives.BLOCK else 40 * p
            program = side_by_side(*[prog for _, _, prog in build_parts(coll, choice, topo, length, 4, sig.root)])
            for entry in (np.zeros(p, dtype=np.int64), rng.integers(0, 50_000, p)):
                want = des_times(program, entry, topo, sig.dtype, sig.redop or "sum")
                assert list(program_times(program, entry, topo, sig.dtype, sig.redop or "sum")) == list(want), coll


@pytest.mark.unit
def test_l2_retry_switches_to_the_backup_nic_and_succeeds():
    """The retry runs on the borrowed routes: its time is that of the op on them from where the
    retry resumes (the trace's wait), and slower than the op on healthy NICs."""
    topo = a3()
    clean = hccl_sim.simulate("allreduce", 1 << 24, topology=topo)
    est, plan = hccl_sim.simulate("allreduce", 1 << 24, topology=topo, faults=FaultPlan().nic_down(3), env=RETRY,
                                  trace=True)
    assert est.retries == 1 and len(est.notes) == 1
    assert "rank 3's NIC is down for good" in est.notes[0] and "through rank 2's NIC over SIO" in est.notes[0]
    assert "half bandwidth" in est.notes[0]
    resume = max(e[3] for e in plan.events if e[1] == "op retry 1: wait")
    on_backup = hccl_sim.simulate("allreduce", 1 << 24, topology=with_backup_nics(topo, [3]))
    assert round(est.time * 1e9) == resume + round(on_backup.time * 1e9)
    assert on_backup.time > clean.time


@pytest.mark.local
def test_backup_nic_on_the_local_engine_result_time_and_later_ops():
    """Integer data bit-identical; the switching op's times equal simulate's; later ops and sends
    run on the borrowed routes without retry: a 1 MiB send from die 3 (borrower) or die 2 (lender)
    pays the halved NIC (1 MiB at half the NIC's rate instead of all of it), die 3 the SIO hop too."""
    topo = a3()
    n = 1 << 16

    def fn(comm):
        x = (np.arange(n, dtype=np.int64) * (comm.rank + 1)) % 1013
        y = comm.all_reduce(x)
        first = comm.last_op
        comm.barrier()                      # every rank leaves together: the next op starts aligned
        comm.all_reduce(x)
        second = comm.last_op
        comm.barrier()
        took = None
        if comm.rank in PAIRS:
            comm.send(np.zeros(1 << 20, np.uint8), dst=PAIRS[comm.rank])
            took = comm.last_op.end - comm.last_op.start
        elif comm.rank - 16 in PAIRS:
            comm.recv(comm.rank - 16)
        return y, first, second, took
    got = hccl_sim.run(fn, topology=topo, faults=FaultPlan().nic_down(3), env=RETRY)
    want = sum((np.arange(n, dtype=np.int64) * (r + 1)) % 1013 for r in range(32))
    est = hccl_sim.simulate("allreduce", n * 8, topology=topo, dtype="int64", faults=FaultPlan().nic_down(3), env=RETRY)
    later = hccl_sim.simulate("allreduce", n * 8, topology=with_backup_nics(topo, [3]), dtype="int64")
    for r, (y, first, second, _) in enumerate(got):
        assert np.array_equal(y, want)
        assert first.retries == 1 and "backup NIC" in first.notes[0] and second.retries == 0 and not second.notes
        assert first.end - first.start == round(est.times[r] * 1e9)
        assert second.end - second.start == round(later.times[r] * 1e9)
    sio = topo.route(3, 2).latency_ns
    from topologies.model import transfer_ns
    nic = topo.route(3, 19).bandwidth
    halved = transfer_ns(1 << 20, nic / 2) - transfer_ns(1 << 20, nic)
    assert got[2][3] - got[5][3] == halved and got[3][3] - got[5][3] == halved + sio


@pytest.mark.local
def test_no_backup_a_second_time_on_the_same_npu_or_when_the_partner_nic_is_down():
    topo = a3()
    env = {**RETRY, "HCCL_OP_RETRY_PARAMS": "MaxCnt:2,HoldTime:1,IntervalTime:0"}
    with pytest.raises(HcclError, match=r"retries exhausted: 2 of MaxCnt=2 .*; no backup NIC: the partner die's NIC "
                       r"\(rank 2's\) is down too") as e:
        hccl_sim.simulate("allreduce", 1 << 20, topology=topo, faults=FaultPlan().nic_down(3).nic_down(2), env=env)
    assert e.value.code == "E_OPRETRY_FAIL"

    def fn(comm):
        out = []
        for _ in range(2):
            try:
                comm.all_reduce(np.ones(1 << 16, np.int64))
                out.append(comm.last_op.retries)
            except HcclError as err:
                out.append((err.code, str(err)))
        return out
    first_end = hccl_sim.run(lambda c: (c.all_reduce(np.ones(1 << 16, np.int64)), c.last_op.end)[1], topology=topo,
                             faults=FaultPlan().nic_down(3), env=env)
    later = FaultPlan().nic_down(3).nic_down(2, at=(max(first_end) + 1) / 1e9)   # the lender's NIC, after the switch
    got = hccl_sim.run(fn, topology=topo, faults=later, env=env)
    for out in got:
        assert out[0] == 1 and out[1][0] == "E_OPRETRY_FAIL"
        assert "(nic_down rank 2)" in out[1][1] and ("no backup NIC: the NPU of ranks 2 and 3 already switched to a "
                                                     "backup NIC (HCCL switches once per NPU, no switch back)") in out[1][1]


@pytest.mark.unit
def test_no_backup_nic_on_910b_or_without_l2_retry_or_for_a_flap():
    a2 = hccl_sim.topology("atlas800t-a2", servers=2)
    with pytest.raises(HcclError, match=r"retries exhausted.*no backup NIC: on 910B a NIC has no backup \(HCCL borrows "
                       r"the other die's NIC of a 910C package, A3 only\)") as e:
        hccl_sim.simulate("allreduce", 1 << 20, topology=a2, faults=FaultPlan().nic_down(9),
                          env={**RETRY, "HCCL_OP_RETRY_ENABLE": "L1:1"})
    assert e.value.code == "E_OPRETRY_FAIL"
    with pytest.raises(HcclError, match=r"op retry is off for L2 \(HCCL_OP_RETRY_ENABLE\); no backup NIC: the backup "
                       r"NIC \(rank 2's\) is borrowed only by an op retry") as e:
        hccl_sim.simulate("allreduce", 1 << 20, topology=a3(), faults=FaultPlan().nic_down(3), env=FAST)
    assert e.value.code == "E_REMOTE"
    # a NIC that comes back is waited for, not borrowed around
    flap = hccl_sim.simulate("allreduce", 1 << 20, topology=a3(), faults=FaultPlan().nic_down(3, duration=1e-3),
                             env=RETRY)
    assert flap.retries == 1 and flap.notes == ()


@pytest.mark.local
def test_a_sub_communicator_borrows_through_the_cluster_and_skips_corrupt_entries():
    """The odd dies' communicator (die 2, die 3's partner, is not a member): its init's retry
    switches die 3 to rank 2's NIC (each communicator's links switch on their own), and its
    AllReduce then runs on the borrowed routes, right and without a retry. Corrupt entries count
    the world communicator's transfers: a sub-communicator's plan has none."""
    topo = a3()

    def fn(comm):
        sub = comm.split(comm.rank % 2)
        y = sub.all_reduce(np.full(1 << 14, comm.rank, np.int64))
        return int(y[0]), sub.last_op.retries, sub.config.faults.corrupt
    got = hccl_sim.run(fn, topology=topo, faults=FaultPlan().nic_down(3).corrupt(1, 3, nth=5), env=RETRY)
    assert got == [(sum(range(r % 2, 32, 2)), 0, ()) for r in range(32)]
